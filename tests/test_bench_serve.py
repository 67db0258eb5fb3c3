"""Smoke test of ``ferrolm bench serve``: a few requests against a real ``ferrolm serve``
started by the test harness; checks the report's structure and that nothing failed (no
timing assertions: the machine is shared)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrolm.bench import serve as bench_serve
from ferrolm.server.testing import RunningServer, running_server

QUANTILES = {"mean", "p50", "p90", "p99", "max"}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-total-tokens", "16384") as s:
        yield s


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    bench_serve.add_parser(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["serve", *argv])
    return int(args.func(args))


def test_workload_is_seeded_and_multi_turn() -> None:
    a = bench_serve.make_requests(40, seed=3)
    b = bench_serve.make_requests(40, seed=3)
    assert [r.messages for r in a] == [r.messages for r in b]
    assert len(a) == 40 and {r.max_tokens for r in a} <= {16, 64, 256}
    # a later turn repeats its conversation's earlier turn word for word
    later = [r for r in a if r.turn > 0]
    assert later
    for r in later:
        earlier = next(e for e in a if e.conversation == r.conversation and e.turn == r.turn - 1)
        assert r.messages[: len(earlier.messages)] == earlier.messages
        assert earlier.index < r.index


def test_concurrency_run_reports_every_figure(server: RunningServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = bench("--base-url", server.url, "--concurrency", "4", "--num-requests", "8", "--output-lens", "4,8",
               "--output-weights", "1,1", "--warmup", "1", "--no-progress", "--json", str(out), "--strict")
    assert rc == 0
    report = json.loads(out.read_text())
    [point] = report["points"]
    s = point["summary"]
    assert s["requests"] == s["completed"] == 8
    assert s["errors"] == 0 and s["first_errors"] == []
    assert s["length_mismatches"] == 0  # ignore_eos: outputs are exactly max_tokens
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(s[key]) == QUANTILES
        assert all(v is not None and v >= 0 for v in s[key].values())
    assert s["output_tokens"] == sum(r["max_tokens"] for r in point["requests"])
    assert 0.0 <= s["cache_hit_rate"] <= 1.0 and s["prompt_tokens"] > 0
    assert s["request_throughput"] > 0 and s["output_throughput"] > 0
    assert len(point["requests"]) == 8 and all(r["ok"] for r in point["requests"])
    assert "server_cpu" not in s  # CPU figures only for a server the bench launched
    text = capsys.readouterr().out
    assert "TTFT" in text and "TPOT" in text and "cache hit rate" in text


def test_rate_sweep_writes_json_and_plot(server: RunningServer, tmp_path: Path) -> None:
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    rc = bench("--base-url", server.url + "/v1", "--request-rate", "inf", "--sweep", "4,inf", "--num-requests", "6",
               "--output-lens", "4", "--output-weights", "1", "--warmup", "0", "--no-progress",
               "--json", str(out), "--plot", str(png), "--strict")
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["sweep_by"] == "rate"
    assert [p["load"] for p in report["points"]] == [4.0, "inf"]
    assert all(p["summary"]["errors"] == 0 and p["summary"]["completed"] == 6 for p in report["points"])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _burn(seconds: float) -> None:
    """Spins until this thread has used ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _FakeFrontend:
    """A front end whose ``commit`` samples on a thread that ends inside the call, as the
    core does for a large step, while a long-lived thread is busy too."""

    def __init__(self, busy_long_lived: threading.Event) -> None:
        self.busy_long_lived = busy_long_lived

    def commit(self, core: object, logits: object) -> str:
        self.busy_long_lived.set()
        helper = threading.Thread(target=_burn, args=(0.05,))
        helper.start()
        helper.join()
        return "finished"

    drain = wait = fail_step = take_outputs = stop = commit_tokens = commit


def test_rust_commit_timer_counts_the_short_lived_sampling_thread_only() -> None:
    start, release = threading.Event(), threading.Event()

    def long_lived() -> None:  # an HTTP or BLAS thread: it outlives the commit
        start.wait()
        _burn(0.05)
        release.wait()

    worker = threading.Thread(target=long_lived)
    worker.start()
    totals: list[float] = [0.0] * 6
    timed = bench_serve._TimedCommits(_FakeFrontend(start), totals, lambda: None)
    try:
        assert timed.commit(None, None) == "finished"
    finally:
        release.set()
        worker.join()
    # the helper's 0.05 s (clock ticks of slack), not the long-lived thread's share
    assert 0.04 <= totals[4] <= 0.09
    assert totals[5] >= 0.0


def test_rust_overhead_adds_the_commit_helper_and_drops_the_timing() -> None:
    def reading(http: float, loop: float, loop_forward: float, helper: float, timing: float) -> dict[str, Any]:
        return {"api_cpu_s": 10.0, "engine_cpu_s": None, "forward_cpu_s": 5.0, "forward_wall_s": 6.0,
                "forward_calls": 100, "http_cpu_s": http, "loop_cpu_s": loop, "loop_forward_cpu_s": loop_forward,
                "commit_helper_cpu_s": helper, "timing_cpu_s": timing}

    before = reading(1.0, 2.0, 1.0, 0.1, 0.01)
    after = reading(1.5, 4.0, 2.5, 0.3, 0.11)
    out = bench_serve.cpu_per_token(before, after, tokens=1000)
    # loop outside the forward: 2.0 - 1.5 - 0.1 (timing) + 0.2 (helper) = 0.6 s
    assert out["loop_outside_forward_us_per_token"] == pytest.approx(600.0)
    assert out["commit_helper_us_per_token"] == pytest.approx(200.0)
    assert out["frontend_cpu_us_per_token"] == pytest.approx(500.0)
    assert out["overhead_us_per_token"] == pytest.approx(1100.0)


def test_thread_cpu_is_read_finer_than_clock_ticks() -> None:
    import os

    a = time.thread_time()
    before = bench_serve._thread_cpu_s(os.getpid())
    b = time.thread_time()
    _burn(0.013)  # not a whole number of 10 ms ticks
    c = time.thread_time()
    after = bench_serve._thread_cpu_s(os.getpid())
    d = time.thread_time()
    # the burn and at most the two readings themselves, to the thread clock's precision
    assert c - b - 1e-4 <= after["main"] - before["main"] <= d - a + 1e-4
