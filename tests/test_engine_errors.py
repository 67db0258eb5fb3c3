"""Bad input to the engine is refused with a typed ``InvalidInputError`` whose ``field``
names what is wrong, and leaves the engine as it was: nothing queued, no KV held, and the
next request runs as if nothing had happened.
"""

from __future__ import annotations

from typing import Any

import ferrolm
import numpy as np
import pytest
from conftest import make_engine as _make_engine
from ferrolm import SamplingParams
from ferrolm.engine import Engine
from ferrolm.errors import InvalidInputError
from ferrolm.model import LoadedModel

KV_CAPACITY = 256
CONTEXT = 4096  # the tiny model's max_position_embeddings
GOOD = SamplingParams(temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def engine(tiny: LoadedModel) -> Engine:
    e = make_engine(tiny)
    e.generate("warm the cache up", GOOD)  # so that "unchanged" means something
    return e


@pytest.fixture(scope="module")
def expected(tiny: LoadedModel) -> list[int]:
    """What a good request gives on a fresh engine."""
    [r] = make_engine(tiny).generate("a good prompt", GOOD)
    return r.token_ids


def assert_refused(engine: Engine, expected: list[int], field: str, prompt: Any, **params: Any) -> None:
    """``submit`` and ``generate`` both refuse, naming ``field``; nothing changes."""
    before = engine.core.stats()
    for call in (engine.submit, engine.generate):
        with pytest.raises(InvalidInputError) as info:
            call(prompt, SamplingParams(**{"temperature": 0.0, "max_new_tokens": 6, **params}))
        assert info.value.field == field, (field, str(info.value))
        assert isinstance(info.value, ValueError)
        assert str(info.value), "the message must say what is wrong"
        after = engine.core.stats()
        assert not engine.has_work()
        assert (after["waiting"], after["running"]) == (0, 0), after
        assert after["kv_used"] == before["kv_used"], (before, after)
        assert after["cached_tokens"] == before["cached_tokens"], (before, after)
        engine.core.check_invariants()
    # and the engine still works
    [r] = engine.generate("a good prompt", GOOD)
    assert r.token_ids == expected
    assert r.finish_reason == "length"


OUT_OF_RANGE = [
    pytest.param("temperature", {"temperature": -1.0}, id="temperature-negative"),
    pytest.param("temperature", {"temperature": 1e9}, id="temperature-absurd"),
    pytest.param("temperature", {"temperature": float("nan")}, id="temperature-nan"),
    pytest.param("top_p", {"top_p": 0.0}, id="top_p-zero"),
    pytest.param("top_p", {"top_p": 1.5}, id="top_p-above-1"),
    pytest.param("min_p", {"min_p": -0.1}, id="min_p-negative"),
    pytest.param("repetition_penalty", {"repetition_penalty": 0.0}, id="repetition_penalty-zero"),
    pytest.param("frequency_penalty", {"frequency_penalty": 50.0}, id="frequency_penalty-absurd"),
    pytest.param("presence_penalty", {"presence_penalty": float("inf")}, id="presence_penalty-inf"),
    pytest.param("max_new_tokens", {"max_new_tokens": 0}, id="max_new_tokens-zero"),
    pytest.param("max_new_tokens", {"max_new_tokens": CONTEXT}, id="max_new_tokens-beyond-context"),
    pytest.param("min_new_tokens", {"min_new_tokens": 7, "max_new_tokens": 6}, id="min_new_tokens-above-max"),
    pytest.param("top_logprobs", {"top_logprobs": 10_000}, id="top_logprobs-absurd"),
    pytest.param("logit_bias", {"logit_bias": {10**6: 1.0}}, id="logit_bias-token-outside-vocab"),
    pytest.param("logit_bias", {"logit_bias": {5: 1e6}}, id="logit_bias-absurd"),
    pytest.param("stop", {"stop": ["ok", ""]}, id="stop-empty-string"),
    pytest.param("stop_token_ids", {"stop_token_ids": [10**6]}, id="stop_token_ids-outside-vocab"),
    pytest.param("allowed_token_ids", {"allowed_token_ids": [1, 10**6]}, id="allowed_token_ids-outside-vocab"),
]


@pytest.mark.parametrize(("field", "params"), OUT_OF_RANGE)
def test_out_of_range_parameters(engine: Engine, expected: list[int], field: str, params: dict) -> None:
    assert_refused(engine, expected, field, "a prompt", **params)


@pytest.mark.parametrize(
    ("field", "params"),
    [
        pytest.param("top_k", {"top_k": -1}, id="top_k-negative"),
        pytest.param("max_new_tokens", {"max_new_tokens": -1}, id="max_new_tokens-negative"),
        pytest.param("max_new_tokens", {"max_new_tokens": 2.5}, id="max_new_tokens-float"),
        pytest.param("n", {"n": 0}, id="n-zero"),
        pytest.param("seed", {"seed": -1}, id="seed-negative"),
        pytest.param("seed", {"seed": 2**64}, id="seed-too-big"),
        pytest.param("temperature", {"temperature": "hot"}, id="temperature-not-a-number"),
        pytest.param("max_new_tokens", {"max_new_tokens": True}, id="max_new_tokens-bool"),
        pytest.param("stop_token_ids", {"stop_token_ids": [1, "2"]}, id="stop_token_ids-not-ids"),
    ],
)
def test_sampling_params_refuse_bad_values(field: str, params: dict) -> None:
    with pytest.raises(InvalidInputError) as info:
        SamplingParams(**params)
    assert info.value.field == field


def test_empty_prompt(engine: Engine, expected: list[int]) -> None:
    assert_refused(engine, expected, "prompt", "")
    assert_refused(engine, expected, "input_ids", np.array([], dtype=np.int32))


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param([1, 2, 32008], id="vocab-size"),
        pytest.param([2**20], id="far-outside"),
        pytest.param(np.array([5, 2**31], dtype=np.int64), id="int64-array"),
        pytest.param(np.array([5, 40000], dtype=np.uint32), id="uint32-array"),
    ],
)
def test_ids_outside_the_vocabulary(engine: Engine, expected: list[int], ids: Any) -> None:
    assert engine.core.vocab_size == 32008
    assert_refused(engine, expected, "input_ids", ids)


