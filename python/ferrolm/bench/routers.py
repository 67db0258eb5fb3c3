"""ferrolm replicas behind the routers that exist, unchanged: the SGLang Model Gateway
(PyPI ``sglang-router``, command ``smg``) and vllm-router (PyPI ``vllm-router``).

``ferrolm bench route --router sglang|vllm --policy P`` launches the replicas (each with
its KV event stream, page 16), the router in front of them, and sends a multi-turn chat
workload through the router (``--concurrency`` clients, each conversation's turns in
order, every turn resending the history); ``--kill-after K`` SIGKILLs one replica after
K requests. Printed: requests, failures (and during the kill), the prefix-cache hit rate
the replicas report (``ferrolm:cache_hit_tokens_total`` over ``ferrolm:prompt_tokens_total``
summed over them) and the requests each replica served. The integration test
(``tests/test_server_routers.py``) drives the same pieces.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferrolm.bench.serve import LoggedProcess

# the PyPI packages' commands
ROUTER_COMMANDS = {"sglang": "smg", "vllm": "vllm-router"}
POLICIES = {"sglang": ("round_robin", "cache_aware"), "vllm": ("round_robin", "cache_aware", "kv_aware")}

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud field light "
    "north south east west paper glass metal water fire earth winter summer spring autumn"
).split()


def find_router(kind: str) -> str | None:
    """The router's command: beside this interpreter (a virtualenv's ``bin``, where
    ``pip install ferrolm[test]`` puts it), else on ``PATH``."""
    name = ROUTER_COMMANDS[kind]
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


def chat_workload(
    seed: int, conversations: int, turns: int, system_prompts: int = 3, system_words: int = 120
) -> tuple[list[str], list[list[str]]]:
    """Each conversation's system prompt (one of a few shared ones) and its user turns."""
    rng = random.Random(seed)
    systems = [" ".join(rng.choice(WORDS) for _ in range(system_words)) for _ in range(system_prompts)]
    opening = [systems[c % system_prompts] for c in range(conversations)]
    users = [
        [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) for _ in range(turns)]
        for _ in range(conversations)
    ]
    return opening, users


@dataclass
class ChatStats:
    requests: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    failed_after_kill: int = 0
    seconds: float = 0.0


def run_chat(
    url: str,
    opening: list[str],
    users: list[list[str]],
    *,
    model: str = "tiny",
    max_tokens: int = 8,
    concurrency: int = 4,
    kill_after: int | None = None,
    kill: Any = None,
    timeout: float = 120.0,
) -> ChatStats:
    """Sends every conversation's turns in order through ``url`` (``concurrency``
    conversations at a time); the assistant's answer joins the history. After
    ``kill_after`` requests, calls ``kill()`` once."""
    import httpx

    stats = ChatStats()
    lock = threading.Lock()
    pending = list(range(len(opening)))
    killed = threading.Event()

    def conversation(c: int, client: httpx.Client) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": opening[c]}]
        for text in users[c]:
            messages.append({"role": "user", "content": text})
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
            answer = ""
            error = None
            try:
                r = client.post(f"{url}/v1/chat/completions", json=body)
                if r.status_code == 200:
                    answer = r.json()["choices"][0]["message"]["content"] or ""
                else:
                    error = f"{r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
            with lock:
                stats.requests += 1
                if error is not None:
                    stats.failed += 1
                    stats.failures.append(error)
                    if killed.is_set():
                        stats.failed_after_kill += 1
                fire = kill is not None and kill_after is not None and stats.requests == kill_after
            if fire:
                kill()
                killed.set()
            messages.append({"role": "assistant", "content": answer})

    def worker() -> None:
        with httpx.Client(timeout=timeout) as client:
            while True:
                with lock:
                    if not pending:
                        return
                    c = pending.pop(0)
                conversation(c, client)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats.seconds = time.perf_counter() - started
    return stats


def scrape(url: str) -> dict[str, float]:
    """The unlabelled ``ferrolm:`` series of a replica's /metrics."""
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("ferrolm:") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def cache_totals(urls: list[str]) -> dict[str, tuple[float, float, float]]:
    """Per live replica: (prompt tokens, cached prompt tokens, finished requests)."""
    import httpx

    totals = {}
    for u in urls:
        try:
            m = scrape(u)
        except httpx.HTTPError:
            continue
        totals[u] = (
            m["ferrolm:prompt_tokens_total"],
            m["ferrolm:cache_hit_tokens_total"],
            m["ferrolm:num_requests_finished_total"],
        )
    return totals


