"""The ``ferrolm`` command."""

from __future__ import annotations

import argparse
import importlib
import sys

from ferrolm.errors import FerrolmError

# ``ferrolm bench NAME``: the module ferrolm.bench.NAME, imported only for ``ferrolm bench``
# (``ferrolm serve`` loads none of them, nor what they import)
BENCHES = (
    "tree",
    "engine",
    "serve",
    "constraint",
    "gpu",
    "attention",
    "tools",
    "route",
    "kv_events",
    "quant",
    "perplexity",
    "spec",
    "lora",
)


def _generate(args: argparse.Namespace) -> int:
    from ferrolm.sampling_params import SamplingParams
    from ferrolm.server.args import ServerArgs, build_engine

    # the flags generate shares with serve, mapped onto the engine as serve maps them
    engine = build_engine(
        ServerArgs(**{name: getattr(args, name) for name in ServerArgs.__dataclass_fields__ if hasattr(args, name)})
    )
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop or [],
        ignore_eos=args.ignore_eos,
    )
    for prompt in args.prompt:
        if args.chat:
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        if args.stream:
            print(prompt, end="", flush=True)
            finish = None
            for d in engine.stream(prompt, params, lora=args.lora):
                print(d.text, end="", flush=True)
                finish = d.finish_reason
            print(f"\n[{finish}]")
        else:
            [r] = engine.generate(prompt, params, lora=args.lora)
            print(f"{prompt}{r.text}\n[{r.finish_reason}, {len(r.token_ids)} tokens]")
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    from ferrolm.server.args import add_runner_arguments

    p = sub.add_parser("generate", help="generate text offline")
    p.add_argument("--model", default="tiny", help="'tiny' (embedded), a Hugging Face model folder or a .gguf file")
    p.add_argument("--prompt", action="append", required=True, help="may be given several times")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--stream", action="store_true")
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) to load, as name=path",
    )
    p.add_argument("--lora", default=None, metavar="NAME", help="run the prompts with this loaded LoRA adapter")
    p.add_argument("--blas-threads", type=int, default=None, help="cap numpy's BLAS threads (default: half the cores)")
    p.add_argument(
        "--record-trace",
        metavar="PATH",
        default=None,
        help="record the engine's calls in PATH, to replay with 'ferrolm replay PATH'",
    )
    add_runner_arguments(p)
    p.set_defaults(func=_generate)


def _replay(args: argparse.Namespace) -> int:
    from ferrolm import _core

    overrides = {name: getattr(args, name) for name in REPLAY_OVERRIDES if getattr(args, name) is not None}
    if args.disable_radix_cache:
        overrides["enable_prefix_cache"] = False
    timing = {"step_ms": args.step_ms, "token_ms": args.token_ms} if args.by_time else {}
    try:
        summary = _core.replay_trace(
            args.trace,
            by_time=args.by_time,
            check_every=args.check_every,
            verbose=not args.quiet,
            **timing,
            **overrides,
        )
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in summary["lines"] + summary["report"]:
        print(line)
    if not summary["ok"]:
        return 1
    if args.expect_same and not summary["same"]:
        print("the replay differs from the recording (--expect-same)", file=sys.stderr)
        return 3
    return 0


REPLAY_OVERRIDES = (
    "kv_capacity",
    "max_running_requests",
    "max_prefill_tokens",
    "schedule_policy",
    "eviction_policy",
    "new_token_ratio",
)


def _add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay an engine trace (--record-trace) without the model and check the KV pool",
        description="Replays a trace through the Rust core, the recorded tokens standing in for the "
        "model: prints each step's decisions and a summary; exit status 1 if a KV check "
        "failed, 3 with --expect-same if the replay differs from the recording. The same "
        "as the ferrolm-replay binary.",
    )
    p.add_argument("trace")
    p.add_argument("-q", "--quiet", action="store_true", help="the summary only, not a line per step")
    p.add_argument(
        "--by-time",
        action="store_true",
        help="requests arrive at their recorded times on a virtual clock (default: in recorded step order)",
    )
    p.add_argument(
        "--step-ms", type=float, default=None, help="--by-time: each step's cost (default: the recording's mean)"
    )
    p.add_argument("--token-ms", type=float, default=0.0, help="--by-time: added per token in the step")
    p.add_argument("--check-every", type=int, default=1, help="check the KV pool every N steps (0: at the end)")
    p.add_argument("--expect-same", action="store_true", help="exit 3 if any step or finish differs from the recording")
    p.add_argument("--kv-capacity", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-prefill-tokens", "--chunked-prefill-size", dest="max_prefill_tokens", type=int, default=None)
    p.add_argument("--schedule-policy", default=None)
    p.add_argument("--eviction-policy", default=None)
    p.add_argument("--new-token-ratio", type=float, default=None)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.set_defaults(func=_replay)


def _serve(args: argparse.Namespace) -> int:
    from ferrolm.server.args import server_args_from

    settings = server_args_from(args)
    from ferrolm.server.rust_frontend import run_server

    return run_server(settings)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from ferrolm.server.args import add_serve_arguments

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-compatible and native API)")
    add_serve_arguments(p)
    p.set_defaults(func=_serve)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ferrolm", description="ferrolm: an LLM serving runtime whose hot paths run in Rust"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    if (sys.argv[1:] if argv is None else argv)[:1] == ["bench"]:
        for name in BENCHES:
            importlib.import_module(f"ferrolm.bench.{name}").add_parser(bench_sub)
    _add_generate(sub)
    _add_serve(sub)
    _add_replay(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FerrolmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
