"""``ferrolm bench route``: cache-aware routing over ferrolm replicas, against round robin.

Launches ``--replicas`` servers on loopback (``ferrolm serve --kv-events-config ...``),
follows each one's KV event stream (``ferrolm.kv_subscriber``) into one index
(``ferrolm.kv_index``: the blocks each replica holds, from the events alone) and sends the
same multi-turn chat workload twice, one request at a time: once round robin, once to the
replica with the longest cached prefix by the index (ties: the one that got fewest
requests). The caches are flushed between the two. Printed side by side: the prefix-cache
hit rate (cached prompt tokens the replicas reported over prompt tokens) and, for the
routed run, how often the index's prediction equalled the replica's report (whole blocks).

The workload is token ids (``/generate`` with ``input_ids``), seeded: a few shared system
prompts, conversations whose every turn resends the whole history plus a new user message,
turns of all conversations interleaved.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

TOKEN_RANGE = (100, 30_000)  # plain tokens of the tiny model's vocabulary (32k, specials above)


@dataclass
class Turn:
    conversation: int
    user: list[int]
    cache_salt: str | None = None


def multi_turn_workload(
    seed: int,
    conversations: int,
    turns: int,
    *,
    system_prompts: int = 3,
    system_len: int = 48,
    user_len: tuple[int, int] = (8, 24),
    salted: int = 0,
) -> tuple[list[list[int]], list[Turn]]:
    """Each conversation's opening (a shared system prompt) and the turns in send order
    (every conversation's turns in order, conversations interleaved at random). The last
    ``salted`` conversations carry a ``cache_salt`` of their own."""
    rng = random.Random(seed)
    lo, hi = TOKEN_RANGE
    systems = [[rng.randrange(lo, hi) for _ in range(system_len)] for _ in range(system_prompts)]
    openings = [list(systems[c % system_prompts]) for c in range(conversations)]
    pending = {c: turns for c in range(conversations)}
    order: list[Turn] = []
    while pending:
        c = rng.choice(sorted(pending))
        salt = f"tenant-{c}" if c >= conversations - salted else None
        order.append(Turn(c, [rng.randrange(lo, hi) for _ in range(rng.randint(*user_len))], salt))
        pending[c] -= 1
        if not pending[c]:
            del pending[c]
    return openings, order


@dataclass
class Replica:
    name: str
    url: str
    endpoint: str  # the PUB socket, as a subscriber connects to it
    replay_endpoint: str


@dataclass
class RunStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted_tokens: int = 0
    predictions_right: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    per_replica: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Fleet:
    """Replicas behind one index fed by their event streams."""

    def __init__(self, replicas: list[Replica], block_size: int, topic: str = "") -> None:
        import httpx

        from ferrolm.kv_index import KvIndex
        from ferrolm.kv_subscriber import KvEventSubscriber

        self.replicas = replicas
        self.index = KvIndex(block_size)
        self.http = httpx.Client(timeout=300)
        self.subscribers = {r.name: KvEventSubscriber(r.endpoint, r.replay_endpoint, topic) for r in replicas}
        self.removed_blocks = 0
        for r in replicas:
            self.index.add_replica(r.name)

    def queued_batches(self, replica: Replica) -> int:
        info = self.http.get(f"{replica.url}/server_info").json()["kv_events"]
        if info.get("dropped_batches"):
            raise RuntimeError(f"{replica.name} dropped {info['dropped_batches']} KV event batches")
        return int(info["queued_batches"])

    def sync(self, only: Replica | None = None) -> None:
        """Brings the index up to every batch the replicas have queued so far (a
        replica queues a step's events before it sends the step's outputs)."""
        for r in [only] if only else self.replicas:
            for _, events in self.subscribers[r.name].catch_up(self.queued_batches(r)):
                self.removed_blocks += sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockRemoved")
                self.index.apply(r.name, events)

    def send(
        self, replica: Replica, prompt: list[int], cache_salt: str | None, max_new_tokens: int
    ) -> tuple[list[int], int]:
        """One greedy request; its output ids and the cached prompt tokens it reports."""
        body: dict[str, Any] = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        r = self.http.post(f"{replica.url}/generate", json=body)
        r.raise_for_status()
        out = r.json()
        return out["output_ids"], int(out["meta_info"]["cached_tokens"])

    def flush(self) -> None:
        for r in self.replicas:
            self.http.post(f"{r.url}/flush_cache", json={}).raise_for_status()
        self.sync()

    def run(self, openings: list[list[int]], turns: list[Turn], policy: str, max_new_tokens: int) -> RunStats:
        """Sends the turns one at a time, ``policy`` ``routed`` or ``round_robin``;
        checks the index's prediction against each replica's report."""
        history = [list(o) for o in openings]
        stats = RunStats(per_replica={r.name: 0 for r in self.replicas})
        for i, turn in enumerate(turns):
            prompt = history[turn.conversation] + turn.user
            if policy == "round_robin":
                replica = self.replicas[i % len(self.replicas)]
            else:
                name = self.index.best_replica(
                    prompt, turn.cache_salt, load={k: float(v) for k, v in stats.per_replica.items()}
                )
                replica = next(r for r in self.replicas if r.name == name)
            predicted = self.index.predicted_cached_tokens(replica.name, prompt, turn.cache_salt)
            output, cached = self.send(replica, prompt, turn.cache_salt, max_new_tokens)
            self.sync(replica)
            block = self.index.block_size
            stats.requests += 1
            stats.per_replica[replica.name] += 1
            stats.prompt_tokens += len(prompt)
            stats.cached_tokens += cached
            stats.predicted_tokens += predicted
            if cached // block * block == predicted:
                stats.predictions_right += 1
            else:
                stats.mismatches.append(
                    {
                        "request": i,
                        "replica": replica.name,
                        "prompt_tokens": len(prompt),
                        "reported": cached,
                        "predicted": predicted,
                    }
                )
            history[turn.conversation] = prompt + output
        return stats

    def close(self) -> None:
        for s in self.subscribers.values():
            s.close()
        self.http.close()


def replica_flags(pub_port: int, replay_port: int, page_size: int, kv_tokens: int, topic: str = "") -> list[str]:
    """A replica's serve flags: KV events published on these ports (``topic`` "" is
    vLLM's default), its page size and pool."""
    # a wildcard address: by vLLM's rule the replica binds it (and subscribers connect)
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": topic,
    }
    return [
        "--kv-events-config",
        json.dumps(config),
        "--page-size",
        str(page_size),
        "--max-total-tokens",
        str(kv_tokens),
    ]


