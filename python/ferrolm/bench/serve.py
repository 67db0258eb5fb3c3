"""``ferrolm bench serve``: a serving benchmark against a running OpenAI-compatible server
(``--base-url``: ours or any other), or against ``ferrolm serve`` started here on a free
loopback port (``--launch tiny``) and stopped after.

Requests are streaming chat completions (``stream_options.include_usage``) sent over
httpx (async), arriving as a Poisson process at ``--request-rate`` (``inf``: all at once)
or kept at a fixed ``--concurrency``. The workload is synthetic and seeded: a few shared
system prompts, multi-turn chats whose later turns repeat the earlier ones (so the prefix
cache matters), and a mix of short, normal and long outputs made exact with
``ignore_eos``.

Reported: TTFT (first content chunk), TPOT (time per output token after the first), ITL
(gaps between content chunks), end-to-end latency, request and token throughput, the
prefix cache hit rate (sum of ``usage.prompt_tokens_details.cached_tokens`` over the sum
of prompt tokens) and errors. ``--sweep`` runs several loads and plots TTFT and TPOT
against load (PNG, needs matplotlib); ``--json`` writes every figure.

With ``--launch`` the server's CPU time is read from /proc before and after each run: the
API process and the engine process separately, per generated token. The server does not
expose the forward's own time (neither ``/metrics`` nor ``/server_info``), so the bench
times it itself: the launched server runs as ``python -m ferrolm.bench.serve``, whose
import (repeated in the spawned engine process) wraps the model runner's ``forward`` with
a CPU clock and keeps the total in a small shared file. The overhead per token is then
API CPU + engine CPU - forward CPU, and the issue's floor is overhead < forward.

A Rust-front-end server is one process: its overhead is its HTTP threads' CPU plus the step
loop thread's CPU outside the forward calls, plus the CPU of the short-lived thread on which
the core samples a large step during ``commit`` (``_TimedCommits``), which /proc no longer
lists when the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import mmap
import os
import random
import shlex
import struct
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# ---- forward timing inside the launched server ------------------------------------------

_FORWARD_STATS_ENV = "FERROLM_BENCH_FORWARD_STATS"
# forward CPU seconds (the process's), forward wall seconds, forward calls, the CPU of the
# thread that called the forward during it (the step loop's own share of the forward), and,
# for a Rust-front-end server: the CPU of threads that started and ended inside the loop's
# commit calls (the core's sampling helper) and the step loop's CPU spent in this timing
_FORWARD_FMT = "<ddqddd"


def _thread_cpu_clock(tid: int) -> int:
    """The Linux CPU clock of thread ``tid`` of this process (CPUCLOCK_SCHED, per thread)."""
    return ((~tid) << 3) | 6


class _TimedCommits:
    """A Rust front end whose ``commit`` and ``commit_tokens`` also count the CPU of threads
    that end inside the call: the core samples a large step on a helper thread that lives
    only for that call, so no /proc reading after the run sees it (the Python front end's
    engine process total does count it). That CPU is the process's CPU during the call
    less what every thread alive around it spent (the loop thread's, the HTTP threads', and
    the BLAS threads'). The loop thread's CPU spent reading these clocks is kept apart so
    that it is not charged to the server."""

    def __init__(self, frontend: Any, totals: list[Any], publish: Any) -> None:
        self._frontend, self._totals, self._publish = frontend, totals, publish
        for name in ("drain", "wait", "fail_step", "take_outputs", "stop"):  # no wrapper on the hot path
            setattr(self, name, getattr(frontend, name))
        self._clocks: list[int] = []
        self._calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._frontend, name)

    def commit(self, core: Any, logits: Any) -> Any:
        return self._timed(self._frontend.commit, core, logits)

    def commit_tokens(self, core: Any, tokens: Any) -> Any:
        return self._timed(self._frontend.commit_tokens, core, tokens)

    def _others(self) -> list[float]:
        out = []
        for clock in self._clocks:
            try:
                out.append(time.clock_gettime(clock))
            except OSError:  # the thread ended
                out.append(float("nan"))
        return out

    def _timed(self, call: Any, *args: Any) -> Any:
        i0 = time.thread_time()
        if self._calls % 256 == 0:  # the long-lived threads: HTTP, tokenizer pool, BLAS
            me = threading.get_native_id()
            self._clocks = [_thread_cpu_clock(int(t)) for t in os.listdir("/proc/self/task") if int(t) != me]
        self._calls += 1
        # each clock read nests inside the previous one, so the loop thread and the
        # long-lived threads are read over a little more than the process: what is left
        # is the helper's CPU, never the loop's own clock reads
        o0 = self._others()
        ta = time.thread_time()
        p0 = time.process_time()
        tb = time.thread_time()
        try:
            return call(*args)
        finally:
            tc = time.thread_time()
            p1 = time.process_time()
            td = time.thread_time()
            o1 = self._others()
            others = sum(b - a for a, b in zip(o0, o1, strict=True) if not (math.isnan(a) or math.isnan(b)))
            self._totals[4] += max(0.0, (p1 - p0) - (td - ta) - others)
            te = time.thread_time()
            self._totals[5] += (te - i0) - (tc - tb)
            self._publish()
            self._totals[5] += time.thread_time() - te  # the write to the shared file: published next time


def _install_forward_timer(path: str) -> None:
    """Wraps the runners' forward calls (``NumpyRunner.forward``, ``TorchRunner.forward``
    and ``forward_greedy``) so that each call adds its process CPU time and wall time to
    the shared file at ``path`` (the engine process has no other busy thread, so its
    process CPU clock during the call is the forward's, BLAS and torch threads included);
    and the Rust front end's commits (``_TimedCommits``)."""
    from ferrolm.model.runner import NumpyRunner
    from ferrolm.model.torch_runner import TorchRunner
    from ferrolm.server import rust_frontend

    f = open(path, "r+b")  # noqa: SIM115 - lives as long as the process
    shared = mmap.mmap(f.fileno(), struct.calcsize(_FORWARD_FMT))
    totals: list[Any] = [0.0, 0.0, 0, 0.0, 0.0, 0.0]

    def publish() -> None:
        struct.pack_into(_FORWARD_FMT, shared, 0, *totals)

    def timed(original: Any) -> Any:
        def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            # the loop thread's clock outermost: this timing's own clock reads count as
            # the forward's, never as the server's overhead
            t0 = time.thread_time()
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                totals[0] += time.process_time() - c0
                totals[1] += time.perf_counter() - w0
                totals[2] += 1
                t1 = time.thread_time()
                totals[3] += t1 - t0
                publish()
                # the write to the shared file is this timing's too, not the server's
                # (published with the next call's figures)
                spent = time.thread_time() - t1
                totals[0] += spent
                totals[3] += spent

        return timed_forward

    NumpyRunner.forward = timed(NumpyRunner.forward)  # type: ignore[method-assign]
    TorchRunner.forward = timed(TorchRunner.forward)  # type: ignore[method-assign]
    TorchRunner.forward_greedy = timed(TorchRunner.forward_greedy)  # type: ignore[method-assign]

    loop_init = rust_frontend.StepLoop.__init__

    def timed_loop_init(self: Any, engine: Any, frontend: Any, kv_publisher: Any = None) -> None:
        loop_init(self, engine, _TimedCommits(frontend, totals, publish), kv_publisher)  # type: ignore[arg-type]

    rust_frontend.StepLoop.__init__ = timed_loop_init  # type: ignore[method-assign]


if os.environ.get(_FORWARD_STATS_ENV) and __name__ in ("__main__", "__mp_main__"):
    # only when this module runs the server (``python -m ferrolm.bench.serve``) or is
    # re-imported as the main module of its spawned engine process
    _install_forward_timer(os.environ[_FORWARD_STATS_ENV])


def _read_forward_stats(path: str | None) -> tuple[float, float, int, float, float, float] | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(struct.calcsize(_FORWARD_FMT))
        return struct.unpack(_FORWARD_FMT, data)  # type: ignore[return-value]
    except (OSError, struct.error):
        return None


# ---- the workload ------------------------------------------------------------------------

_WORDS = (
    "the of and to in is was for on that with as by at from it an be this are which or his "
    "has had have not but were they their one all been new more other time some what there "
    "when would who will can into only about after first two many also than people most over "
    "such these years made like them may state where year used between then system during "
    "world both three under city well known each part while later since being work school "
    "game number team through life against found same before early under local history area "
    "government family name group music water light market river paper model server token "
    "cache request stream engine memory network window garden winter summer morning evening"
).split()


@dataclass(frozen=True)
class BenchRequest:
    index: int
    messages: list[dict[str, str]]
    max_tokens: int
    conversation: int
    turn: int


def make_requests(n: int, *, seed: int, system_prompts: int = 4, system_words: tuple[int, int] = (150, 400),
                  turns: tuple[int, int] = (1, 4), user_words: tuple[int, int] = (10, 60),
                  reply_words: tuple[int, int] = (20, 80), output_lens: tuple[int, ...] = (16, 64, 256),
                  output_weights: tuple[float, ...] = (0.5, 0.35, 0.15)) -> list[BenchRequest]:
    """``n`` chat requests: conversations over a few shared system prompts (the first more
    popular), each turn repeating the conversation so far (earlier user messages and
    synthetic assistant replies) and adding a user message; conversations interleave, each
    turn after the one before. Output lengths come from ``output_lens`` by weight."""
    rng = random.Random(seed)

    def text(lo_hi: tuple[int, int]) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*lo_hi)))

    systems = [f"You are assistant number {i}. " + text(system_words) for i in range(system_prompts)]
    popularity = [1.0 / (i + 1) for i in range(system_prompts)]
    conversations: list[list[tuple[list[dict[str, str]], int]]] = []
    total = 0
    while total < n:
        history = [{"role": "system", "content": rng.choices(systems, popularity)[0]}]
        conv = []
        for _ in range(min(rng.randint(*turns), n - total)):
            messages = history + [{"role": "user", "content": text(user_words)}]
            conv.append((messages, rng.choices(output_lens, output_weights)[0]))
            history = messages + [{"role": "assistant", "content": text(reply_words)}]
            total += 1
        conversations.append(conv)
    out: list[BenchRequest] = []
    cursors = [0] * len(conversations)
    live = list(range(len(conversations)))
    while live:
        i = rng.randrange(len(live))
        c = live[i]
        messages, max_tokens = conversations[c][cursors[c]]
        out.append(BenchRequest(len(out), messages, max_tokens, c, cursors[c]))
        cursors[c] += 1
        if cursors[c] == len(conversations[c]):
            live[i] = live[-1]
            live.pop()
    return out


