"""``ferrolm bench perplexity``: a model's perplexity on a text, computed the way
llama.cpp's ``llama-perplexity`` computes it, so the two can be compared on one GGUF file.

The text is tokenized once (with a BOS first where the model's tokenizer adds one) and cut
into chunks of ``--ctx`` tokens; each chunk runs as one prompt (its first token replaced
by BOS where the tokenizer adds one), and only the second half of each chunk is scored:
the negative log-likelihood of each token given everything before it in the chunk. The
result is ``exp(mean NLL)`` over all scored tokens, printed after each chunk as
``llama-perplexity`` prints its running estimate. ``--text`` defaults to CPython's
``LICENSE.txt`` (a fixed text every Python install has).

``--ubatch`` runs a chunk in forward steps of that many tokens (llama-perplexity's
``-ub``). On the quant runner a step of fewer than 32 tokens multiplies with activations
quantized to 8 bits per block, as llama.cpp's CPU backend does at every step size; a
larger step dequantizes the weights and multiplies in float32 (closer to the float model,
so its perplexity differs from llama.cpp's by the activation rounding). The KV cache is
float16 by default, llama.cpp's default; q8_0 is its ``-ctk q8_0 -ctv q8_0``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import load_model
from ferrolm.model.runner import ForwardBatch
from ferrolm.model.runner_choice import build_runner


def _default_text() -> Path:
    return Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "LICENSE.txt"


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each ``targets[i]`` under ``logits[i]`` (float64)."""
    rows = logits.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    return log_z - rows[np.arange(len(targets)), targets]


def run(args: argparse.Namespace) -> int:
    text_path = Path(args.text) if args.text else _default_text()
    text = text_path.read_text(encoding="utf-8")
    loaded = load_model(args.model, with_weights=args.runner != "quant")
    plain = loaded.tokenizer.encode(text, add_special_tokens=False)
    marked = loaded.tokenizer.encode(text, add_special_tokens=True)
    bos = int(marked[0]) if len(marked) > len(plain) else None
    tokens = marked if bos is not None else plain
    ctx = args.ctx
    chunks = len(tokens) // ctx if args.chunks <= 0 else min(args.chunks, len(tokens) // ctx)
    if chunks < 1:
        raise InvalidInputError(f"the text has {len(tokens)} tokens, fewer than one chunk of {ctx}", "ctx")
    if args.ubatch < 1:
        raise InvalidInputError(f"--ubatch must be positive, got {args.ubatch}", "ubatch")
    runner = build_runner(loaded, ctx, runner=args.runner, kv_cache_dtype=args.kv_cache_dtype)
    print(
        f"{text_path.name}: {len(tokens)} tokens, {chunks} chunks of {ctx}, runner {args.runner}, "
        f"steps of {min(args.ubatch, ctx)} tokens, KV {args.kv_cache_dtype}, bos {bos}"
    )
    total, count = 0.0, 0
    first = ctx // 2
    estimates = []
    for c in range(chunks):
        ids = [int(t) for t in tokens[c * ctx : (c + 1) * ctx]]
        if bos is not None:
            ids[0] = bos
        pieces = []
        for a in range(0, ctx, args.ubatch):
            b = min(a + args.ubatch, ctx)  # tokens a..b, over the chunk's slots 0..b
            step = ForwardBatch.from_requests([ids[a:b]], [list(range(b))])
            pieces.append(runner.forward(step, all_logits=True))
        logits = np.concatenate(pieces)
        # position j predicts token j + 1: score the second half of the chunk
        targets = np.asarray(tokens[c * ctx + first + 1 : (c + 1) * ctx])
        nll = chunk_nll(logits[first : ctx - 1], targets)
        total += float(nll.sum())
        count += len(nll)
        estimates.append(f"[{c + 1}]{math.exp(total / count):.4f}")
    print(",".join(estimates))
    print(f"PPL = {math.exp(total / count):.4f} over {count} tokens")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "perplexity",
        help="perplexity on a text, as llama.cpp's llama-perplexity computes it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="a GGUF file or model folder")
    p.add_argument("--text", default=None, help="a UTF-8 text file (default: CPython's LICENSE.txt)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama-perplexity's -c)")
    p.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0: all)")
    p.add_argument("--runner", default="auto", help="auto, quant, numpy or torch")
    p.add_argument("--ubatch", type=int, default=512, help="tokens per forward step (llama-perplexity's -ub)")
    p.add_argument(
        "--kv-cache-dtype",
        default="float16",
        help="float16 (llama.cpp's default), float32, bfloat16 or q8_0 (llama.cpp's -ctk/-ctv q8_0)",
    )
    p.set_defaults(func=run)