class Router(LoggedProcess):
    """A router on a free loopback port in front of ``workers``; stopped on ``close``."""

    def __init__(
        self,
        kind: str,
        policy: str,
        workers: list[str],
        *,
        kv_events: dict[str, str] | None = None,
        block_size: int = 16,
        model: str = "tiny",
    ) -> None:
        command = find_router(kind)
        if command is None:
            raise FileNotFoundError(f"{ROUTER_COMMANDS[kind]} is not installed (pip install ferrolm[test])")
        # a port found free can be taken before the router binds it: then again, on others
        for attempt in range(3):
            try:
                self._launch(command, kind, policy, workers, kv_events, block_size, model)
                return
            except RuntimeError as e:
                if "in use" not in str(e) or attempt == 2:
                    raise

    def _launch(
        self,
        command: str,
        kind: str,
        policy: str,
        workers: list[str],
        kv_events: dict[str, str] | None,
        block_size: int,
        model: str,
    ) -> None:
        from ferrolm.server.testing import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        metrics_port = free_port()
        cmd = [command]
        if kind == "sglang":
            cmd += ["launch"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--policy", policy, "--worker-urls", *workers]
        cmd += ["--prometheus-port", str(metrics_port), "--log-level", "error"]
        # a dead replica is dropped fast, and a request that met it retried on another
        cmd += ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
        if kv_events:
            cmd += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
            for worker, endpoint in kv_events.items():
                cmd += ["--kv-event-source", f"{worker}={endpoint}"]
        log_fd, self.log_path = tempfile.mkstemp(prefix=f"ferrolm-router-{kind}-", suffix=".log")
        self.process = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True)
        os.close(log_fd)
        self.command = cmd
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float = 90.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                reason = "its port is in use" if "Address already in use" in tail else "it failed"
                raise RuntimeError(f"the router exited ({self.process.returncode}, {reason}):\n{tail}")
            try:
                r = httpx.get(f"{self.url}/v1/models", timeout=5)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the router did not come up:\n{self.log_tail()}")


def run(args: Any) -> int:
    from ferrolm.bench.route import replica_flags
    from ferrolm.bench.serve import LaunchedServer
    from ferrolm.server.testing import free_port

    kind = args.router
    if find_router(kind) is None:
        print(f"{ROUTER_COMMANDS[kind]} is not installed: pip install 'ferrolm[test]'", file=sys.stderr)
        return 2
    opening, users = chat_workload(args.seed, args.conversations, args.turns)
    policies = [args.policy] if args.policy else list(POLICIES[kind])
    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        servers: list[LaunchedServer] = []
        router = None
        try:
            endpoints = {}
            for _ in range(args.replicas):
                pub, replay = free_port(), free_port()
                servers.append(
                    LaunchedServer(args.model, replica_flags(pub, replay, args.page_size, args.kv_tokens), None)
                )
                endpoints[servers[-1].url] = f"tcp://127.0.0.1:{pub}"
            urls = [s.url for s in servers]
            router = Router(
                kind,
                policy,
                urls,
                kv_events=endpoints if policy == "kv_aware" else None,
                block_size=args.page_size,
                model=args.model,
            )
            victim = servers[-1]

            def kill() -> None:
                os.killpg(victim.process.pid, signal.SIGKILL)

            stats = run_chat(
                router.url,
                opening,
                users,
                model=args.model,
                max_tokens=args.max_new_tokens,
                concurrency=args.concurrency,
                kill_after=args.kill_after,
                kill=kill if args.kill_after else None,
            )
            totals = cache_totals(urls)
            prompt = sum(t[0] for t in totals.values())
            cached = sum(t[1] for t in totals.values())
            results[policy] = {
                "requests": stats.requests,
                "failed": stats.failed,
                "failed_after_kill": stats.failed_after_kill,
                "hit_rate": cached / prompt if prompt else 0.0,
                "per_replica": [int(totals[u][2]) if u in totals else None for u in urls],
                "seconds": stats.seconds,
                "failures": stats.failures[:5],
            }
            r = results[policy]
            served = "/".join("killed" if n is None else str(n) for n in r["per_replica"])
            print(
                f"{kind} {policy:12} requests {r['requests']:4}  failed {r['failed']:3} "
                f"(after the kill {r['failed_after_kill']})  prefix hit rate {r['hit_rate'] * 100:5.1f}%  "
                f"served {served}  {r['seconds']:.1f} s",
                flush=True,
            )
            for f in r["failures"]:
                print(f"  failure: {f}", flush=True)
        finally:
            if router is not None:
                router.close()
            for s in servers:
                s.close()
    print(
        f"({args.replicas} replicas of {args.model!r}, {args.conversations} conversations x {args.turns} turns, "
        f"{args.concurrency} clients, page {args.page_size}, {args.kv_tokens} KV tokens each, seed {args.seed}"
        + (f", one replica SIGKILLed after {args.kill_after} requests)" if args.kill_after else ")")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