def test_negative_ids_are_refused(engine: Engine, expected: list[int]) -> None:
    """(The binding's integer conversion refuses these before the core sees them; it
    names ``input_ids`` in the message.)"""
    before = engine.core.stats()
    with pytest.raises(InvalidInputError, match="input_ids"):
        engine.submit([5, -1], GOOD)
    assert engine.core.stats()["kv_used"] == before["kv_used"] and not engine.has_work()
    [r] = engine.generate("a good prompt", GOOD)
    assert r.token_ids == expected


def test_prompt_longer_than_the_context(tiny: LoadedModel, expected: list[int]) -> None:
    # a pool large enough that only the context length is at fault
    big = make_engine(tiny, kv_capacity=CONTEXT + 64)
    assert_refused(big, expected, "input_ids", [5] * CONTEXT)
    assert_refused(big, expected, "input_ids", [5] * (CONTEXT + 100))
    # prompt + max_new_tokens beyond the context
    assert_refused(big, expected, "max_new_tokens", [5] * (CONTEXT - 10), max_new_tokens=11)
    # exactly at the limit it is accepted (aborted before it runs: a 4k prefill is slow here)
    rid = big.submit([5] * (CONTEXT - 10), SamplingParams(temperature=0.0, max_new_tokens=10))
    assert big.core.stats()["waiting"] == 1
    assert big.abort(rid) is True
    assert [(d.rid, d.finish_reason) for d in big.step()] == [(rid, "abort")]
    stats = big.core.stats()
    assert not big.has_work() and stats["kv_used"] == stats["cached_tokens"], stats


def test_prompt_larger_than_the_kv_pool(engine: Engine, expected: list[int]) -> None:
    assert_refused(engine, expected, "input_ids", [5] * (KV_CAPACITY + 1))


def test_unknown_model_name() -> None:
    with pytest.raises(InvalidInputError, match="no-such-model"):
        ferrolm.Engine("no-such-model")
    with pytest.raises(InvalidInputError):
        ferrolm.Engine("/nonexistent/folder/of/a/model")


def test_refusals_leave_the_engine_reusable_after_many(engine: Engine, expected: list[int]) -> None:
    """A burst of refusals between real work: the engine's counters of admitted work do
    not move, and the outputs stay the same."""
    before = engine.core.stats()
    for bad in ([], [10**6], [5] * 300):
        with pytest.raises(InvalidInputError):
            engine.submit(np.asarray(bad, dtype=np.int32), GOOD)
    after = engine.core.stats()
    for key in ("prompt_tokens", "generation_tokens", "finished", "errors", "kv_used", "waiting", "running"):
        assert after[key] == before[key], key
    [r] = engine.generate("a good prompt", GOOD)
    assert r.token_ids == expected


def make_engine(tiny: LoadedModel, kv_capacity: int = KV_CAPACITY, **kw: Any) -> Engine:
    return _make_engine(tiny, kv_capacity, **kw)
