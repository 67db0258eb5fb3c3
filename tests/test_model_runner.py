"""The paged numpy runner against the dense float64 reference, in every way the engine
feeds it: whole prefill, chunked prefill, prefill of a suffix over a cached prefix,
batched decode, and mixed batches; plus the checks on a malformed batch."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model import runner as runner_module
from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import random_weights
from ferrolm.model.reference import reference_logits
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from ferrolm.model.weights import Weights
from small_models import SMALL_MODEL_OVERRIDES, small_config

NUM_SLOTS = 256


class Model:
    """A small random model, its runner, and a shuffled supply of free slots."""

    def __init__(self, variant: str, seed: int = 0) -> None:
        self.config: ModelConfig = small_config(variant)
        self.weights: Weights = random_weights(self.config, seed=seed)
        self.runner = NumpyRunner(self.config, self.weights, NUM_SLOTS)
        # a slot never written must never be read: NaN would poison the logits
        for pool in (*self.runner.k_pool, *self.runner.v_pool):
            pool.fill(np.nan)
        self.rng = np.random.default_rng(seed + 1)
        # slots in a random order, so a request's slots are scattered over the pool
        self.free = list(self.rng.permutation(NUM_SLOTS))

    def take_slots(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return [int(s) for s in taken]

    def tokens(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(0, self.config.vocab_size, n)]

    def reference(self, ids: list[int]) -> np.ndarray:
        return reference_logits(self.config, self.weights, ids)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape
    # float32 against float64: errors of a few ulps of the largest logit, times depth
    tolerance = 2e-5 * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance)


def assert_same_up_to_summation_order(actual: np.ndarray, expected: np.ndarray) -> None:
    """Two float32 results of one computation whose sums may run in another order: a few
    ulps of the largest value apart, never more."""
    assert actual.dtype == expected.dtype == np.float32
    assert actual.shape == expected.shape
    tolerance = 1e-5 * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance)


@pytest.fixture(params=sorted(SMALL_MODEL_OVERRIDES))
def model(request: pytest.FixtureRequest) -> Model:
    return Model(request.param)


def test_whole_prompt_prefill_matches_reference(model: Model) -> None:
    ids = model.tokens(24)
    slots = model.take_slots(24)
    batch = ForwardBatch.from_requests([ids], [slots])
    every = model.runner.forward(batch, all_logits=True)
    assert_close(every, model.reference(ids))


def test_prefill_longer_than_a_query_block_matches_reference(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "_QUERY_BLOCK", 4)
    ids = model.tokens(18)
    prefix_slots, slots = model.take_slots(5), model.take_slots(13)
    model.runner.forward(ForwardBatch.from_requests([ids[:5]], [prefix_slots]))
    batch = ForwardBatch.from_requests([ids[5:]], [prefix_slots + slots])
    assert_close(model.runner.forward(batch, all_logits=True), model.reference(ids)[5:])


def test_last_token_logits_are_the_last_row_of_all_logits(model: Model) -> None:
    ids_a, ids_b = model.tokens(9), model.tokens(4)
    slots_a, slots_b = model.take_slots(9), model.take_slots(4)
    batch = ForwardBatch.from_requests([ids_a, ids_b], [slots_a, slots_b])
    every = model.runner.forward(batch, all_logits=True)
    last = model.runner.forward(batch)
    assert last.shape == (2, model.config.vocab_size)
    # the same values, but from matmuls of other shapes: BLAS may pick another kernel
    # (OpenBLAS's SkylakeX kernels do), so another order of summation
    assert_same_up_to_summation_order(last, every[[8, 12]])


def test_chunked_prefill_across_calls_matches_reference(model: Model) -> None:
    ids = model.tokens(30)
    slots = model.take_slots(30)
    expected = model.reference(ids)
    start = 0
    for chunk in (7, 1, 13, 9):
        end = start + chunk
        # each call writes this chunk's KV and attends to everything before it
        batch = ForwardBatch.from_requests([ids[start:end]], [slots[:end]])
        assert_close(model.runner.forward(batch, all_logits=True), expected[start:end])
        start = end


def test_suffix_prefill_over_a_shared_cached_prefix(model: Model) -> None:
    prefix, first_tail = model.tokens(11), model.tokens(5)
    prefix_slots, first_tail_slots = model.take_slots(11), model.take_slots(5)
    model.runner.forward(ForwardBatch.from_requests([prefix + first_tail], [prefix_slots + first_tail_slots]))

    # two later requests reuse the cached prefix's slots and prefill only their suffix,
    # in one batch; the first request's cached tail must not leak into them
    tail_a, tail_b = model.tokens(6), model.tokens(1)
    slots_a, slots_b = model.take_slots(6), model.take_slots(1)
    batch = ForwardBatch.from_requests([tail_a, tail_b], [prefix_slots + slots_a, prefix_slots + slots_b])
    logits = model.runner.forward(batch, all_logits=True)
    assert_close(logits[:6], model.reference(prefix + tail_a)[11:])
    assert_close(logits[6:], model.reference(prefix + tail_b)[11:])


def test_batched_decode_of_requests_of_different_lengths(model: Model) -> None:
    lengths = (3, 17, 8)
    sequences = [model.tokens(n) for n in lengths]
    slots = [model.take_slots(n) for n in lengths]
    # prefill all three in one batch
    logits = model.runner.forward(ForwardBatch.from_requests(sequences, slots))
    for b, seq in enumerate(sequences):
        assert_close(logits[b], model.reference(seq)[-1])
    for _ in range(4):
        # greedy decode step for every request at once: one new token each
        new = [int(np.argmax(logits[b])) for b in range(len(sequences))]
        for b in range(len(sequences)):
            sequences[b].append(new[b])
            slots[b] += model.take_slots(1)
        logits = model.runner.forward(ForwardBatch.from_requests([[t] for t in new], slots))
        for b, seq in enumerate(sequences):
            assert_close(logits[b], model.reference(seq)[-1])


def test_mixed_batch_of_decodes_and_a_prefill_chunk(model: Model) -> None:
    short, long, waiting = model.tokens(3), model.tokens(10), model.tokens(12)
    short_slots, long_slots, waiting_slots = model.take_slots(4), model.take_slots(11), model.take_slots(12)
    model.runner.forward(ForwardBatch.from_requests([short, long], [short_slots[:3], long_slots[:10]]))
    model.runner.forward(ForwardBatch.from_requests([waiting[:5]], [waiting_slots[:5]]))
    step_short, step_long = model.tokens(1), model.tokens(1)
    # continuous batching: two running requests decode while the third's prompt continues
    batch = ForwardBatch.from_requests([step_short, waiting[5:], step_long], [short_slots, waiting_slots, long_slots])
    logits = model.runner.forward(batch, all_logits=True)
    assert_close(logits[:1], model.reference(short + step_short)[-1:])
    assert_close(logits[1:8], model.reference(waiting)[5:])
    assert_close(logits[8:], model.reference(long + step_long)[-1:])


def test_batch_from_an_engine_plan_keeps_its_columns() -> None:
    expected = ForwardBatch.from_requests([[5, 6], [7]], [[10, 11, 12], [20, 21]])
    plan = SimpleNamespace(
        rids=np.array([1, 2], np.uint64),
        samples=np.array([True, False]),
        **{
            name: getattr(expected, name)
            for name in ("input_ids", "positions", "out_slots", "qo_offsets", "kv_slots", "kv_offsets")
        },
    )
    batch = ForwardBatch.from_plan(plan)
    for name in ("input_ids", "positions", "out_slots", "qo_offsets", "kv_slots", "kv_offsets"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name))
    assert batch.positions.tolist() == [1, 2, 1]


def test_runner_result_does_not_depend_on_slot_placement() -> None:
    # the same request on two different slot layouts gives bit-identical logits
    a, b = Model("llama3", seed=3), Model("llama3", seed=3)
    ids = a.tokens(15)
    slots_a = list(range(15))
    slots_b = list(range(NUM_SLOTS - 1, NUM_SLOTS - 16, -1))
    out_a = a.runner.forward(ForwardBatch.from_requests([ids], [slots_a]), all_logits=True)
    out_b = b.runner.forward(ForwardBatch.from_requests([ids], [slots_b]), all_logits=True)
    np.testing.assert_array_equal(out_a, out_b)
    np.testing.assert_array_equal(a.runner.k_pool[1][slots_a], b.runner.k_pool[1][slots_b])


def test_sliding_window_changes_the_logits_of_long_sequences() -> None:
    # guards against the window test above passing because the window is never applied
    windowed = small_config("mistral")
    unwindowed = small_config("mistral", sliding_window=None)
    weights = random_weights(windowed, seed=5)
    ids = list(range(3, 15))
    a = reference_logits(windowed, weights, ids)
    b = reference_logits(unwindowed, weights, ids)
    np.testing.assert_allclose(a[:5], b[:5], rtol=0, atol=1e-9)
    assert np.abs(a[5:] - b[5:]).max() > 1e-3


def test_llama3_rope_scaling_changes_the_logits() -> None:
    scaled = small_config("llama3")
    plain = small_config("llama3", rope_scaling=None)
    weights = random_weights(scaled, seed=6)
    ids = list(range(20, 60))
    runner_scaled = NumpyRunner(scaled, weights, 64)
    runner_plain = NumpyRunner(plain, weights, 64)
    batch = ForwardBatch.from_requests([ids], [list(range(40))])
    difference = runner_scaled.forward(batch) - runner_plain.forward(batch)
    assert np.abs(difference).max() > 1e-3


def _valid_columns() -> dict[str, list[int]]:
    # two requests: 2 new tokens over 1 cached slot, and 1 new token over 2 cached
    return {
        "input_ids": [5, 6, 7],
        "positions": [1, 2, 2],
        "out_slots": [11, 12, 22],
        "qo_offsets": [0, 2, 3],
        "kv_slots": [10, 11, 12, 20, 21, 22],
        "kv_offsets": [0, 3, 6],
    }


def test_valid_batch_is_accepted_and_converted_to_int32() -> None:
    columns = _valid_columns()
    batch = ForwardBatch(**{k: np.asarray(v, dtype=np.uint32) for k, v in columns.items()})
    assert batch.batch_size == 2 and batch.num_tokens == 3
    for name, values in columns.items():
        array = getattr(batch, name)
        assert array.dtype == np.int32 and array.flags.c_contiguous
        assert array.tolist() == values


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("positions", [1, 2], "one entry per new token"),
        ("qo_offsets", [0, 2, 4], "qo_offsets must start at 0 and end"),
        ("qo_offsets", [0, 3, 3], "no new token"),
        ("kv_offsets", [0, 1, 6], "fewer KV slots than new tokens"),
        ("kv_offsets", [0, 6], "both have B + 1 entries"),
        ("out_slots", [11, 13, 22], "must end, for each request, with its out_slots"),
        ("positions", [1, 2, 3], "must number each request's kv_slots from 0"),
        ("positions", [0, 1, 2], "must number each request's kv_slots from 0"),
        ("input_ids", [5.0, 6.0, 7.0], "must hold integers"),
        ("input_ids", [5, -6, 7], "outside"),
        ("kv_slots", [[10, 11, 12, 20, 21, 22]], "one-dimensional"),
    ],
)
def test_malformed_batch_is_refused_naming_the_column(field: str, value: list, message: str) -> None:
    columns = _valid_columns() | {field: value}
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        ForwardBatch(**{k: np.asarray(v) for k, v in columns.items()})


def test_duplicate_out_slot_or_empty_batch_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="names a slot twice"):
        ForwardBatch.from_requests([[1, 2]], [[4, 4]])
    with pytest.raises(InvalidInputError, match="at least one request"):
        ForwardBatch.from_requests([], [])


def test_pool_size_is_what_the_config_says(model: Model) -> None:
    pool_bytes = sum(pool.nbytes for pool in (*model.runner.k_pool, *model.runner.v_pool))
    assert pool_bytes == NUM_SLOTS * model.config.kv_bytes_per_slot()


def test_runner_refuses_ids_and_slots_out_of_range() -> None:
    config = small_config("qwen2")
    runner = NumpyRunner(config, random_weights(config, seed=0), num_slots=8)
    with pytest.raises(InvalidInputError, match="vocab size"):
        runner.forward(ForwardBatch.from_requests([[config.vocab_size]], [[0]]))
    with pytest.raises(InvalidInputError, match="num_slots"):
        runner.forward(ForwardBatch.from_requests([[1]], [[0, 8]]))
