"""``ferrolm bench gpu``: decode throughput of the torch runner against the memory-bandwidth
limit, on random weights built in-process (no download).

A decode step reads every weight once and the KV of every request's context; at small
batches that traffic, not the arithmetic, sets the step time. For each batch size this
prefills ``--context`` tokens per request, times ``--steps`` decode steps (each forward
returns its logits on the host, so every step is complete when it is timed), and prints
tokens/s beside the bandwidth limit: bytes read per step (weights + KV) / bandwidth.
The bandwidth is measured (a large device-to-device copy) unless ``--bandwidth-gbs``
gives it (an H100 SXM's HBM3 is 3,350 GB/s, an H200's 4,800). Beside each row, the device
sampler's own time per step at that batch: top-p 0.9 at temperature 0.8 with logprobs
over random logits of the model's vocabulary (the sampling columns from a real engine
core), ids and logprobs back on the host.

``--model 1b`` is a Llama-3.2-1B-shaped config (16 layers, 2048 wide, GQA 32/8, 128k
vocabulary, tied embeddings) in bf16 on CUDA; ``--model tiny`` a 2-layer one that runs in
seconds on a CPU, which is how CI runs this so it cannot rot.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from ferrolm.model.config import ModelConfig
from ferrolm.model.runner import ForwardBatch
from ferrolm.model.weights import expected_shapes

CONFIGS: dict[str, dict[str, Any]] = {
    "1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "tiny": {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def random_torch_weights(config: ModelConfig, device: Any, dtype: Any, seed: int = 0) -> dict[str, Any]:
    """Every tensor the forward reads, random, made on the device in ``dtype`` (a 1B model
    in bf16 is 2.5 GB: no float32 copy on the host on the way)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    weights: dict[str, Any] = {}
    for name, shape in expected_shapes(config).items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            weights[name] = weights["model.embed_tokens.weight"]
            continue
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, device=device, dtype=dtype)
            continue
        scale = 0.02 if "embed" in name or "lm_head" in name else 1 / math.sqrt(shape[-1])
        weights[name] = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)
    return weights


