"""``ferrolm bench tools``: what the tool-call constraint buys, on one model in one run.

For ``tool_choice: "required"`` over many seeds, with the calls generated under the
functions' schemas and without (parser only), the share of answers whose call parses and
whose arguments are valid for the function's schema (checked with ``jsonschema`` when it
is installed, else only parsed), and the seconds each way; then answers of several calls
(``parallel_tool_calls``, structural tags): how many end complete, how many hold more than
one call, and how many calls are valid; then the streaming parser's
cost per delta on a Hermes output of several calls (the request core's parser, the
server's, through the binding). On the random ``tiny`` model the
unconstrained share shows what a parser alone gets from a model that does not follow the
format; on a real model, how often its calls break.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ferrolm.sampling_params import SamplingParams

PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather forecast for a city", "parameters": PARAMETERS},
    }
]
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris for the next three days?"}]


def _valid(arguments: str) -> bool | None:
    """Whether the arguments are valid for the schema; None without jsonschema."""
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(json.loads(arguments), PARAMETERS)
    except jsonschema.ValidationError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    from ferrolm.engine import Engine, default_blas_threads

    engine = Engine(args.model, blas_threads=default_blas_threads())
    print(f"model {args.model}, {args.seeds} seeds, tool_choice required, max_tokens {args.max_tokens}")
    for constrain in (True, False):
        parsed = valid = 0
        checked = True
        started = time.perf_counter()
        for seed in range(args.seeds):
            params = SamplingParams(max_new_tokens=args.max_tokens, temperature=1.0, seed=seed)
            [answer] = engine.chat(
                MESSAGES, params, tools=TOOLS, tool_choice="required", constrain_tool_calls=constrain
            )
            calls = [c for c in answer.tool_calls if c.name == "get_weather"]
            try:
                json.loads(calls[0].arguments)
            except (IndexError, ValueError):
                continue
            parsed += 1
            ok = _valid(calls[0].arguments)
            checked = checked and ok is not None
            valid += bool(ok)
        seconds = time.perf_counter() - started
        validity = f", {valid}/{args.seeds} valid for the schema" if checked else " (no jsonschema: not validated)"
        label = "constrained  " if constrain else "parser only  "
        print(f"{label}: {parsed}/{args.seeds} calls parse{validity}; {seconds:.1f} s")
    # several calls in one answer (parallel_tool_calls, the default): the calls are the
    # format's tags repeated, so every call is closed, whatever the count
    answers_done = several = calls_total = calls_valid = 0
    started = time.perf_counter()
    for seed in range(args.seeds):
        params = SamplingParams(max_new_tokens=args.max_tokens * 4, temperature=1.0, seed=seed)
        [answer] = engine.chat(MESSAGES, params, tools=TOOLS, tool_choice="required")
        answers_done += answer.finish_reason == "tool_calls"
        several += len(answer.tool_calls) > 1
        calls_total += len(answer.tool_calls)
        calls_valid += sum(bool(_valid(c.arguments)) for c in answer.tool_calls)
    seconds = time.perf_counter() - started
    print(
        f"several calls: {answers_done}/{args.seeds} answers complete, {several} with more than one call; "
        f"{calls_valid}/{calls_total} calls valid for the schema; {seconds:.1f} s"
    )
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris %d", "days": 3, "notes": "%s"}}\n</tool_call>\n'
    output = "Let me check.\n" + "".join(call % (i, "x y " * 40) for i in range(8))
    deltas = [output[i : i + 4] for i in range(0, len(output), 4)]  # ~ a token each
    repeats = 5 if args.quick else 50
    # auto: the output may be text, then calls, as this one is
    prepared = engine.chat_core.prepare(
        json.dumps({"messages": MESSAGES, "tools": TOOLS}), tool_call_parser="hermes", reasoning_parser="none"
    )
    started = time.perf_counter()
    for _ in range(repeats):
        parser = prepared.output_parser()
        for delta in deltas:
            parser.feed(delta)
        parser.finish()
    per_output = (time.perf_counter() - started) / repeats
    print(
        f"streaming parse (hermes, 8 calls): {len(output)} chars in {len(deltas)} deltas, "
        f"{per_output * 1e3:.2f} ms per output, {per_output / len(deltas) * 1e6:.1f} us per delta"
    )
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tools",
        help="tool calls with and without the constraint: how many parse and validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="tiny", help="'tiny' (embedded) or a Hugging Face model folder")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="a few seeds (a smoke test)")
    p.set_defaults(func=lambda args: run(_quick(args)))


def _quick(args: argparse.Namespace) -> argparse.Namespace:
    if args.quick:
        args.seeds = min(args.seeds, 4)
    return args
