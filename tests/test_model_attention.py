"""The core's paged-attention kernel (``_core.paged_attention``, ``_core.write_kv``)
against a float64 numpy attention on random plans, and the numpy runner with the kernel
against the runner with its pure-numpy attention (the reference path)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import load_model
from ferrolm.model.random_weights import random_weights
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from small_models import SMALL_MODEL_OVERRIDES, small_config

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def reference_attention(q, k_pool, v_pool, positions, qo, kv_slots, kvo, scale, window):
    """Plain float64 attention, one query head at a time, over the pool's stored values."""
    tokens, heads, dim = q.shape
    group = heads // k_pool.shape[1]
    k64, v64 = k_pool.astype(np.float64), v_pool.astype(np.float64)
    out = np.zeros((tokens, heads, dim))
    for b in range(len(qo) - 1):
        slots = kv_slots[kvo[b] : kvo[b + 1]]
        for t in range(qo[b], qo[b + 1]):
            p = int(positions[t])
            first = 0 if window is None else max(0, p + 1 - window)
            seen = slots[first : p + 1]
            for h in range(heads):
                scores = k64[seen, h // group] @ q[t, h].astype(np.float64) * scale
                weights = np.exp(scores - scores.max())
                out[t, h] = weights @ v64[seen, h // group] / weights.sum()
    return out


@st.composite
def plans(draw):
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    dim = draw(st.sampled_from([32, 64, 128]))  # 32: the tiny model's
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    window = draw(st.none() | st.integers(1, 40))
    # (cached prefix, new tokens): decodes and prefill chunks, with or without a prefix
    requests = draw(
        st.lists(
            st.one_of(st.tuples(st.integers(0, 300), st.just(1)), st.tuples(st.integers(0, 100), st.integers(1, 40))),
            min_size=1,
            max_size=5,
        )
    )
    seed = draw(st.integers(0, 2**32 - 1))
    threads = draw(st.sampled_from([None, 1, 2, 3]))
    return kv_heads, group, dim, dtype, window, requests, seed, threads


@settings(max_examples=60, deadline=None)
@given(plans())
def test_kernel_equals_float64_attention_on_random_plans(plan) -> None:
    kv_heads, group, dim, dtype, window, requests, seed, threads = plan
    heads = kv_heads * group
    rng = np.random.default_rng(seed)
    total = sum(p + n for p, n in requests)
    num_slots = total + 5
    order = rng.permutation(num_slots).astype(np.int32)  # slots scattered over the pool
    k_pool = rng.uniform(-1, 1, (num_slots, kv_heads, dim)).astype(DTYPES[dtype])
    v_pool = rng.uniform(-1, 1, (num_slots, kv_heads, dim)).astype(DTYPES[dtype])
    batch = ForwardBatch.from_requests(
        [[0] * n for _, n in requests], np.split(order[:total], np.cumsum([p + n for p, n in requests])[:-1])
    )
    new_k = rng.uniform(-1, 1, (batch.num_tokens, kv_heads, dim)).astype(np.float32)
    new_v = rng.uniform(-1, 1, (batch.num_tokens, kv_heads, dim)).astype(np.float32)
    _core.write_kv(k_pool, v_pool, batch.out_slots, new_k, new_v)
    # written with numpy's own rounding (nearest even)
    np.testing.assert_array_equal(k_pool[batch.out_slots], new_k.astype(DTYPES[dtype]))
    np.testing.assert_array_equal(v_pool[batch.out_slots], new_v.astype(DTYPES[dtype]))

    q = rng.uniform(-2, 2, (batch.num_tokens, heads, dim)).astype(np.float32)
    scale = dim**-0.5
    out = np.full_like(q, np.nan)
    _core.paged_attention(
        q, k_pool, v_pool, batch.positions, batch.qo_offsets, batch.kv_slots, batch.kv_offsets, out,
        scale=scale, sliding_window=window, num_threads=threads,
    )  # fmt: skip
    want = reference_attention(
        q, k_pool, v_pool, batch.positions, batch.qo_offsets, batch.kv_slots, batch.kv_offsets, scale, window
    )
    # computed in float32 from the same stored values: outputs are averages of values in
    # [-1, 1], so an absolute bound of a few float32 ulps times the context's depth
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5)


def small_step(dtype=np.float32):
    k_pool = np.zeros((8, 2, 16), dtype)
    v_pool = np.zeros((8, 2, 16), dtype)
    q = np.ones((2, 4, 16), np.float32)
    out = np.zeros_like(q)
    columns = dict(
        positions=np.array([0, 1], np.int32),
        qo_offsets=np.array([0, 2], np.int32),
        kv_slots=np.array([3, 5], np.int32),
        kv_offsets=np.array([0, 2], np.int32),
    )
    return q, k_pool, v_pool, columns, out


def call(q, k_pool, v_pool, columns, out, **options):
    _core.paged_attention(q, k_pool, v_pool, out=out, scale=options.pop("scale", 0.25), **columns, **options)


def test_a_query_sees_only_its_window() -> None:
    q, k_pool, v_pool, columns, out = small_step()
    v_pool[3], v_pool[5] = 1.0, 3.0
    call(q, k_pool, v_pool, columns, out, sliding_window=1)
    np.testing.assert_array_equal(out[0], 1.0)  # its own value only
    np.testing.assert_array_equal(out[1], 3.0)
    call(q, k_pool, v_pool, columns, out)
    np.testing.assert_allclose(out[1], 2.0)  # equal scores: the mean of both


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda a: a.update(q=a["q"].astype(np.float64)), "queries"),
        (lambda a: a.update(q=a["q"][:, :, :8]), "queries"),
        (lambda a: a.update(q=np.asfortranarray(a["q"])), "queries"),
        (lambda a: a.update(out=a["out"][:1]), "out"),
        (lambda a: a.update(out=a["q"]), "out"),
        (lambda a: a.update(k_pool=a["k_pool"].astype(np.int16)), "k_pool"),
        (lambda a: a.update(v_pool=a["v_pool"].astype(np.float16)), "v_pool"),
        (lambda a: a.update(v_pool=a["k_pool"]), "v_pool"),
        (lambda a: a["columns"].update(kv_slots=np.array([3, 8], np.int32)), "kv_slots"),
        (lambda a: a["columns"].update(positions=np.array([0, 2], np.int32)), "positions"),
        (lambda a: a["columns"].update(qo_offsets=np.array([0, 1], np.int32)), "qo_offsets"),
        (lambda a: a["columns"].update(kv_offsets=np.array([0, 1, 2], np.int32)), "kv_offsets"),
        (lambda a: a["columns"].update(positions=np.array([0, -1], np.int32)), "positions"),
        (lambda a: a.update(sliding_window=0), "sliding_window"),
        (lambda a: a.update(num_threads=-1), "num_threads"),
        (lambda a: a.update(scale="x"), "scale"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, field: str) -> None:
    q, k_pool, v_pool, columns, out = small_step()
    args = dict(q=q, k_pool=k_pool, v_pool=v_pool, columns=columns, out=out)
    change(args)
    options = {k: args.pop(k) for k in ("sliding_window", "num_threads", "scale") if k in args}
    with pytest.raises(InvalidInputError) as raised:
        call(args["q"], args["k_pool"], args["v_pool"], args["columns"], args["out"], **options)
    assert raised.value.field == field, raised.value