def run(args: argparse.Namespace) -> int:
    if args.router is not None:
        from ferrolm.bench import routers

        return routers.run(args)
    from ferrolm.bench.serve import LaunchedServer
    from ferrolm.server.testing import free_port

    openings, turns = multi_turn_workload(
        args.seed, args.conversations, args.turns, system_prompts=args.system_prompts, salted=args.salted
    )
    servers: list[LaunchedServer] = []
    fleet: Fleet | None = None
    try:
        replicas = []
        for i in range(args.replicas):
            pub, replay = free_port(), free_port()
            flags = replica_flags(pub, replay, args.page_size, args.kv_tokens, f"kv@replica-{i}@{args.model}")
            print(f"launching replica {i}: ferrolm serve --model {args.model} {' '.join(flags[2:])}", file=sys.stderr)
            servers.append(LaunchedServer(args.model, flags, None))
            replicas.append(
                Replica(f"replica-{i}", servers[-1].url, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
            )
        fleet = Fleet(replicas, args.page_size)
        results = {}
        for policy in ("round_robin", "routed"):
            fleet.flush()
            started = time.perf_counter()
            results[policy] = fleet.run(openings, turns, policy, args.max_new_tokens)
            results[policy].seconds = time.perf_counter() - started  # type: ignore[attr-defined]
        print(
            f"ferrolm bench route: {args.replicas} replicas of {args.model!r} ({args.kv_tokens} KV tokens each, "
            f"page {args.page_size}), {args.conversations} conversations x {args.turns} turns "
            f"({len(turns)} requests, one at a time), seed {args.seed}"
        )
        print(f"{'':28}{'round robin':>14}{'routed':>14}")
        rr, rt = results["round_robin"], results["routed"]
        print(f"{'prefix cache hit rate':28}{rr.hit_rate * 100:>13.1f}%{rt.hit_rate * 100:>13.1f}%")
        print(
            f"{'cached / prompt tokens':28}{f'{rr.cached_tokens}/{rr.prompt_tokens}':>14}"
            f"{f'{rt.cached_tokens}/{rt.prompt_tokens}':>14}"
        )
        print(
            f"{'predicted = reported':28}{f'{rr.predictions_right}/{rr.requests}':>14}"
            f"{f'{rt.predictions_right}/{rt.requests}':>14}"
        )
        print(
            f"{'requests per replica':28}{'/'.join(map(str, rr.per_replica.values())):>14}"
            f"{'/'.join(map(str, rt.per_replica.values())):>14}"
        )
        print(f"{'seconds':28}{rr.seconds:>14.1f}{rt.seconds:>14.1f}")  # type: ignore[attr-defined]
        print(f"routed / round robin hit rate: {rt.hit_rate / rr.hit_rate:.2f}x" if rr.hit_rate else "")
        print(f"blocks evicted meanwhile (BlockRemoved): {fleet.removed_blocks}")
        for m in (rr.mismatches + rt.mismatches)[:10]:
            print(f"  mismatch: {m}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        k: {
                            "hit_rate": v.hit_rate,
                            "prompt_tokens": v.prompt_tokens,
                            "cached_tokens": v.cached_tokens,
                            "predictions_right": v.predictions_right,
                            "requests": v.requests,
                            "per_replica": v.per_replica,
                            "mismatches": v.mismatches,
                        }
                        for k, v in results.items()
                    },
                    f,
                    indent=1,
                )
        return 1 if rr.mismatches or rt.mismatches else 0
    except BaseException:
        for s in servers:
            tail = s.log_tail()
            if tail:
                print(f"server log (tail):\n{tail}", file=sys.stderr)
        raise
    finally:
        if fleet is not None:
            fleet.close()
        for s in servers:
            s.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "route",
        help="cache-aware routing over replicas (KV events) vs round robin: hit rates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="tiny")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kv-tokens", type=int, default=1024, help="each replica's KV pool (--max-total-tokens)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=3)
    p.add_argument("--salted", type=int, default=0, help="conversations with a cache_salt of their own")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument(
        "--router",
        choices=("sglang", "vllm"),
        help="route a multi-turn chat workload through this router from PyPI instead (ferrolm.bench.routers)",
    )
    p.add_argument("--policy", help="with --router: this policy only (default: each of the router's)")
    p.add_argument("--concurrency", type=int, default=4, help="with --router: clients at a time")
    p.add_argument("--kill-after", type=int, help="with --router: SIGKILL one replica after this many requests")
    p.set_defaults(func=run)
