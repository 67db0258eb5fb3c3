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

With ``--launch`` (``ferrolm serve`` started here, as it is, nothing patched) the server's
CPU time is read before and after each run, per generated token: its threads' from /proc,
and the forward's from the server's own ``/metrics``, where the step loop exports what it
timed (``ferrolm:forward_seconds``, a histogram of each step's forward wall time, and
``ferrolm:forward_loop_cpu_seconds_total``, the loop thread's CPU inside the forward). The
overhead per token outside the forward is the HTTP threads' CPU, plus the step loop
thread's CPU outside the forward, plus the CPU of the short-lived threads on which the core
samples a large step (``ferrolm:sampling_thread_cpu_seconds_total``: /proc lists them no
longer once they end). The forward's CPU is the loop thread's inside the forward plus the
other threads' (BLAS workers; the attention and norm kernels' short-lived threads, which
only the process's total keeps once they end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

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


def make_requests(
    n: int,
    *,
    seed: int,
    system_prompts: int = 4,
    system_words: tuple[int, int] = (150, 400),
    turns: tuple[int, int] = (1, 4),
    user_words: tuple[int, int] = (10, 60),
    reply_words: tuple[int, int] = (20, 80),
    output_lens: tuple[int, ...] = (16, 64, 256),
    output_weights: tuple[float, ...] = (0.5, 0.35, 0.15),
) -> list[BenchRequest]:
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


async def _send(
    client: Any, url: str, headers: dict[str, str], body: dict[str, Any], result: RequestResult, t0: float
) -> None:
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
            sys.stderr.write(
                f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                f" errors {self.errors}  {now - self.started:6.1f} s"
            )
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def run_load(
    base_url: str,
    model: str,
    requests: list[BenchRequest],
    *,
    request_rate: float | None,
    concurrency: int | None,
    api_key: str | None,
    seed: int,
    ignore_eos: bool,
    temperature: float,
    timeout: float,
    progress: bool = True,
    label: str = "",
) -> tuple[list[RequestResult], float]:
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
        body: dict[str, Any] = {
            "model": model,
            "messages": r.messages,
            "max_tokens": r.max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
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
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


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
        "requests": len(results),
        "completed": len(ok),
        "errors": len(errors),
        "first_errors": first_errors,
        "length_mismatches": sum(1 for r in ok if r.completion_tokens != r.max_tokens),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": output / duration if duration > 0 else 0.0,
        "total_token_throughput": (prompt + output) / duration if duration > 0 else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": output,
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


def _ended_threads_cpu_s(pid: int) -> float | None:
    """CPU seconds of the process's threads that have ended: the process's total (which
    keeps what ended threads used) less what its live threads have used, both in clock
    ticks, read back to back."""
    total = _proc_cpu_s(pid)
    if total is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    live = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        live += int(fields[11]) + int(fields[12])
    return max(0.0, total - live / tick)


# the step loop's forward timing on /metrics (ferrolm.step_loop)
_FORWARD_SERIES = {
    "ferrolm:forward_seconds_sum": "forward_wall_s",
    "ferrolm:forward_seconds_count": "forward_calls",
    "ferrolm:forward_loop_cpu_seconds_total": "loop_forward_cpu_s",
    "ferrolm:sampling_thread_cpu_seconds_total": "sampling_threads_cpu_s",
}
_SERIES_LINE = re.compile(r"^(ferrolm:(?:forward|sampling_thread)_\S+) (\S+)$", re.MULTILINE)


def forward_from_metrics(text: str) -> dict[str, float]:
    """The step loop's forward figures in a ``/metrics`` text (none where absent)."""
    out = {}
    for name, value in _SERIES_LINE.findall(text):
        if name in _FORWARD_SERIES:
            out[_FORWARD_SERIES[name]] = float(value)
    return out


class LoggedProcess:
    """A child process (its own session) whose output goes to the temporary file
    ``log_path``: ``log_tail`` reads the end of it, ``close`` stops the process and its
    group and removes the file."""

    process: Any
    log_path: str

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        from ferrolm.server.testing import _stop

        _stop(self.process)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class LaunchedServer(LoggedProcess):
    """``ferrolm serve --model MODEL`` on a free loopback port, stopped on ``close``."""

    def __init__(self, model: str, extra_flags: list[str], api_key: str | None) -> None:
        from ferrolm.server.testing import RunningServer, _wait_healthy, free_port

        log_fd, self.log_path = tempfile.mkstemp(prefix="ferrolm-bench-server-", suffix=".log")
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "ferrolm.cli",
            "serve",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra_flags,
        ]
        if api_key:
            cmd += ["--api-key", api_key]
        import subprocess

        self.process = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True)
        os.close(log_fd)
        self.url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(RunningServer(self.url, self.process, api_key))
        except BaseException:
            self.close()
            raise

    def cpu(self) -> dict[str, Any]:
        """The server's CPU so far: its threads' (from /proc) and the forward's (from its
        /metrics, read first, so that the scrape's own work counts as the server's)."""
        import httpx

        try:
            r = httpx.get(f"{self.url}/metrics", timeout=30)
            forward = forward_from_metrics(r.text) if r.status_code == 200 else {}
        except httpx.HTTPError:
            forward = {}
        pid = self.process.pid
        threads = _thread_cpu_s(pid)
        return {
            "process_cpu_s": _proc_cpu_s(pid),
            "http_cpu_s": threads["http"],
            "loop_cpu_s": threads["main"],
            "other_cpu_s": threads["other"],
            "ended_threads_cpu_s": _ended_threads_cpu_s(pid),
            "loop_forward_cpu_s": forward.get("loop_forward_cpu_s"),
            "sampling_threads_cpu_s": forward.get("sampling_threads_cpu_s"),
            "forward_wall_s": forward.get("forward_wall_s"),
            "forward_calls": forward.get("forward_calls"),
        }