def test_write_kv_refuses_a_slot_outside_the_pool_and_a_read_only_pool() -> None:
    _, k_pool, v_pool, _, _ = small_step(np.float16)
    new = np.ones((1, 2, 16), np.float32)
    with pytest.raises(InvalidInputError) as raised:
        _core.write_kv(k_pool, v_pool, np.array([8], np.int32), new, new)
    assert raised.value.field == "out_slots"
    k_pool.flags.writeable = False
    with pytest.raises(InvalidInputError) as raised:
        _core.write_kv(k_pool, v_pool, np.array([1], np.int32), new, new)
    assert raised.value.field == "k_pool"


@pytest.mark.parametrize("variant", sorted(SMALL_MODEL_OVERRIDES))
@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16", "bfloat16"])
def test_runner_with_the_kernel_matches_its_reference_path(variant: str, kv_cache_dtype: str) -> None:
    """A prefill over a cached prefix, then a mixed batch of decodes and a chunk."""
    config = small_config(variant)
    weights = random_weights(config, seed=3)
    runners = [
        NumpyRunner(config, weights, 64, kv_cache_dtype=kv_cache_dtype, attention=backend)
        for backend in ("kernel", "reference")
    ]
    rng = np.random.default_rng(4)
    ids = [int(t) for t in rng.integers(0, config.vocab_size, 30)]
    slots = [int(s) for s in rng.permutation(64)]
    batches = [
        ForwardBatch.from_requests([ids[:12]], [slots[:12]]),
        ForwardBatch.from_requests([ids[12:20]], [slots[:20]]),  # over the cached 12
        ForwardBatch.from_requests([[ids[20]], ids[21:27]], [slots[:21], slots[30:36]]),  # a decode and a prefill
    ]
    for batch in batches:
        kernel, reference = (r.forward(batch, all_logits=True) for r in runners)
        # the same float32 computation in another summation order
        np.testing.assert_allclose(kernel, reference, rtol=0, atol=2e-4 * max(1.0, float(np.abs(reference).max())))
    # the first layer's keys and values come before any attention: stored identically
    np.testing.assert_array_equal(runners[0].k_pool[0], runners[1].k_pool[0])
    np.testing.assert_array_equal(runners[0].v_pool[0], runners[1].v_pool[0])


def test_greedy_outputs_of_the_tiny_model_are_identical_with_kernel_and_reference(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path))
    model = load_model("tiny")
    num_slots = 512
    runners = {
        backend: NumpyRunner(model.config, model.weights, num_slots, attention=backend)
        for backend in ("kernel", "reference")
    }
    prompts = [
        model.tokenizer.encode(text)
        for text in ("Once upon a time", "The radix tree lets requests that share a prefix", "JSON: {")
    ]
    outputs = {}
    for backend, runner in runners.items():
        # the three prompts, then 40 batched greedy decode steps
        sequences = [list(map(int, p)) for p in prompts]
        slot_lists = [list(range(i * 128, i * 128 + len(p))) for i, p in enumerate(sequences)]
        logits = runner.forward(ForwardBatch.from_requests(sequences, slot_lists))
        for _ in range(40):
            nxt = [int(np.argmax(row)) for row in logits]
            for seq, slots, token in zip(sequences, slot_lists, nxt, strict=True):
                seq.append(token)
                slots.append(slots[-1] + 1)
            logits = runner.forward(ForwardBatch.from_requests([[s[-1]] for s in sequences], slot_lists))
        outputs[backend] = sequences
    assert outputs["kernel"] == outputs["reference"]


def test_unknown_kv_cache_dtype_or_backend_is_refused() -> None:
    config = small_config("llama3")
    weights = random_weights(config, seed=0)
    with pytest.raises(InvalidInputError, match="kv_cache_dtype"):
        NumpyRunner(config, weights, 8, kv_cache_dtype="int8")
    with pytest.raises(InvalidInputError, match="attention"):
        NumpyRunner(config, weights, 8, attention="torch")
