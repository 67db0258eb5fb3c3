"""``ferrolm bench kv-events``: what publishing KV events costs the engine's step.

First in this process, where the machine's noise is smallest: two engines stepped as the
server's step loop steps them (``_Loop``: each step's events taken from the core and queued
as one batch, the earlier batches waited for), over the same model, one with events off,
one with them on and published (``KvEventPublisher`` on a loopback port, a subscriber
draining it), run the same multi-turn workload (token ids, a small KV pool so the cache
stores and evicts) turn by turn, ``--rounds`` times, alternating which goes first. Per
run: the loop's wall time per step, and on the events side the part of it the loop spent
on events (taking them from the core, queueing them, waiting for the earlier ones).

Then end to end: two ``ferrolm serve`` (started as ``ferrolm bench serve --launch`` starts
one): one without events, one with ``--kv-events-config`` and a subscriber draining its
stream, as a router would. Then runs ``ferrolm bench serve``'s workload (multi-turn chats
over shared system prompts, so the cache stores and evicts all the time) against each,
``--rounds`` times, alternating which goes first. Per run, from the server's own counters:
engine steps, the server process's CPU time per step (the publisher thread included) and
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
    results, duration = asyncio.run(
        run_load(
            server.url,
            args.model,
            requests,
            request_rate=None,
            concurrency=args.concurrency,
            api_key=None,
            seed=args.seed,
            ignore_eos=True,
            temperature=0.0,
            timeout=600,
            progress=False,
        )
    )
    after, cpu_after = _server_get(server.url, "/server_info", None)["load"], server.cpu()
    if not all(r.ok for r in results):
        raise RuntimeError(f"{sum(not r.ok for r in results)} requests failed")
    steps = after["steps"] - before["steps"]

    def spent(key: str) -> float:
        return (cpu_after[key] or 0.0) - (cpu_before[key] or 0.0)  # None: no forward yet

    return {
        "steps": steps,
        "engine_cpu_ms_per_step": spent("process_cpu_s") * 1e3 / steps,
        "wall_ms_per_step": duration * 1e3 / steps,
        "forward_ms_per_step": spent("forward_wall_s") * 1e3 / steps,
        "batches": after.get("kv_events_queued", 0) - before.get("kv_events_queued", 0),
        "cached_tokens": sum(r.cached_tokens for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
    }


class _Loop:
    """The server step loop's KV-event work around ``Engine.step`` (``StepLoop.step`` in
    ``ferrolm.server.rust_frontend``): before a step's outputs go out the earlier batches are
    on the socket, and the step's events are queued as one batch. Keeps each request's
    output tokens."""

    def __init__(self, engine: Any, kv_publisher: Any) -> None:
        self.engine = engine
        self.kv_publisher = kv_publisher
        self.tokens: dict[int, list[int]] = {}

    def step(self) -> None:
        deltas = self.engine.step()
        if self.kv_publisher is not None:
            self.kv_publisher.wait_earlier()
        self.publish_kv_events()
        for d in deltas:
            self.tokens.setdefault(d.rid, []).extend(d.token_ids)

    def publish_kv_events(self) -> None:
        """The cache's events since the last call, as one batch (none when empty)."""
        if self.kv_publisher is not None:
            self.kv_publisher.publish_from(self.engine.core)


def _loop_run(
    loop: _Loop, openings: list[list[int]], turns: int, users: list[list[list[int]]], max_new: int
) -> tuple[float, float, int]:
    """The workload through one loop, every conversation's turn t at once; returns the
    seconds spent in steps (wall, and the loop thread's CPU) and the steps."""
    import time

    from ferrolm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    history = [list(o) for o in openings]
    seconds, cpu, steps = 0.0, 0.0, 0
    for t in range(turns):
        rids = {}
        for c in range(len(history)):
            prompt = history[c] + users[c][t]
            rid = loop.engine.submit(prompt, params)
            rids[rid] = (c, prompt)
        while loop.engine.has_work():
            t0, c0 = time.perf_counter(), time.thread_time()
            loop.step()
            seconds += time.perf_counter() - t0
            cpu += time.thread_time() - c0
            steps += 1
        for r, (c, prompt) in rids.items():
            history[c] = prompt + loop.tokens.pop(r)
    return seconds, cpu, steps