def cpu_per_token(before: dict[str, Any], after: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The server's CPU per generated token (µs) between two ``LaunchedServer.cpu``
    readings: outside the forward (the overhead) and in it."""

    def delta(key: str) -> float | None:
        a, b = before.get(key), after.get(key)
        return None if a is None or b is None else b - a

    def per_token(seconds: float | None) -> float | None:
        return seconds / tokens * 1e6 if seconds is not None and tokens else None

    out: dict[str, Any] = {"generated_tokens": tokens}
    http, loop, loop_forward = delta("http_cpu_s"), delta("loop_cpu_s"), delta("loop_forward_cpu_s")
    other, ended = delta("other_cpu_s"), delta("ended_threads_cpu_s") or 0.0
    # of the threads that ended, the core's sampling helpers are the commit's; the rest
    # (the attention and norm kernels' workers) worked in the forward
    sampling = delta("sampling_threads_cpu_s") or 0.0
    kernels = max(0.0, ended - sampling)
    out["process_cpu_us_per_token"] = per_token(delta("process_cpu_s"))
    out["forward_wall_us_per_token"] = per_token(delta("forward_wall_s"))
    out["forward_calls"] = delta("forward_calls")
    if http is None or loop is None or loop_forward is None or other is None:
        out.update(overhead_us_per_token=None, forward_cpu_us_per_token=None, floor_met=None)
        return out
    out["frontend_cpu_us_per_token"] = per_token(http)
    out["loop_outside_forward_us_per_token"] = per_token(loop - loop_forward)
    out["sampling_threads_us_per_token"] = per_token(sampling)
    out["overhead_us_per_token"] = per_token(http + loop - loop_forward + sampling)
    out["forward_cpu_us_per_token"] = per_token(loop_forward + other + kernels)
    forward = out["forward_cpu_us_per_token"]
    out["floor_met"] = forward is not None and out["overhead_us_per_token"] < forward
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
    print(f"  {load_label}: {s['completed']}/{s['requests']} requests in {s['duration_s']:.1f} s, {s['errors']} errors")
    print(f"  {'(ms)':<8}{'mean':>9}{'P50':>9}{'P90':>9}{'P99':>9}{'max':>9}")
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")):
        d = s[key]
        print(f"  {name:<8}" + "".join(f"{_fmt(d[q]):>9}" for q in ("mean", "p50", "p90", "p99", "max")))
    print(
        f"  throughput: {s['request_throughput']:.2f} req/s, {s['output_throughput']:.0f} output tok/s, "
        f"{s['total_token_throughput']:.0f} total tok/s"
    )
    print(
        f"  prompt tokens {s['prompt_tokens']}, cached {s['cached_tokens']}: cache hit rate "
        f"{s['cache_hit_rate'] * 100:.1f}%; output tokens {s['output_tokens']}"
        + (f" ({s['length_mismatches']} requests not at their max_tokens)" if s["length_mismatches"] else "")
    )
    for e in s["first_errors"]:
        print(f"  error: {e}")
    cpu = s.get("server_cpu")
    if cpu:
        print(
            f"  server CPU per generated token ({cpu['generated_tokens']} tokens): "
            f"{_fmt(cpu['process_cpu_us_per_token'])} us in all"
        )
        if cpu["forward_cpu_us_per_token"] is None:
            print(
                "  forward time: the server's /metrics has no ferrolm:forward_* series; overhead excluding "
                "the forward unknown"
            )
        else:
            verdict = "met" if cpu["floor_met"] else "MISSED"
            print(
                f"  forward (the step loop's own timing, /metrics): {_fmt(cpu['forward_cpu_us_per_token'])} us "
                f"CPU per token over {_fmt(cpu['forward_calls'], 0)} calls "
                f"({_fmt(cpu['forward_wall_us_per_token'])} us wall)"
            )
            print(
                f"  overhead excluding the forward (HTTP threads {_fmt(cpu['frontend_cpu_us_per_token'])} + "
                f"step loop outside the forward {_fmt(cpu['loop_outside_forward_us_per_token'])} + sampling "
                f"threads {_fmt(cpu['sampling_threads_us_per_token'])}): {_fmt(cpu['overhead_us_per_token'])} us "
                f"per token; floor (overhead < forward): {verdict}"
            )
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
    requests = make_requests(
        args.num_requests,
        seed=args.seed,
        system_prompts=args.system_prompts,
        output_lens=output_lens,
        output_weights=output_weights,
    )
    points = _run_on(args, loads, sweep_by, requests, output_lens, output_weights)
    failed = any(p["summary"]["errors"] for p in points)
    return 1 if failed and args.strict else 0


IDLE_MEASURE_S = 2.0  # how long the launched server's idle CPU is measured


def _idle_cpu_percent(server: LaunchedServer) -> float | None:
    """The server's CPU (every process of it) over a quiet moment, in % of one core."""

    def total() -> float | None:
        return _proc_cpu_s(server.process.pid)

    time.sleep(0.5)  # let the warmup's last writes settle
    a, t0 = total(), time.perf_counter()
    time.sleep(IDLE_MEASURE_S)
    b, t1 = total(), time.perf_counter()
    return None if a is None or b is None else (b - a) / (t1 - t0) * 100


def _run_on(
    args: argparse.Namespace,
    loads: list[Any],
    sweep_by: str,
    requests: list[BenchRequest],
    output_lens: tuple[int, ...],
    output_weights: tuple[float, ...],
) -> list[dict[str, Any]]:
    server: LaunchedServer | None = None
    points: list[dict[str, Any]] = []
    if args.launch:
        extra = shlex.split(args.server_args or "")
        if sweep_by == "concurrency" and not any(f.startswith("--max-running-requests") for f in extra):
            extra += ["--max-running-requests", str(max(64, int(max(loads))))]
        print(f"launching ferrolm serve --model {args.launch} {' '.join(extra)}", file=sys.stderr)
        server = LaunchedServer(args.launch, extra, args.api_key)
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
        forward_exposed = bool(metrics_text and "ferrolm:forward_seconds" in metrics_text)
        print(
            f"ferrolm bench serve: {len(requests)} requests to {base_url} (model {model!r}); "
            f"outputs {'/'.join(map(str, output_lens))} tokens; seed {args.seed}"
        )
        idle = None
        for load in loads:
            if args.warmup:
                warm = make_requests(args.warmup, seed=args.seed + 10_000, output_lens=(8,), output_weights=(1.0,))
                asyncio.run(
                    run_load(
                        base_url,
                        model,
                        warm,
                        request_rate=math.inf,
                        concurrency=None,
                        api_key=args.api_key,
                        seed=args.seed,
                        ignore_eos=not args.no_ignore_eos,
                        temperature=args.temperature,
                        timeout=args.timeout,
                        progress=False,
                    )
                )
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
            results, duration = asyncio.run(
                run_load(
                    base_url,
                    model,
                    requests,
                    request_rate=rate,
                    concurrency=conc,
                    api_key=args.api_key,
                    seed=args.seed,
                    ignore_eos=not args.no_ignore_eos,
                    temperature=args.temperature,
                    timeout=args.timeout,
                    progress=not args.no_progress,
                    label=label,
                )
            )
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
            points.append(
                {
                    "sweep_by": sweep_by,
                    "load": load,
                    "summary": summary,
                    "requests": [asdict(r) | {"tpot": r.tpot} for r in results] if args.json else None,
                }
            )
            _print_point(label, summary)
        if len(points) > 1:
            _print_sweep_table(points, sweep_by)
        if args.sweep:
            problem = _plot(points, sweep_by, args.plot)
            print(problem or f"plot: {args.plot}")
        if not forward_exposed:
            print("note: the server's /metrics has no forward time (ferrolm:forward_seconds)")
        elif server is None:
            print("note: CPU figures need --launch")
        if args.json:
            path = args.json
            with open(path, "w") as f:
                json.dump(
                    {
                        "base_url": base_url,
                        "model": model,
                        "launched": args.launch,
                        "seed": args.seed,
                        "num_requests": len(requests),
                        "output_lens": output_lens,
                        "output_weights": output_weights,
                        "sweep_by": sweep_by,
                        "forward_exposed_by_server": forward_exposed,
                        "server_info": info,
                        "points": [p | {"load": p["load"] if math.isfinite(p["load"]) else "inf"} for p in points],
                    },
                    f,
                    indent=1,
                    default=str,
                )
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


def _print_sweep_table(points: list[dict[str, Any]], by: str) -> None:
    print()
    head = "clients" if by == "concurrency" else "req/s in"
    print(
        f"{head:>8}{'req/s':>8}{'tok/s':>8}{'TTFT50':>9}{'TTFT99':>9}{'TPOT50':>8}{'TPOT99':>8}{'ITL50':>8}"
        f"{'E2E50':>9}{'E2E99':>9}{'hit%':>6}{'err':>5}{'ovh us':>8}{'fwd us':>8}"
    )
    for p in points:
        s = p["summary"]
        cpu = s.get("server_cpu") or {}
        print(
            f"{p['load']:>8g}{s['request_throughput']:>8.2f}{s['output_throughput']:>8.0f}"
            f"{_fmt(s['ttft_ms']['p50']):>9}{_fmt(s['ttft_ms']['p99']):>9}{_fmt(s['tpot_ms']['p50']):>8}"
            f"{_fmt(s['tpot_ms']['p99']):>8}{_fmt(s['itl_ms']['p50']):>8}{_fmt(s['e2e_ms']['p50'], 0):>9}"
            f"{_fmt(s['e2e_ms']['p99'], 0):>9}{s['cache_hit_rate'] * 100:>6.1f}{s['errors']:>5}"
            f"{_fmt(cpu.get('overhead_us_per_token')):>8}{_fmt(cpu.get('forward_cpu_us_per_token')):>8}"
        )
    print("(latencies in ms; ovh: server CPU per generated token excluding the forward; fwd: forward CPU per token)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serving benchmark: latency and throughput over HTTP",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("server")
    target.add_argument("--base-url", help="a running OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    target.add_argument(
        "--launch",
        metavar="MODEL",
        help="start `ferrolm serve --model MODEL` on a free loopback port, measure its CPU time, stop it after",
    )
    target.add_argument("--server-args", help="extra flags for the launched server, as one string")
    target.add_argument("--api-key")
    target.add_argument("--model", help="the model id to send (default: the first of /v1/models)")
    load = p.add_argument_group("load")
    load.add_argument("--request-rate", type=_parse_rate, help="Poisson arrivals, requests/s (inf: all at once)")
    load.add_argument("--concurrency", type=int, help="clients in flight (with --request-rate: a cap)")
    load.add_argument("--num-requests", type=int, default=200)
    load.add_argument("--sweep", help="comma-separated loads (rates or concurrencies) run one after the other")
    load.add_argument(
        "--sweep-by",
        choices=("rate", "concurrency"),
        help="what --sweep varies (default: rate if --request-rate is given, else concurrency)",
    )
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
    out.add_argument(
        "--no-flush",
        action="store_true",
        help="keep the prefix cache between runs (default: POST /flush_cache before each run where the server has it)",
    )
    out.add_argument("--strict", action="store_true", help="exit 1 on any request error")
    p.set_defaults(func=run)
