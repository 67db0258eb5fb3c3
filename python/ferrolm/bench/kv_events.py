"""``ferrolm bench kv-events``: what publishing KV events costs the engine's step.

Launches two ``ferrolm serve`` (the forward timed, as ``ferrolm bench serve --launch``
does): one without events, one with ``--kv-events-config`` and a subscriber draining its
stream, as a router would. Then runs ``ferrolm bench serve``'s workload (multi-turn chats
over shared system prompts, so the cache stores and evicts all the time) against each,
``--rounds`` times, alternating which goes first. Per run, from the server's own counters:
engine steps, the engine process's CPU time per step (the publisher thread included) and
wall time per step. Printed side by side with the ratio on/off of the medians; the floor
is on/off <= 1.02.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
from typing import Any


def _drain(endpoint: str, stop: threading.Event, counts: dict[str, int]) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        while not stop.is_set():
            if sub.poll(100):
                sub.recv_multipart()
                counts["batches"] += 1
    finally:
        sub.close(linger=0)
        ctx.term()


def _one_run(server: Any, requests: list[Any], args: argparse.Namespace) -> dict[str, float]:
    from ferrolm.bench.serve import _flush_cache, _server_get, run_load

    _flush_cache(server.url, None)
    before, cpu_before = _server_get(server.url, "/server_info", None)["load"], server.cpu()
    results, duration = asyncio.run(run_load(
        server.url, args.model, requests, request_rate=None, concurrency=args.concurrency, api_key=None,
        seed=args.seed, ignore_eos=True, temperature=0.0, timeout=600, progress=False))
    after, cpu_after = _server_get(server.url, "/server_info", None)["load"], server.cpu()
    if not all(r.ok for r in results):
        raise RuntimeError(f"{sum(not r.ok for r in results)} requests failed")
    steps = after["steps"] - before["steps"]
    return {
        "steps": steps,
        "engine_cpu_ms_per_step": (cpu_after["engine_cpu_s"] - cpu_before["engine_cpu_s"]) * 1e3 / steps,
        "wall_ms_per_step": duration * 1e3 / steps,
        "forward_ms_per_step": (cpu_after["forward_wall_s"] - cpu_before["forward_wall_s"]) * 1e3 / steps,
        "batches": after.get("kv_events_queued", 0) - before.get("kv_events_queued", 0),
        "cached_tokens": sum(r.cached_tokens for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
    }


def run(args: argparse.Namespace) -> int:
    from ferrolm.bench.serve import LaunchedServer, make_requests
    from ferrolm.server.testing import free_port

    requests = make_requests(args.num_requests, seed=args.seed, output_lens=(16, 32, 64),
                             output_weights=(0.5, 0.35, 0.15))
    pub, replay = free_port(), free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}",
              "topic": "kv-events"}
    common = ["--max-total-tokens", str(args.kv_tokens), "--page-size", str(args.page_size)]
    servers: dict[str, LaunchedServer] = {}
    stop = threading.Event()
    counts = {"batches": 0}
    drain = threading.Thread(target=_drain, args=(f"tcp://127.0.0.1:{pub}", stop, counts), daemon=True)
    try:
        print(f"launching two servers of {args.model!r}: events off, and on ({json.dumps(config)})", file=sys.stderr)
        servers["off"] = LaunchedServer(args.model, common, None)
        servers["on"] = LaunchedServer(args.model, [*common, "--kv-events-config", json.dumps(config)], None)
        drain.start()
        runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for name in order:
                runs[name].append(_one_run(servers[name], requests, args))
                print(f"round {r + 1} {name:>3}: {runs[name][-1]}", file=sys.stderr)
        print(f"ferrolm bench kv-events: {args.num_requests} chat requests at concurrency {args.concurrency}, "
              f"{args.rounds} rounds each, KV pool {args.kv_tokens} tokens, page {args.page_size}, seed {args.seed}")
        print(f"{'median per run':32}{'events off':>12}{'events on':>12}{'on/off':>9}")
        ratios = {}
        for key, label in (("engine_cpu_ms_per_step", "engine CPU ms / step"), ("wall_ms_per_step", "wall ms / step"),
                           ("forward_ms_per_step", "forward ms / step")):
            off = statistics.median(x[key] for x in runs["off"])
            on = statistics.median(x[key] for x in runs["on"])
            ratios[key] = on / off
            print(f"{label:32}{off:>12.3f}{on:>12.3f}{on / off:>9.3f}")
        steps = [statistics.median(x["steps"] for x in runs[n]) for n in ("off", "on")]
        print(f"{'steps':32}{steps[0]:>12.0f}{steps[1]:>12.0f}")
        batches = statistics.median(x["batches"] for x in runs["on"])
        hit = [sum(x["cached_tokens"] for x in runs[n]) / max(1, sum(x["prompt_tokens"] for x in runs[n]))
               for n in ("off", "on")]
        print(f"{'prefix cache hit rate':32}{hit[0] * 100:>11.1f}%{hit[1] * 100:>11.1f}%")
        print(f"event batches per run (median): {batches:.0f}; received by the subscriber: {counts['batches']}")
        verdict = "within" if ratios["wall_ms_per_step"] <= 1.02 else "OVER"
        print(f"step time with events on: {ratios['wall_ms_per_step']:.3f}x off ({verdict} the 2% floor)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runs": runs, "ratios": ratios}, f, indent=1)
        return 0
    except BaseException:
        for s in servers.values():
            tail = s.log_tail()
            if tail:
                print(f"server log (tail):\n{tail}", file=sys.stderr)
        raise
    finally:
        stop.set()
        for s in servers.values():
            s.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("kv-events", help="engine step time with KV events published vs off",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kv-tokens", type=int, default=4096, help="each server's KV pool (small: eviction runs)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every run's figures to this file")
    p.set_defaults(func=run)