def _in_process(args: argparse.Namespace) -> dict[str, Any]:
    import random
    import time

    from ferrolm.engine import Engine
    from ferrolm.kv_events_config import KvEventsConfig
    from ferrolm.kv_publisher import KvEventPublisher
    from ferrolm.model import load_model
    from ferrolm.server.testing import free_port

    model = load_model(args.model)
    rng = random.Random(args.seed)
    conversations, turns = args.concurrency, 4
    systems = [[rng.randrange(100, 30_000) for _ in range(96)] for _ in range(2)]
    openings = [list(systems[c % 2]) for c in range(conversations)]
    users = [
        [[rng.randrange(100, 30_000) for _ in range(rng.randint(16, 48))] for _ in range(turns)]
        for _ in range(conversations)
    ]
    port = free_port()
    publisher = KvEventPublisher(KvEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}"))
    stop, counts = threading.Event(), {"batches": 0}
    drain = threading.Thread(target=_drain, args=(f"tcp://127.0.0.1:{port}", stop, counts), daemon=True)
    drain.start()
    on_events = [0.0, 0.0]  # seconds taking and queueing events, seconds waiting for earlier ones

    def timed(f: Any, slot: int) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                on_events[slot] += time.perf_counter() - t0

        return wrapper

    # publish_kv_events takes the core's events and queues them; wait_handled is called
    # apart from it, in step: the two do not overlap
    publisher.wait_handled = timed(publisher.wait_handled, 1)  # type: ignore[method-assign]
    loops = {}
    for name in ("off", "on"):
        engine = Engine(
            model,
            kv_capacity=args.loop_kv_tokens,
            enable_kv_events=name == "on",
            kv_event_block_size=args.page_size,
            blas_threads=1,
        )
        loops[name] = _Loop(engine, publisher if name == "on" else None)
        loops[name].publish_kv_events = timed(loops[name].publish_kv_events, 0)  # type: ignore[method-assign]
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        for r in range(args.rounds + 1):  # the first round warms up, unmeasured
            for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                on_events[:] = [0.0, 0.0]
                busy = publisher.busy_s
                seconds, cpu, steps = _loop_run(loops[name], openings, turns, users, 16)
                loops[name].engine.core.flush_cache()
                loops[name].publish_kv_events()
                if r:
                    runs[name].append(
                        {
                            "ms_per_step": seconds * 1e3 / steps,
                            "steps": steps,
                            "loop_cpu_ms_per_step": cpu * 1e3 / steps,
                            "publisher_cpu_ms_per_step": (publisher.busy_s - busy) * 1e3 / steps,
                            "take_queue_ms_per_step": on_events[0] * 1e3 / steps,
                            "wait_ms_per_step": on_events[1] * 1e3 / steps,
                        }
                    )
    finally:
        stop.set()
        publisher.shutdown()
    return {"runs": runs, "batches_sent": publisher.sent, "batches_received": counts["batches"]}


