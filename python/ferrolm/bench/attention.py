"""``ferrolm bench attention``: one layer's attention over the paged KV pool, the Rust
core's kernel (keys and values read in place) against the numpy runner's gather path
(keys and values copied out of the pool by fancy indexing, decodes padded to the longest
context, then batched matmuls), on the same pool, columns and queries, in one run.

Cases: decode batches of 1/8/32 requests at 0.5k, 4k and mixed 0.5–4k contexts, and
prefill chunks over a cached prefix; each request's slots are scattered over the pool (as
after a while of serving). Both sides include writing the step's new keys and values into
the pool. Times are medians of calls alternating between the two sides; the ratio is
numpy / kernel (above 1: the kernel is faster). The kernel also runs on a float16 pool (half the bytes
read); the gather path there is the reference's float16 gather.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import random_weights
from ferrolm.model.runner import ForwardBatch, NumpyRunner, _AttentionPlan


def _config(heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig.from_dict(
        {
            "model_type": "llama",
            "hidden_size": heads * head_dim,
            "num_hidden_layers": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": 64,
            "vocab_size": 64,
            "max_position_embeddings": 1 << 16,
            "rms_norm_eps": 1e-5,
        }
    )


def _paired_medians(
    a: Callable[[], Any], b: Callable[[], Any], budget: float, min_reps: int = 5
) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, called alternately so that both see the same
    moments of a shared machine."""
    a(), b()  # warm up
    times: tuple[list[float], list[float]] = ([], [])
    start = time.perf_counter()
    while len(times[0]) < min_reps or (time.perf_counter() - start < budget and len(times[0]) < 200):
        for fn, out in ((a, times[0]), (b, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return float(np.median(times[0])), float(np.median(times[1]))


def _cases(rng: np.random.Generator, quick: bool) -> list[tuple[str, list[tuple[int, int]]]]:
    """(name, [(cached prefix, new tokens) per request])."""
    cases: list[tuple[str, list[tuple[int, int]]]] = []
    for batch in (1, 8, 32):
        for label, contexts in (
            ("0.5k", [512] * batch),
            ("4k", [4096] * batch),
            ("0.5-4k", [int(c) for c in rng.integers(512, 4097, batch)]),
        ):
            if quick and (batch == 32 or label != "0.5k"):
                continue
            cases.append((f"decode B={batch:<2} ctx {label}", [(c - 1, 1) for c in contexts]))
    if quick:
        cases.append(("prefill 64 over 128 + 2 decodes", [(128, 64), (300, 1), (40, 1)]))
        return cases
    cases.append(("prefill 512 over 0", [(0, 512)]))
    cases.append(("prefill 512 over 2k", [(2048, 512)]))
    cases.append(("prefill 256 + 8 decodes 2k", [(0, 256)] + [(2047, 1)] * 8))
    return cases


def run(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(0)
    config = _config(args.heads, args.kv_heads, args.head_dim)
    weights = random_weights(config, seed=0)
    cases = _cases(rng, args.quick)
    need = max(sum(p + n for p, n in reqs) for _, reqs in cases)
    runners = {
        dtype: NumpyRunner(config, weights, need, kv_cache_dtype=dtype, attention="kernel")
        for dtype in ("float32", "float16")
    }
    print(
        f"one layer: {config.num_heads} heads, {config.num_kv_heads} KV heads, head_dim {config.head_dim}; "
        f"{os.cpu_count()} CPUs; kernel threads: all; times are medians (ms)"
    )
    header = f"{'case':<30} {'numpy f32':>10} {'kernel f32':>10} {'ratio':>7}   {'numpy f16':>10} {'kernel f16':>10} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    ratios: dict[str, list[float]] = {"float32": [], "float16": []}
    for name, requests in cases:
        total = sum(p + n for p, n in requests)
        slots = rng.permutation(need)[:total].astype(np.int32)
        batch = ForwardBatch.from_requests(
            [[0] * n for _, n in requests],
            [s.tolist() for s in np.split(slots, np.cumsum([p + n for p, n in requests])[:-1])],
        )
        plan = _AttentionPlan.of(batch, config.sliding_window)
        shape = (batch.num_tokens, config.num_heads, config.head_dim)
        kv_shape = (batch.num_tokens, config.num_kv_heads, config.head_dim)
        q = rng.standard_normal(shape, np.float32)
        k = rng.standard_normal(kv_shape, np.float32)
        v = rng.standard_normal(kv_shape, np.float32)
        row = [f"{name:<30}"]
        for dtype, runner in runners.items():
            k_pool, v_pool = runner.k_pool[0], runner.v_pool[0]
            k_pool[slots] = rng.standard_normal((total, *kv_shape[1:]), np.float32)
            v_pool[slots] = rng.standard_normal((total, *kv_shape[1:]), np.float32)

            def gather_path(
                runner: NumpyRunner = runner, k_pool: np.ndarray = k_pool, v_pool: np.ndarray = v_pool
            ) -> Any:
                return runner._attend_reference(q.copy(), k, v, batch, plan, k_pool, v_pool)

            def kernel_path(
                runner: NumpyRunner = runner, k_pool: np.ndarray = k_pool, v_pool: np.ndarray = v_pool
            ) -> Any:
                return runner._attend_kernel(q.copy(), k, v, batch, k_pool, v_pool)

            a, b = _paired_medians(gather_path, kernel_path, args.budget)
            ratios[dtype].append(a / b)
            row.append(f"{a * 1e3:>10.3f} {b * 1e3:>10.3f} {a / b:>6.1f}x")
        print(" ".join(row[:2]) + "   " + row[2])
    for dtype, values in ratios.items():
        print(f"geometric mean ratio ({dtype} pool): {float(np.exp(np.mean(np.log(values)))):.1f}x")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attention",
        help="paged-attention kernel vs the numpy gather path",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32, help="default: the e2e benchmark's model (8/4/32)")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of repeats per case and pool type")
    p.add_argument("--quick", action="store_true", help="three short cases (a smoke test)")
    p.set_defaults(func=run)
