"""Writes a synthetic engine trace for stress runs of ``ferrolm-replay``: many multi-turn
chats over a few shared system prompts, arriving in bursts, each producing random tokens
up to ``max_new_tokens``. No model is involved: the trace holds only submits and the
tokens each request is to produce, so the replay schedules everything itself.

    python scripts/synthetic_trace.py OUT [--requests 2000] [--kv-capacity 65536] [--seed 0]
    target/release/ferrolm-replay -q --check-every 0 OUT
"""

from __future__ import annotations

import argparse
import json
import random


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--kv-capacity", type=int, default=65536)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    vocab = 32000
    systems = [[rng.randrange(vocab) for _ in range(400)] for _ in range(4)]
    config = {
        "kv_capacity": args.kv_capacity,
        "max_running_requests": 64,
        "max_prefill_tokens": 2048,
        "vocab_size": vocab,
        "eos_token_ids": [vocab - 1],
        "max_context": 32768,
    }
    lines = [{"kind": "header", "format": "ferrolm-trace", "version": 1, "config": config}]
    outputs = []
    history: dict[int, list[int]] = {}
    for rid in range(args.requests):
        chat = rng.randrange(args.requests // 4 or 1)
        prompt = history.get(chat) or list(systems[chat % len(systems)])
        prompt = prompt + [rng.randrange(vocab - 1) for _ in range(rng.randint(20, 120))]
        tokens = [rng.randrange(vocab - 1) for _ in range(args.max_new_tokens)]
        history[chat] = (prompt + tokens)[-1500:] if len(prompt) < 1500 else list(systems[chat % len(systems)])
        params = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        lines.append({"kind": "submit", "step": 0, "t": rid * 0.002, "rids": [rid], "prompt": prompt, "params": params})
        outputs.append([rid, tokens, {"reason": "length", "cached_tokens": 0}])
    lines.append({"kind": "outputs", "step": 0, "t": args.requests * 0.002, "out": outputs})
    with open(args.out, "w") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