def run(args: argparse.Namespace) -> int:
    from ferrolm.bench.serve import LaunchedServer, make_requests
    from ferrolm.server.testing import free_port

    loop = _in_process(args)
    print()
    print(
        f"ferrolm bench kv-events: the engine loop in process, {args.concurrency} conversations x 4 turns, "
        f"KV pool {args.loop_kv_tokens} tokens, page {args.page_size}, {args.rounds} rounds each"
    )
    off = statistics.median(x["ms_per_step"] for x in loop["runs"]["off"])
    on = statistics.median(x["ms_per_step"] for x in loop["runs"]["on"])
    take = statistics.median(x["take_queue_ms_per_step"] for x in loop["runs"]["on"])
    take_off = statistics.median(x["take_queue_ms_per_step"] for x in loop["runs"]["off"])
    wait = statistics.median(x["wait_ms_per_step"] for x in loop["runs"]["on"])
    spent = take + wait
    print(f"{'median per run':32}{'events off':>12}{'events on':>12}{'on/off':>9}")
    print(f"{'loop ms / step (wall)':32}{off:>12.3f}{on:>12.3f}{on / off:>9.3f}")
    cpu_off = statistics.median(x["loop_cpu_ms_per_step"] for x in loop["runs"]["off"])
    cpu_on = statistics.median(x["loop_cpu_ms_per_step"] for x in loop["runs"]["on"])
    pub_cpu = statistics.median(x["publisher_cpu_ms_per_step"] for x in loop["runs"]["on"])
    print(f"{'loop thread CPU ms / step':32}{cpu_off:>12.3f}{cpu_on:>12.3f}{cpu_on / cpu_off:>9.3f}")
    print(f"{'publisher thread CPU ms / step':32}{'':>12}{pub_cpu:>12.4f}{pub_cpu / on:>9.2%}")
    print(f"{'  taking + queueing events':32}{take_off:>12.4f}{take:>12.4f}{take / on:>9.2%}")
    print(f"{'  waiting for earlier batches':32}{'':>12}{wait:>12.4f}{wait / on:>9.2%}")
    print(
        f"{'steps':32}{statistics.median(x['steps'] for x in loop['runs']['off']):>12.0f}"
        f"{statistics.median(x['steps'] for x in loop['runs']['on']):>12.0f}"
    )
    print(f"batches sent {loop['batches_sent']}, received by the subscriber {loop['batches_received']}")
    verdict = "within" if on / off <= 1.02 else "OVER"
    print(
        f"loop step time with events on: {on / off:.3f}x off ({verdict} the 2% floor); the loop's own time on "
        f"events: {spent / on:.2%} of a step"
    )
    if args.no_server:
        return 0
    print()
    requests = make_requests(
        args.num_requests, seed=args.seed, output_lens=(16, 32, 64), output_weights=(0.5, 0.35, 0.15)
    )
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv-events",
    }
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
        print(
            f"ferrolm bench kv-events: {args.num_requests} chat requests at concurrency {args.concurrency}, "
            f"{args.rounds} rounds each, KV pool {args.kv_tokens} tokens, page {args.page_size}, seed {args.seed}"
        )
        print(f"{'median per run':32}{'events off':>12}{'events on':>12}{'on/off':>9}")
        ratios = {}
        for key, label in (
            ("engine_cpu_ms_per_step", "server CPU ms / step"),
            ("wall_ms_per_step", "wall ms / step"),
            ("forward_ms_per_step", "forward ms / step"),
        ):
            off = statistics.median(x[key] for x in runs["off"])
            on = statistics.median(x[key] for x in runs["on"])
            ratios[key] = on / off
            print(f"{label:32}{off:>12.3f}{on:>12.3f}{on / off:>9.3f}")
        steps = [statistics.median(x["steps"] for x in runs[n]) for n in ("off", "on")]
        print(f"{'steps':32}{steps[0]:>12.0f}{steps[1]:>12.0f}")
        batches = statistics.median(x["batches"] for x in runs["on"])
        hit = [
            sum(x["cached_tokens"] for x in runs[n]) / max(1, sum(x["prompt_tokens"] for x in runs[n]))
            for n in ("off", "on")
        ]
        print(f"{'prefix cache hit rate':32}{hit[0] * 100:>11.1f}%{hit[1] * 100:>11.1f}%")
        print(f"event batches per run (median): {batches:.0f}; received by the subscriber: {counts['batches']}")
        print(
            f"served step time with events on: {ratios['wall_ms_per_step']:.3f}x off (wall; two processes on a "
            "shared machine: their forward times differ by more than the events could)"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"in_process": loop, "served": runs, "ratios": ratios}, f, indent=1)
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
    p = sub.add_parser(
        "kv-events",
        help="engine step time with KV events published vs off",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="tiny")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kv-tokens", type=int, default=4096, help="each server's KV pool (small: eviction runs)")
    p.add_argument("--loop-kv-tokens", type=int, default=1024, help="the in-process engines' KV pool")
    p.add_argument("--no-server", action="store_true", help="only the in-process comparison")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every run's figures to this file")
    p.set_defaults(func=run)