def measure_bandwidth(device: Any) -> float:
    """Bytes per second of a large copy (read + write), best of a few."""
    import torch

    size = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * size / best


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> int:
    from ferrolm.model.torch_runner import TorchRunner, resolve_device, resolve_dtype

    device = resolve_device(args.device)  # first: a clear error where torch is not installed
    import torch

    dtype = resolve_dtype(args.dtype, device, torch.bfloat16)  # auto: bf16 on CUDA, float32 on the CPU
    if device.type == "cpu":
        from ferrolm.engine import default_blas_threads

        torch.set_num_threads(default_blas_threads())  # as the engine: threads beyond free cores spin
    config = ModelConfig.from_dict(CONFIGS[args.model])
    batches = [int(b) for b in args.batches.split(",")]
    slots_per_request = args.context + args.steps + 2
    num_slots = max(batches) * slots_per_request
    weights = random_torch_weights(config, device, dtype)
    runner = TorchRunner(config, weights, num_slots, device=device, dtype=dtype)
    del weights
    itemsize = torch.empty((), dtype=dtype).element_size()
    # bytes a decode step reads for the weights: every matrix once; the embedding only a
    # row per request (its full read is the tied lm_head's)
    weight_bytes = sum(
        int(t.numel()) * itemsize
        for t in {
            id(t): t
            for t in [runner.lm_head, runner.final_norm, *(w for layer in runner.layers for w in vars_of(layer))]
        }.values()
    )
    bandwidth = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else measure_bandwidth(device)
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"dtype {str(dtype).removeprefix('torch.')}, model {args.model}: {config.num_layers} layers, "
        f"{weight_bytes / 1e9:.3f} GB of weights read per step, KV {config.kv_bytes_per_slot(itemsize)} B per token; "
        f"bandwidth {bandwidth / 1e9:.0f} GB/s ({'given' if args.bandwidth_gbs else 'measured: device copy'})"
    )
    rng = np.random.default_rng(0)
    results = []
    for batch_size in batches:
        slots = [list(range(b * slots_per_request, b * slots_per_request + args.context)) for b in range(batch_size)]
        for b in range(batch_size):  # prefill one request per forward, in chunks
            ids = rng.integers(3, config.vocab_size, args.context).tolist()
            for start in range(0, args.context, 2048):
                end = min(start + 2048, args.context)
                runner.forward(ForwardBatch.from_requests([ids[start:end]], [slots[b][:end]]))
        step_times = []
        for step in range(args.steps + 2):  # two warm-up steps
            new = rng.integers(3, config.vocab_size, batch_size).tolist()
            for b in range(batch_size):
                slots[b].append(slots[b][-1] + 1)
            batch = ForwardBatch.from_requests([[t] for t in new], slots)
            _sync(device)
            t0 = time.perf_counter()
            runner.forward(batch)  # logits come back to the host: the step is done
            if step >= 2:
                step_times.append(time.perf_counter() - t0)
        step_s = float(np.median(step_times))
        context = args.context + args.steps / 2 + 2
        bytes_per_step = weight_bytes + batch_size * context * config.kv_bytes_per_slot(itemsize)
        limit = bytes_per_step / bandwidth
        sampler_s = float(np.median(sampler_times(batch_size, config.vocab_size, device, args.steps)))
        row = {
            "batch": batch_size,
            "step_ms": step_s * 1e3,
            "tokens_per_s": batch_size / step_s,
            "bytes_per_step": bytes_per_step,
            "limit_ms": limit * 1e3,
            "fraction_of_limit": limit / step_s,
            "sampler_ms": sampler_s * 1e3,
        }
        results.append(row)
        print(
            f"batch {batch_size:4d}: decode step p50 {step_s * 1e3:8.3f} ms, {batch_size / step_s:10.1f} tok/s; "
            f"bandwidth limit {limit * 1e3:.3f} ms/step: {limit / step_s:.2f} of the limit "
            f"(floor on a GPU at batch 64: >= 0.5); device sampler (top-p, logprobs) {sampler_s * 1e3:.3f} ms/step"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "device": str(device),
                    "dtype": str(dtype),
                    "model": args.model,
                    "bandwidth": bandwidth,
                    "weight_bytes": weight_bytes,
                    "results": results,
                },
                f,
                indent=1,
            )
    return 0


def sampler_times(batch_size: int, vocab: int, device: Any, steps: int) -> list[float]:
    """Seconds per step of the device sampler on ``batch_size`` rows of random logits."""
    import torch

    from ferrolm._core import Engine, Vocabulary
    from ferrolm.model.device_sampler import sample

    vocabulary = Vocabulary([b"t%d " % i for i in range(vocab - 1)] + [b"</s>"], eos_token_ids=[vocab - 1])
    core = Engine(vocabulary, kv_capacity=batch_size * 8, max_running_requests=batch_size, max_context=64)
    for rid in range(batch_size):
        core.submit(rid, [1, 2], temperature=0.8, top_p=0.9, logprobs=True, max_new_tokens=8, seed=rid)
    core.schedule()
    columns = core.sampling_batch()
    gen = torch.Generator(device=device).manual_seed(0)
    times = []
    for step in range(steps + 2):
        logits = torch.randn((batch_size, vocab), generator=gen, device=device) * 3
        _sync(device)
        t0 = time.perf_counter()
        sample(logits, columns, vocab)  # ends with the ids on the host
        if step >= 2:
            times.append(time.perf_counter() - t0)
    return times


def vars_of(layer: Any) -> list[Any]:
    return [getattr(layer, name) for name in layer.__slots__ if getattr(layer, name) is not None]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "gpu",
        help="torch runner decode tokens/s against the memory-bandwidth limit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", choices=sorted(CONFIGS), default="1b")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "bfloat16", "float16", "float32"),
        help="auto: bf16 on CUDA, float32 on the CPU",
    )
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=512, help="tokens of context per request")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per batch size")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="memory bandwidth in GB/s (default: measured)")
    p.add_argument("--json", help="write the figures to this file")
    p.set_defaults(func=run)
