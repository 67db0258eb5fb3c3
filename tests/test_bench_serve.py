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


def test_concurrency_run_reports_every_figure(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    rc = bench(
        "--base-url",
        server.url,
        "--concurrency",
        "4",
        "--num-requests",
        "8",
        "--output-lens",
        "4,8",
        "--output-weights",
        "1,1",
        "--warmup",
        "1",
        "--no-progress",
        "--json",
        str(out),
        "--strict",
    )
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
    rc = bench(
        "--base-url",
        server.url + "/v1",
        "--request-rate",
        "inf",
        "--sweep",
        "4,inf",
        "--num-requests",
        "6",
        "--output-lens",
        "4",
        "--output-weights",
        "1",
        "--warmup",
        "0",
        "--no-progress",
        "--json",
        str(out),
        "--plot",
        str(png),
        "--strict",
    )
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


def test_threads_that_ended_still_count() -> None:
    """The core samples a large step on a thread that lives only for that commit: /proc
    no longer lists it after, but the process's total keeps its CPU."""
    import os

    before = bench_serve._ended_threads_cpu_s(os.getpid())
    helper = threading.Thread(target=_burn, args=(0.2,))
    helper.start()
    helper.join()
    # join returns a moment before the system thread is gone from /proc
    from ferrolm.server.testing import wait_until

    wait_until(lambda: str(helper.native_id) not in os.listdir(f"/proc/{os.getpid()}/task"))
    after = bench_serve._ended_threads_cpu_s(os.getpid())
    assert before is not None and after is not None
    # the helper's 0.2 s, to a few clock ticks (10 ms each) of the two readings
    assert 0.15 <= after - before <= 0.25


def test_the_forward_is_read_from_the_servers_metrics() -> None:
    text = (
        "# TYPE ferrolm:forward_seconds histogram\n"
        'ferrolm:forward_seconds_bucket{le="+Inf"} 12.0\n'
        "ferrolm:forward_seconds_count 12.0\n"
        "ferrolm:forward_seconds_sum 0.5\n"
        "ferrolm:forward_seconds_created 1.7e9\n"
        "ferrolm:forward_loop_cpu_seconds_total 0.25\n"
        "ferrolm:sampling_thread_cpu_seconds_total 0.125\n"
        "ferrolm:num_steps_total 12.0\n"
    )
    assert bench_serve.forward_from_metrics(text) == {
        "forward_calls": 12.0,
        "forward_wall_s": 0.5,
        "loop_forward_cpu_s": 0.25,
        "sampling_threads_cpu_s": 0.125,
    }
    assert bench_serve.forward_from_metrics("ferrolm:num_steps_total 3.0\n") == {}


def test_overhead_is_http_plus_the_loop_outside_the_forward_plus_the_sampling_threads() -> None:
    def reading(
        http: float, loop: float, loop_forward: float, other: float, ended: float, sampling: float
    ) -> dict[str, Any]:
        return {
            "process_cpu_s": http + loop + other + ended,
            "http_cpu_s": http,
            "loop_cpu_s": loop,
            "other_cpu_s": other,
            "ended_threads_cpu_s": ended,
            "loop_forward_cpu_s": loop_forward,
            "sampling_threads_cpu_s": sampling,
            "forward_wall_s": loop_forward * 1.1,
            "forward_calls": 100.0,
        }

    before = reading(1.0, 2.0, 1.0, 0.5, 0.1, 0.05)
    after = reading(1.5, 4.0, 2.5, 0.9, 0.4, 0.15)
    out = bench_serve.cpu_per_token(before, after, tokens=1000)
    # the loop outside the forward: 2.0 - 1.5 = 0.5 s; the commits' sampling threads 0.1 s
    # of the 0.3 s that ended threads used; HTTP 0.5 s
    assert out["loop_outside_forward_us_per_token"] == pytest.approx(500.0)
    assert out["sampling_threads_us_per_token"] == pytest.approx(100.0)
    assert out["frontend_cpu_us_per_token"] == pytest.approx(500.0)
    assert out["overhead_us_per_token"] == pytest.approx(1100.0)
    # the forward: the loop's 1.5 s in it, the other threads' 0.4 s, the kernels' 0.2 s
    assert out["forward_cpu_us_per_token"] == pytest.approx(2100.0)
    assert out["floor_met"] is True
    missing = bench_serve.cpu_per_token(before, {**after, "loop_forward_cpu_s": None}, tokens=1000)
    assert missing["overhead_us_per_token"] is None and missing["floor_met"] is None


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


def test_a_launched_server_reports_its_forward_and_overhead(tmp_path: Path) -> None:
    """``--launch``: the server runs as ``ferrolm serve`` runs (nothing patched); the
    forward's figures come from its /metrics."""
    out = tmp_path / "launched.json"
    rc = bench(
        "--launch",
        "tiny",
        "--concurrency",
        "2",
        "--num-requests",
        "4",
        "--output-lens",
        "4",
        "--output-weights",
        "1",
        "--warmup",
        "0",
        "--no-progress",
        "--json",
        str(out),
        "--strict",
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["forward_exposed_by_server"] is True
    [point] = report["points"]
    cpu = point["summary"]["server_cpu"]
    assert cpu["generated_tokens"] == 16
    assert cpu["forward_calls"] >= 4  # a step at least per token of a request
    assert cpu["forward_cpu_us_per_token"] > 0 and cpu["forward_wall_us_per_token"] > 0
    assert cpu["overhead_us_per_token"] is not None and cpu["overhead_us_per_token"] > 0
