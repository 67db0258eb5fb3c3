"""``FERROLM_LOG``: the core's tracing events on stderr, installed when ``ferrolm._core`` is
imported with the variable set (in a subprocess: a subscriber is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

# admission with a cache hit, chunked prefill, eviction and retraction in a small pool,
# then a grammar compiled once and found in the cache the second time
SCRIPT = """
from ferrolm.engine import Engine
from ferrolm.sampling_params import SamplingParams
engine = Engine("tiny", kv_capacity=96, max_prefill_tokens=16, kv_cache_dtype="float32")
system = "You are a careful assistant who answers in one short sentence. "
greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
engine.generate([system + "First?"], greedy)
engine.generate([system + q for q in ("Second?", "Third?", "Fourth?")] + ["word " * 40], greedy)
for _ in range(2):
    engine.generate(["JSON:"], SamplingParams(max_new_tokens=4, temperature=0.0, json_object=True))
print("done")
"""


def run(log: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FERROLM_LOG"}
    if log is not None:
        env["FERROLM_LOG"] = log
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)


def test_ferrolm_log_prints_the_cores_events() -> None:
    out = run("ferrolm_core=debug,ferrolm_constraint=debug")
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-2000:]
    events = out.stderr
    for event in (
        "admitted",
        "prefix cache hit",
        "prefill chunk",
        "evicted from the prefix cache",
        "retracted under KV pressure",
        "grammar compiled",
        "grammar cache hit",
    ):
        assert event in events, f"no {event!r} event in:\n{events[-3000:]}"
    assert " DEBUG step{step=" in events  # events inside a step carry its span
    assert "cached=" in events and "rid=" in events  # with their fields


def test_the_filter_selects_targets_and_levels() -> None:
    out = run("ferrolm_constraint=debug")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "grammar compiled" in out.stderr
    assert "admitted" not in out.stderr and "ferrolm_core" not in out.stderr


def test_silent_without_ferrolm_log_and_with_a_bad_filter() -> None:
    out = run(None)
    assert out.returncode == 0 and out.stdout.strip() == "done"
    assert "admitted" not in out.stderr and "grammar" not in out.stderr
    bad = run("ferrolm_core=loud")
    assert bad.returncode == 0 and bad.stdout.strip() == "done"
    assert "is not a log filter" in bad.stderr and "admitted" not in bad.stderr
