"""``ferrolm bench engine``: the engine core's own time per step (``schedule`` +
``commit``, the forward excluded) with a null model that returns random logits.

Every request decodes (prompts are prefilled before timing starts), so each step is one
decode token per request: the per-token CPU cost a serving loop pays on top of the model.
Modes: ``greedy`` and ``top_p`` sample the logits on the CPU (``commit``); ``ids`` is the
path of a runner that picks the tokens on its device (the torch runner's greedy): the core
gets one id per request (``commit_tokens``) and never reads a logit; ``device`` is the
device sampler's path for the same top-p requests as ``top_p``: the core hands over the
step's sampling columns (``sampling_batch``), then takes the ids and their logprobs
(``commit_tokens``). Its row and the ``top_p`` row side by side are what sampling on the
device saves the CPU per step.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ferrolm._core import Engine, Vocabulary

FLOOR_MS = 1.0  # batch 64, greedy, 32k vocab
IDS_FLOOR_MS = 1.0  # batch 64, ids from the device (greedy or sampled there), vocab >= 150k
MODES = ("greedy", "top_p", "ids", "device")
ON_DEVICE = ("ids", "device")


def _vocab(size: int) -> Vocabulary:
    # the last id is EOS (requests run with ignore_eos, so every step decodes)
    return Vocabulary([f"t{i} ".encode() for i in range(size - 1)] + [b"</s>"], eos_token_ids=[size - 1])


def step_times(batch: int, vocab: int, mode: str, steps: int, seed: int = 0) -> np.ndarray:
    prompt_len = 64
    engine = Engine(
        _vocab(vocab),
        kv_capacity=batch * (prompt_len + steps + 8),
        max_running_requests=batch,
        max_prefill_tokens=batch * prompt_len,
        max_context=prompt_len + steps + 16,
    )
    rng = np.random.default_rng(seed)
    sampling: dict[str, Any] = {"temperature": 0.0} if mode in ("greedy", "ids") else {"temperature": 0.8, "top_p": 0.9}
    if mode == "device":
        sampling["logprobs"] = True  # the device hands them over too
    for rid in range(batch):
        prompt = rng.integers(0, vocab, prompt_len, dtype=np.int32)
        engine.submit(rid, prompt, max_new_tokens=steps + 4, ignore_eos=True, **sampling)
    source = rng.standard_normal((batch, vocab), dtype=np.float32) * 3
    logits = np.empty_like(source)
    # prefill everything first
    plan = engine.schedule()
    np.copyto(logits[: len(plan)], source[: len(plan)])
    engine.commit(logits[: len(plan)])
    times = []
    ids = rng.integers(0, vocab - 1, (steps, batch), dtype=np.int32)  # what a device sampler hands over
    logprobs = -rng.random((steps, batch), dtype=np.float32)
    for step in range(steps):
        t0 = time.perf_counter_ns()
        plan = engine.schedule()
        if mode == "device":
            engine.sampling_batch()  # the columns the device sampler reads
        t1 = time.perf_counter_ns()
        if mode not in ON_DEVICE:
            np.copyto(logits, source)  # the "forward": not timed
        t2 = time.perf_counter_ns()
        if mode == "ids":
            engine.commit_tokens(ids[step])
        elif mode == "device":
            engine.commit_tokens(ids[step], logprobs=logprobs[step])
        else:
            engine.commit(logits)
        t3 = time.perf_counter_ns()
        assert len(plan) == batch
        times.append((t1 - t0) + (t3 - t2))
    return np.array(times, dtype=np.float64) / 1e3


def tiny_end_to_end(batch: int, new_tokens: int = 32) -> dict[str, float]:
    """Tokens/s of the tiny model through ``ferrolm.Engine``, with the step split into the
    core's share (schedule + commit) and the runner's (forward)."""
    from ferrolm.engine import Engine, default_blas_threads, deltas_of
    from ferrolm.model import ForwardBatch

    engine = Engine(
        "tiny", kv_capacity=batch * 128 + 1024, max_running_requests=batch, blas_threads=default_blas_threads()
    )
    rng = np.random.default_rng(0)
    for _ in range(batch):
        prompt = rng.integers(0, 32_000, int(rng.integers(16, 48)), dtype=np.int32)
        engine.core.submit(next(engine._rids), prompt, max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    core_ns = forward_ns = 0
    tokens = 0
    t_start = time.perf_counter_ns()
    while engine.has_work():
        t0 = time.perf_counter_ns()
        plan = engine.core.schedule()
        t1 = time.perf_counter_ns()
        logits = engine.runner.forward(ForwardBatch.from_plan(plan))
        t2 = time.perf_counter_ns()
        out = engine.core.commit(logits)
        t3 = time.perf_counter_ns()
        tokens += len(out.token_ids)
        core_ns += (t1 - t0) + (t3 - t2)
        forward_ns += t2 - t1
        deltas_of(out)
    wall = (time.perf_counter_ns() - t_start) / 1e9
    return {"tokens_per_s": tokens / wall, "core_share": core_ns / (core_ns + forward_ns), "tokens": tokens}


def run(args: argparse.Namespace) -> int:
    print(f"{'vocab':>7}{'mode':>7}{'batch':>7}{'p50 us/step':>13}{'p99 us/step':>13}{'us/token':>10}")
    failed = ids_failed = False
    greedy_checked = ids_checked = False
    p50s: dict[tuple[int, str, int], float] = {}
    for vocab in args.vocab:
        for mode in args.modes:
            for batch in args.batch:
                t = step_times(batch, vocab, mode, args.steps)
                p50, p99 = np.percentile(t, 50), np.percentile(t, 99)
                p50s[vocab, mode, batch] = p50
                print(f"{vocab:>7}{mode:>7}{batch:>7}{p50:>13.1f}{p99:>13.1f}{p50 / batch:>10.2f}")
                if vocab == 32_000 and mode == "greedy" and batch == 64:
                    greedy_checked = True
                    failed |= p50 / 1e3 > FLOOR_MS
                if vocab >= 150_000 and mode in ON_DEVICE and batch == 64:
                    ids_checked = True
                    ids_failed |= p50 / 1e3 > IDS_FLOOR_MS
    if greedy_checked:
        print(
            f"floor: schedule + commit <= {FLOOR_MS} ms per step at batch 64, greedy, 32k vocab: "
            + ("MISSED" if failed else "met")
        )
    if ids_checked:
        print(
            f"floor: schedule + commit_tokens (ids from the device) <= {IDS_FLOOR_MS} ms per step at batch 64, "
            "vocab >= 150k: " + ("MISSED" if ids_failed else "met")
        )
    for (vocab, mode, batch), device in p50s.items():
        cpu = p50s.get((vocab, "top_p", batch))
        if mode == "device" and cpu is not None:
            print(
                f"top-p sampling at vocab {vocab}, batch {batch}: core CPU time per step {cpu / 1e3:.2f} ms with "
                f"the CPU sampler, {device / 1e3:.3f} ms with the device sampler ({cpu / device:.0f}x less)"
            )
    failed |= ids_failed
    if not args.skip_tiny:
        print()
        print(f"{'tiny model end to end':<24}{'batch':>7}{'tokens/s':>10}{'core share of step':>20}")
        for batch in (1, 16, 64):
            r = tiny_end_to_end(batch)
            print(f"{'':<24}{batch:>7}{r['tokens_per_s']:>10.0f}{r['core_share'] * 100:>19.1f}%")
            if r["core_share"] > 0.10:
                failed = True
                print(f"  core share above the 10% floor at batch {batch}")
    return 1 if failed and args.strict else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "engine",
        help="engine core time per step with a null model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--vocab", type=int, nargs="+", default=[32_000, 150_000, 200_000])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="greedy / top_p: the core samples the logits; ids: the runner hands it greedy token ids; "
        "device: top-p drawn by the device sampler (sampling_batch + commit_tokens)",
    )
    p.add_argument("--skip-tiny", action="store_true", help="skip the tiny-model end-to-end run")
    p.add_argument("--strict", action="store_true", help="exit 1 when the floor is missed")
    p.set_defaults(func=run)