# ---- one request -------------------------------------------------------------------------


@dataclass
class RequestResult:
    index: int
    max_tokens: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0  # seconds since the run began
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


async def _send(client: Any, url: str, headers: dict[str, str], body: dict[str, Any], result: RequestResult,
                t0: float) -> None:
    import httpx

    start = time.perf_counter()
    result.start = start - t0
    last: float | None = None
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:300]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if last is None:
                            result.ttft = now - start
                        else:
                            result.itl.append(now - last)
                        last = now
                        result.chunks += 1
        result.e2e = time.perf_counter() - start
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        result.error = f"{type(e).__name__}: {e}"[:300] or type(e).__name__
        return
    if usage is None:
        result.error = "no usage in the stream (stream_options.include_usage ignored?)"
        return
    if result.ttft is None:
        result.error = "no content in the stream"
        return
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.completion_tokens = int(usage.get("completion_tokens") or 0)
    result.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    result.ok = True


class _Progress:
    """A plain-text progress bar on stderr, redrawn at most a few times a second."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled and total > 0
        self.done = self.errors = 0
        self.started = time.perf_counter()
        self.drawn = 0.0

    def update(self, ok: bool) -> None:
        self.done += 1
        self.errors += not ok
        now = time.perf_counter()
        if self.enabled and (now - self.drawn > 0.2 or self.done == self.total):
            self.drawn = now
            width = 30
            filled = width * self.done // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                             f" errors {self.errors}  {now - self.started:6.1f} s")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def run_load(base_url: str, model: str, requests: list[BenchRequest], *, request_rate: float | None,
                   concurrency: int | None, api_key: str | None, seed: int, ignore_eos: bool, temperature: float,
                   timeout: float, progress: bool = True, label: str = "") -> tuple[list[RequestResult], float]:
    """Sends ``requests``; returns their results and the run's duration (first send to last
    finish). With a rate, arrivals are Poisson (``inf``: all at once), capped at
    ``concurrency`` in flight when that is given too; without one, ``concurrency`` clients
    each send their next request when the last one finished."""
    import httpx

    url = f"{base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results = [RequestResult(r.index, r.max_tokens) for r in requests]
    bodies = []
    for r in requests:
        body: dict[str, Any] = {"model": model, "messages": r.messages, "max_tokens": r.max_tokens,
                                "temperature": temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if ignore_eos:
            body["ignore_eos"] = True
        bodies.append(body)
    bar = _Progress(len(requests), label, progress)
    width = concurrency or len(requests)
    limits = httpx.Limits(max_connections=width, max_keepalive_connections=width)
    rng = random.Random(seed)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout, connect=30.0)) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            await _send(client, url, headers, bodies[i], results[i], t0)
            bar.update(results[i].ok)

        if request_rate is not None and request_rate > 0:
            gate = asyncio.Semaphore(concurrency) if concurrency else None

            async def gated(i: int) -> None:
                if gate is None:
                    await one(i)
                else:
                    async with gate:
                        await one(i)

            tasks = []
            for i in range(len(requests)):
                tasks.append(asyncio.create_task(gated(i)))
                if math.isfinite(request_rate) and i + 1 < len(requests):
                    await asyncio.sleep(rng.expovariate(request_rate))
            await asyncio.gather(*tasks)
        else:
            queue = list(range(len(requests)))
            queue.reverse()

            async def worker() -> None:
                while queue:  # bounded: each pass takes one of the N requests
                    await one(queue.pop())

            await asyncio.gather(*(worker() for _ in range(min(width, len(requests)))))
        duration = time.perf_counter() - t0
    return results, duration


# ---- figures -----------------------------------------------------------------------------


def _dist(values: list[float]) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=np.float64) * 1e3  # ms
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def summarize(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    output = sum(r.completion_tokens for r in ok)
    first_errors: list[str] = []
    for r in errors:
        if r.error and r.error not in first_errors:
            first_errors.append(r.error)
        if len(first_errors) == 5:
            break
    return {
        "requests": len(results), "completed": len(ok), "errors": len(errors), "first_errors": first_errors,
        "length_mismatches": sum(1 for r in ok if r.completion_tokens != r.max_tokens),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": output / duration if duration > 0 else 0.0,
        "total_token_throughput": (prompt + output) / duration if duration > 0 else 0.0,
        "prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": output,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "ttft_ms": _dist([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _dist([t for r in ok if (t := r.tpot) is not None]),
        "itl_ms": _dist([g for r in ok for g in r.itl]),
        "e2e_ms": _dist([r.e2e for r in ok if r.e2e is not None]),
    }


# ---- the launched server and its CPU time ------------------------------------------------


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads: ``main`` (the step loop of a Rust-front-end
    server), ``http`` (its front end's threads: ``ferrolm-http``, the HTTP workers and the
    tokenizer pool, and ``ferrolm-grammar``, its grammar compiles, which the Python front
    end's engine process counts too) and ``other`` (BLAS and attention workers: part of
    the forward). Each thread's time in
    nanoseconds from its schedstat where the kernel keeps one: the clock ticks of its stat
    are 10 ms, which over a few HTTP threads is tens of microseconds per token of a run."""
    out = {"main": 0.0, "http": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            fields = raw.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
        front = name.startswith(("ferrolm-http", "ferrolm-grammar"))
        key = "main" if tid == str(pid) else "http" if front else "other"
        out[key] += cpu
    return out


def _engine_pid(api_pid: int) -> int | None:
    """The engine process: the API process's child that multiprocessing spawned (not its
    resource tracker)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != api_pid:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    return int(name)
        except (OSError, IndexError, ValueError):
            continue
    return None


class LaunchedServer:
    """``ferrolm serve --model MODEL`` on a free loopback port, run through this module so
    that its forward is timed (see the module docstring); stopped on ``close``."""

    def __init__(self, model: str, extra_flags: list[str], api_key: str | None, frontend: str = "python") -> None:
        from ferrolm.server.testing import RunningServer, _wait_healthy, free_port

        fd, self.forward_path = tempfile.mkstemp(prefix="ferrolm-bench-forward-")
        os.write(fd, bytes(struct.calcsize(_FORWARD_FMT)))
        os.close(fd)
        log_fd, self.log_path = tempfile.mkstemp(prefix="ferrolm-bench-server-", suffix=".log")
        port = free_port()
        cmd = [sys.executable, "-m", "ferrolm.bench.serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning", "--frontend", frontend, *extra_flags]
        if api_key:
            cmd += ["--api-key", api_key]
        env = {**os.environ, _FORWARD_STATS_ENV: self.forward_path}
        import subprocess

        self.process = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        os.close(log_fd)
        self.url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(RunningServer(self.url, self.process, api_key))
        except BaseException:
            self.close()
            raise
        self.frontend = frontend
        # the Rust front end runs the step loop in the server's own process
        self.engine_pid = _engine_pid(self.process.pid) if frontend == "python" else None

    def cpu(self) -> dict[str, Any]:
        forward = _read_forward_stats(self.forward_path)
        out = {"api_cpu_s": _proc_cpu_s(self.process.pid),
               "engine_cpu_s": _proc_cpu_s(self.engine_pid) if self.engine_pid else None,
               "forward_cpu_s": forward[0] if forward and forward[2] else None,
               "forward_wall_s": forward[1] if forward and forward[2] else None,
               "forward_calls": forward[2] if forward else None}
        if self.frontend == "rust":
            # one process: outside the forward is the HTTP threads' CPU plus the step
            # loop thread's CPU outside its forward calls (BLAS and attention workers count
            # as the forward)
            threads = _thread_cpu_s(self.process.pid)
            out["http_cpu_s"] = threads["http"]
            out["loop_cpu_s"] = threads["main"]
            out["loop_forward_cpu_s"] = forward[3] if forward else None
            out["commit_helper_cpu_s"] = forward[4] if forward else None
            out["timing_cpu_s"] = forward[5] if forward else None
        return out

    def log_tail(self, chars: int = 2000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        from ferrolm.server.testing import _stop

        _stop(self.process)
        for path in (self.forward_path, self.log_path):
            try:
                os.unlink(path)
            except OSError:
                pass


def cpu_per_token(before: dict[str, Any], after: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The server's CPU per generated token (µs) between two ``LaunchedServer.cpu`` readings."""
    def delta(key: str) -> float | None:
        a, b = before.get(key), after.get(key)
        return None if a is None or b is None else b - a

    out: dict[str, Any] = {"generated_tokens": tokens}
    if "http_cpu_s" in after:  # the Rust front end: one process
        http, loop, loop_forward = delta("http_cpu_s"), delta("loop_cpu_s"), delta("loop_forward_cpu_s")
        helper, timing = delta("commit_helper_cpu_s") or 0.0, delta("timing_cpu_s") or 0.0
        if http is not None and loop is not None and loop_forward is not None and tokens:
            # the loop thread outside its forward calls, less the bench's own clock reads
            # there, plus the commits' short-lived sampling thread
            loop_outside = loop - loop_forward - timing + helper
            out["frontend_cpu_us_per_token"] = http / tokens * 1e6
            out["loop_outside_forward_us_per_token"] = loop_outside / tokens * 1e6
            out["commit_helper_us_per_token"] = helper / tokens * 1e6
            out["split_overhead_us_per_token"] = (http + loop_outside) / tokens * 1e6
    for key in ("api_cpu_s", "engine_cpu_s", "forward_cpu_s", "forward_wall_s"):
        d = delta(key)
        out[key] = d
        out[key.replace("_s", "_us_per_token")] = d / tokens * 1e6 if d is not None and tokens else None
    calls = delta("forward_calls")
    out["forward_calls"] = calls
    api, engine, forward = out["api_cpu_us_per_token"], out["engine_cpu_us_per_token"], out["forward_cpu_us_per_token"]
    if "split_overhead_us_per_token" in out:
        out["overhead_us_per_token"] = out["split_overhead_us_per_token"]
        out["floor_met"] = forward is not None and out["overhead_us_per_token"] < forward
    elif api is not None and engine is not None and forward is not None:
        out["overhead_us_per_token"] = api + engine - forward
        out["floor_met"] = out["overhead_us_per_token"] < forward
    else:
        out["overhead_us_per_token"] = None
        out["floor_met"] = None
    return out


# ---- the command -------------------------------------------------------------------------


def _server_get(base_url: str, path: str, api_key: str | None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base_url}{path}", headers=headers, timeout=30)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _flush_cache(base_url: str, api_key: str | None) -> bool:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for _ in range(50):  # bounded: the server refuses while requests still finish
        try:
            r = httpx.post(f"{base_url}/flush_cache", json={}, headers=headers, timeout=30)
        except httpx.HTTPError:
            return False
        if r.status_code == 200:
            return True
        if r.status_code != 400:
            return False
        time.sleep(0.1)
    return False


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _print_point(load_label: str, s: dict[str, Any]) -> None:
    print(f"  {load_label}: {s['completed']}/{s['requests']} requests in {s['duration_s']:.1f} s, "
          f"{s['errors']} errors")
    print(f"  {'(ms)':<8}{'mean':>9}{'P50':>9}{'P90':>9}{'P99':>9}{'max':>9}")
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")):
        d = s[key]
        print(f"  {name:<8}" + "".join(f"{_fmt(d[q]):>9}" for q in ("mean", "p50", "p90", "p99", "max")))
    print(f"  throughput: {s['request_throughput']:.2f} req/s, {s['output_throughput']:.0f} output tok/s, "
          f"{s['total_token_throughput']:.0f} total tok/s")
    print(f"  prompt tokens {s['prompt_tokens']}, cached {s['cached_tokens']}: cache hit rate "
          f"{s['cache_hit_rate'] * 100:.1f}%; output tokens {s['output_tokens']}"
          + (f" ({s['length_mismatches']} requests not at their max_tokens)" if s["length_mismatches"] else ""))
    for e in s["first_errors"]:
        print(f"  error: {e}")
    cpu = s.get("server_cpu")
    if cpu:
        print(f"  server CPU per generated token ({cpu['generated_tokens']} tokens): "
              f"API process {_fmt(cpu['api_cpu_us_per_token'])} us, engine process "
              f"{_fmt(cpu['engine_cpu_us_per_token'])} us")
        if cpu["forward_cpu_us_per_token"] is None:
            print("  forward time: not exposed by the server (no /metrics or /server_info figure) and not "
                  "measured here; overhead excluding the forward unknown")
        else:
            verdict = "met" if cpu["floor_met"] else "MISSED"
            print(f"  forward (timed in the engine process by this bench; the server does not expose it): "
                  f"{_fmt(cpu['forward_cpu_us_per_token'])} us CPU per token over {cpu['forward_calls']} calls")
            print(f"  overhead excluding the forward (API + engine - forward): "
                  f"{_fmt(cpu['overhead_us_per_token'])} us per token; floor (overhead < forward): {verdict}")
    if s.get("mean_batch") is not None:
        print(f"  engine: {s['engine_steps']} steps, {s['mean_batch']:.1f} generated tokens per step")


def _plot(points: list[dict[str, Any]], by: str, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    loads = [float(p["load"]) for p in points]
    labels = [f"{x:g}" for x in loads]
    finite = all(math.isfinite(x) for x in loads)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        pos: list[float] = loads if finite else [float(i) for i in range(len(points))]
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(pos, [p["summary"][key][q] for p in points], style, label=f"{title} P{q[1:]}")
        if not finite:
            ax.set_xticks(pos, labels)
        elif len(loads) > 1 and max(loads) / max(min(loads), 1e-9) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(pos, labels)
        ax.set_xlabel("concurrency (clients)" if by == "concurrency" else "request rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_title(f"{title} against load")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _parse_rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 or inf, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.num_requests < 1:
        print("error: --num-requests must be at least 1", file=sys.stderr)
        return 2
    if (args.base_url is None) == (args.launch is None):
        print("error: give either --base-url or --launch", file=sys.stderr)
        return 2
    sweep_by = args.sweep_by or ("rate" if args.request_rate is not None else "concurrency")
    if args.sweep:
        loads = [float(x) for x in args.sweep.split(",") if x.strip()]
        if sweep_by == "concurrency":
            loads = [int(x) for x in loads]
    elif args.request_rate is not None:
        loads = [args.request_rate]
    else:
        loads = [args.concurrency or 1]
    if not loads or any(not x > 0 for x in loads):
        print("error: loads must be > 0", file=sys.stderr)
        return 2
    output_lens = tuple(int(x) for x in args.output_lens.split(","))
    output_weights = tuple(float(x) for x in args.output_weights.split(","))
    if len(output_lens) != len(output_weights):
        print("error: --output-lens and --output-weights differ in length", file=sys.stderr)
        return 2
    requests = make_requests(args.num_requests, seed=args.seed, system_prompts=args.system_prompts,
                             output_lens=output_lens, output_weights=output_weights)
    frontends = [f.strip() for f in (args.frontend or "rust").split(",") if f.strip()]
    if not frontends or any(f not in ("python", "rust") for f in frontends):
        print("error: --frontend takes python, rust or both (python,rust)", file=sys.stderr)
        return 2
    if args.base_url is not None and args.frontend is not None:
        print("error: --frontend is for --launch (a server started here)", file=sys.stderr)
        return 2
    all_points: list[dict[str, Any]] = []
    for frontend in frontends if args.launch else ["python"]:
        points = _run_on(args, frontend, loads, sweep_by, requests, output_lens, output_weights)
        all_points += points
    if len(frontends) > 1 and args.launch:
        _print_frontend_table(all_points)
    failed = any(p["summary"]["errors"] for p in all_points)
    return 1 if failed and args.strict else 0


IDLE_MEASURE_S = 2.0  # how long the launched server's idle CPU is measured


def _idle_cpu_percent(server: LaunchedServer) -> float | None:
    """The server's CPU (every process of it) over a quiet moment, in % of one core."""
    def total() -> float | None:
        c = server.cpu()
        if c["api_cpu_s"] is None:
            return None
        return c["api_cpu_s"] + (c["engine_cpu_s"] or 0.0)

    time.sleep(0.5)  # let the warmup's last writes settle
    a, t0 = total(), time.perf_counter()
    time.sleep(IDLE_MEASURE_S)
    b, t1 = total(), time.perf_counter()
    return None if a is None or b is None else (b - a) / (t1 - t0) * 100


def _run_on(args: argparse.Namespace, frontend: str, loads: list[Any], sweep_by: str,
            requests: list[BenchRequest], output_lens: tuple[int, ...],
            output_weights: tuple[float, ...]) -> list[dict[str, Any]]:
    server: LaunchedServer | None = None
    points: list[dict[str, Any]] = []
    if args.launch:
        extra = shlex.split(args.server_args or "")
        if sweep_by == "concurrency" and not any(f.startswith("--max-running-requests") for f in extra):
            extra += ["--max-running-requests", str(max(64, int(max(loads))))]
        print(f"launching ferrolm serve --model {args.launch} --frontend {frontend} {' '.join(extra)}",
              file=sys.stderr)
        server = LaunchedServer(args.launch, extra, args.api_key, frontend)
        base_url = server.url
    else:
        base_url = args.base_url.rstrip("/")
        if base_url.endswith("/v1"):
            base_url = base_url[:-3]
    try:
        model = args.model
        if model is None:
            listing = _server_get(base_url, "/v1/models", args.api_key)
            model = listing["data"][0]["id"] if listing and listing.get("data") else (args.launch or "tiny")
        info = _server_get(base_url, "/server_info", args.api_key)
        metrics_text = None
        try:
            import httpx

            r = httpx.get(f"{base_url}/metrics", timeout=30)
            metrics_text = r.text if r.status_code == 200 else None
        except Exception:  # noqa: BLE001 - optional
            pass
        forward_exposed = bool(metrics_text and "forward" in metrics_text) or "forward" in json.dumps(info or {})
        which = f" ({frontend} front end)" if server else ""
        print(f"ferrolm bench serve: {len(requests)} requests to {base_url}{which} (model {model!r}); "
              f"outputs {'/'.join(map(str, output_lens))} tokens; seed {args.seed}")
        idle = None
        for load in loads:
            if args.warmup:
                warm = make_requests(args.warmup, seed=args.seed + 10_000, output_lens=(8,), output_weights=(1.0,))
                asyncio.run(run_load(base_url, model, warm, request_rate=math.inf, concurrency=None,
                                     api_key=args.api_key, seed=args.seed, ignore_eos=not args.no_ignore_eos,
                                     temperature=args.temperature, timeout=args.timeout, progress=False))
            if server is not None and idle is None:
                idle = _idle_cpu_percent(server)
                print(f"  idle server CPU: {_fmt(idle, 2)}% of a core (over {IDLE_MEASURE_S:g} s)")
            flushed = _flush_cache(base_url, args.api_key) if not args.no_flush else False
            if sweep_by == "rate":
                rate, conc = load, args.concurrency
                label = f"rate {load:g} req/s" + (f", at most {conc} in flight" if conc else "")
            else:
                rate, conc = None, int(load)
                label = f"concurrency {int(load)}"
            load_before = (_server_get(base_url, "/server_info", args.api_key) or {}).get("load")
            cpu_before = server.cpu() if server else None
            results, duration = asyncio.run(run_load(
                base_url, model, requests, request_rate=rate, concurrency=conc, api_key=args.api_key,
                seed=args.seed, ignore_eos=not args.no_ignore_eos, temperature=args.temperature,
                timeout=args.timeout, progress=not args.no_progress, label=label))
            cpu_after = server.cpu() if server else None
            load_after = (_server_get(base_url, "/server_info", args.api_key) or {}).get("load")
            summary = summarize(results, duration)
            summary["cache_flushed_before"] = flushed
            generated = summary["output_tokens"]
            if load_before and load_after and "generation_tokens" in load_after:
                generated = load_after["generation_tokens"] - load_before["generation_tokens"]
                steps = load_after.get("steps", 0) - load_before.get("steps", 0)
                summary["engine_steps"] = steps
                summary["mean_batch"] = generated / steps if steps else None
            if server is not None and cpu_before and cpu_after:
                summary["server_cpu"] = cpu_per_token(cpu_before, cpu_after, generated)
                summary["idle_cpu_percent"] = idle
            points.append({"sweep_by": sweep_by, "load": load, "frontend": frontend if server else None,
                           "summary": summary,
                           "requests": [asdict(r) | {"tpot": r.tpot} for r in results] if args.json else None})
            _print_point(label, summary)
        if len(points) > 1:
            _print_sweep_table(points, sweep_by)
        if args.sweep:
            plot = args.plot if frontend == "python" or not server else args.plot.replace(".png", f"_{frontend}.png")
            problem = _plot(points, sweep_by, plot)
            print(problem or f"plot: {plot}")
        if not forward_exposed:
            print("note: the server exposes no forward time (/metrics, /server_info)"
                  + ("; the forward was timed inside the launched engine process by this bench" if server else
                     "; CPU figures need --launch"))
        if args.json:
            path = args.json if frontend == "python" or not server else args.json.replace(".json", f"_{frontend}.json")
            with open(path, "w") as f:
                json.dump({"base_url": base_url, "model": model, "launched": args.launch, "seed": args.seed,
                           "frontend": frontend if server else None,
                           "num_requests": len(requests), "output_lens": output_lens,
                           "output_weights": output_weights, "sweep_by": sweep_by,
                           "forward_exposed_by_server": forward_exposed,
                           "server_info": info,
                           "points": [p | {"load": p["load"] if math.isfinite(p["load"]) else "inf"} for p in points]},
                          f, indent=1, default=str)
            print(f"json: {path}")
    except BaseException:
        if server is not None:
            tail = server.log_tail()
            if tail:
                print(f"server log (tail):\n{tail}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.close()
    return points


def _print_frontend_table(points: list[dict[str, Any]]) -> None:
    """The front ends side by side, load by load, with the Rust one's ratios to Python's."""
    print()
    print(f"{'front end':<10}{'load':>7}{'tok/s':>9}{'TTFT50':>9}{'ovh us':>9}{'fwd us':>9}{'idle %':>8}")
    by_load: dict[Any, dict[str, dict[str, Any]]] = {}
    for p in points:
        by_load.setdefault(p["load"], {})[p["frontend"]] = p["summary"]
    for load, fronts in by_load.items():
        for name, s in fronts.items():
            cpu = s.get("server_cpu") or {}
            print(f"{name:<10}{load:>7g}{s['output_throughput']:>9.0f}{_fmt(s['ttft_ms']['p50']):>9}"
                  f"{_fmt(cpu.get('overhead_us_per_token')):>9}{_fmt(cpu.get('forward_cpu_us_per_token')):>9}"
                  f"{_fmt(s.get('idle_cpu_percent'), 2):>8}")
        py, rs = fronts.get("python"), fronts.get("rust")
        if py and rs:
            def ratio(a: float | None, b: float | None) -> str:
                return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"

            po = (py.get("server_cpu") or {}).get("overhead_us_per_token")
            ro = (rs.get("server_cpu") or {}).get("overhead_us_per_token")
            print(f"{'rust/py':<10}{load:>7g}{ratio(rs['output_throughput'], py['output_throughput']):>9}"
                  f"{ratio(rs['ttft_ms']['p50'], py['ttft_ms']['p50']):>9}{ratio(ro, po):>9}")
    print("(ovh: server CPU per generated token outside the forward, us; rust/py: the Rust front end's figure "
          "over the Python one's)")


def _print_sweep_table(points: list[dict[str, Any]], by: str) -> None:
    print()
    head = "clients" if by == "concurrency" else "req/s in"
    print(f"{head:>8}{'req/s':>8}{'tok/s':>8}{'TTFT50':>9}{'TTFT99':>9}{'TPOT50':>8}{'TPOT99':>8}{'ITL50':>8}"
          f"{'E2E50':>9}{'E2E99':>9}{'hit%':>6}{'err':>5}{'ovh us':>8}{'fwd us':>8}")
    for p in points:
        s = p["summary"]
        cpu = s.get("server_cpu") or {}
        print(f"{p['load']:>8g}{s['request_throughput']:>8.2f}{s['output_throughput']:>8.0f}"
              f"{_fmt(s['ttft_ms']['p50']):>9}{_fmt(s['ttft_ms']['p99']):>9}{_fmt(s['tpot_ms']['p50']):>8}"
              f"{_fmt(s['tpot_ms']['p99']):>8}{_fmt(s['itl_ms']['p50']):>8}{_fmt(s['e2e_ms']['p50'], 0):>9}"
              f"{_fmt(s['e2e_ms']['p99'], 0):>9}{s['cache_hit_rate'] * 100:>6.1f}{s['errors']:>5}"
              f"{_fmt(cpu.get('overhead_us_per_token')):>8}{_fmt(cpu.get('forward_cpu_us_per_token')):>8}")
    print("(latencies in ms; ovh: server CPU per generated token excluding the forward; fwd: forward CPU per token)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serving benchmark: latency and throughput over HTTP", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_argument_group("server")
    target.add_argument("--base-url", help="a running OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    target.add_argument("--launch", metavar="MODEL", help="start `ferrolm serve --model MODEL` on a free loopback "
                        "port, measure its CPU time, stop it after")
    target.add_argument("--server-args", help="extra flags for the launched server, as one string")
    target.add_argument("--api-key")
    target.add_argument("--frontend", default=None,
                        help="with --launch: the server's front end(s), rust (the default), python or python,rust "
                             "(both, one after the other, compared in one table)")
    target.add_argument("--model", help="the model id to send (default: the first of /v1/models)")
    load = p.add_argument_group("load")
    load.add_argument("--request-rate", type=_parse_rate, help="Poisson arrivals, requests/s (inf: all at once)")
    load.add_argument("--concurrency", type=int, help="clients in flight (with --request-rate: a cap)")
    load.add_argument("--num-requests", type=int, default=200)
    load.add_argument("--sweep", help="comma-separated loads (rates or concurrencies) run one after the other")
    load.add_argument("--sweep-by", choices=("rate", "concurrency"),
                      help="what --sweep varies (default: rate if --request-rate is given, else concurrency)")
    load.add_argument("--warmup", type=int, default=2, help="short requests sent (unmeasured) before each run")
    load.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request")
    wl = p.add_argument_group("workload")
    wl.add_argument("--seed", type=int, default=0)
    wl.add_argument("--output-lens", default="16,64,256", help="max_tokens of short, normal, long outputs")
    wl.add_argument("--output-weights", default="0.5,0.35,0.15")
    wl.add_argument("--system-prompts", type=int, default=4)
    wl.add_argument("--temperature", type=float, default=0.0)
    wl.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (servers that refuse it)")
    out = p.add_argument_group("output")
    out.add_argument("--json", help="write all figures (and each request's) to this file")
    out.add_argument("--plot", default="bench_serve.png", help="the PNG a sweep writes")
    out.add_argument("--no-progress", action="store_true")
    out.add_argument("--no-flush", action="store_true", help="keep the prefix cache between runs (default: "
                     "POST /flush_cache before each run where the server has it)")
    out.add_argument("--strict", action="store_true", help="exit 1 on any request error")
    p.set_defaults(func=run)


def _serve_main(argv: list[str]) -> int:
    """``python -m ferrolm.bench.serve SERVE-FLAGS``: ``ferrolm serve`` with the forward
    timed (how ``--launch`` starts the server)."""
    from ferrolm.server.args import add_serve_arguments, server_args_from
    from ferrolm.server.launch import run_server

    parser = argparse.ArgumentParser(prog="python -m ferrolm.bench.serve")
    add_serve_arguments(parser)
    return run_server(server_args_from(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(_serve_main(sys.argv[1:]))
