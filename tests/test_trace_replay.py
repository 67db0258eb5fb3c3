"""Engine traces: recorded from the tiny model's engine and from a live server, replayed
without the model through the binding (``_core.replay_trace``), the ``ferrolm replay``
command and the ``ferrolm-replay`` binary, which must make the recorded decisions and
keep the KV checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import make_engine
from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.testing import running_server

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are a careful assistant who answers in one short sentence. "


def replay_binary() -> Path | None:
    """The ``ferrolm-replay`` binary: ``$FERROLM_REPLAY_BIN``, else cargo's build of it
    (``make test`` builds it; so does ``cargo test -p ferrolm-core``)."""
    configured = os.environ.get("FERROLM_REPLAY_BIN")
    if configured:
        return Path(configured)
    built = [ROOT / "target" / profile / "ferrolm-replay" for profile in ("release", "debug")]
    found = [p for p in built if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def record_engine_run(tiny: Any, path: Path) -> dict[str, int]:
    """A run that shares prefixes, chunks, retracts, stops on a string and samples twice;
    returns the engine's counters."""
    engine = make_engine(tiny, kv_capacity=160, max_prefill_tokens=16, max_running_requests=6, record_trace=path)
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    prompts = [SYSTEM + q for q in ("What is a radix tree?", "Name a color.", "Why chunk a prefill?")]
    engine.generate(prompts[:1], greedy)  # cached: the others hit its prefix
    engine.submit(SYSTEM + "Say one word.", SamplingParams(max_new_tokens=30, temperature=0.0, stop=["h *"]))
    engine.generate(
        prompts + [" ".join(["a long prompt that needs several chunks"] * 6)],
        SamplingParams(max_new_tokens=24, temperature=0.7, seed=5, n=2),
    )
    while engine.has_work():
        engine.step()
    stats = engine.core.stats()
    assert stats["retractions"] > 0 and stats["cache_hit_tokens"] > 0, stats
    return stats


@pytest.fixture(scope="module")
def engine_trace(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    path = tmp_path_factory.mktemp("trace") / "engine.trace.jsonl"
    return path, record_engine_run(tiny, path)


def test_an_engine_trace_replays_with_the_recorded_decisions(engine_trace: tuple[Path, dict[str, int]]) -> None:
    path, stats = engine_trace
    header = json.loads(path.read_text().splitlines()[0])
    assert (header["format"], header["version"], header["config"]["kv_capacity"]) == ("ferrolm-trace", 1, 160)
    s = _core.replay_trace(path, verbose=True)
    assert s["ok"] and s["same"], s["report"]
    assert s["violation_count"] == 0 and s["violations"] == []
    assert s["steps"] == s["recorded_steps"] == s["compared_steps"] == stats["steps"]
    assert s["diverged_steps"] == 0 and s["first_divergence"] is None
    assert s["retractions"] == stats["retractions"]
    assert s["cache_hit_tokens"] == s["recorded_cache_hit_tokens"] == stats["cache_hit_tokens"]
    assert s["generated_tokens"] == stats["generation_tokens"]
    assert s["prefill_chunks"] > 0
    assert s["finishes"] == {"length": 9, "stop": 1}
    assert s["kv_checks"] == s["steps"] + 1 and s["peak_kv_used"] <= 160
    assert len(s["lines"]) == s["steps"] and s["lines"][0].startswith("step 0: ")
    assert any("retract r" in line for line in s["lines"])


def test_replays_under_other_settings_and_by_time(engine_trace: tuple[Path, dict[str, int]]) -> None:
    path, _ = engine_trace
    s = _core.replay_trace(path, max_prefill_tokens=4, kv_capacity=1024)
    assert s["ok"] and not s["same"] and s["diverged_steps"] > 0, s["report"]
    assert s["first_divergence"].startswith("step ")
    assert sum(s["finishes"].values()) == s["requests"] == 10
    for step_ms in (None, 50.0):
        s = _core.replay_trace(path, by_time=True, step_ms=step_ms, token_ms=0.01, check_every=0)
        assert s["ok"] and s["compared_steps"] == 0 and s["kv_checks"] == 1, s["report"]
        assert sum(s["finishes"].values()) == 10 and s["missing_tokens"] == 0
        assert s["report"][1] == "decisions: not compared (arrivals by time)"


def test_bad_traces_and_settings_raise(tmp_path: Path, engine_trace: tuple[Path, dict[str, int]]) -> None:
    path, _ = engine_trace
    with pytest.raises(OSError, match="absent"):
        _core.replay_trace(tmp_path / "absent.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(path.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(InvalidInputError, match="line 2: not JSON") as e:
        _core.replay_trace(broken)
    assert e.value.field == "trace"
    cases = [
        ({"eviction_policy": "random"}, "eviction_policy"),
        ({"schedule_policy": "sjf"}, "schedule_policy"),
        ({"kv_capacity": 0}, "settings"),
        ({"step_ms": 5.0}, "by_time"),
        ({"by_time": True, "step_ms": -1.0}, "step_ms"),
    ]
    for kw, field in cases:
        with pytest.raises(InvalidInputError) as e:
            _core.replay_trace(path, **kw)
        assert e.value.field == field, (kw, e.value)
    with pytest.raises(OSError, match="record_trace"):
        _core.Engine(
            _core.Vocabulary([b"a", b"b"], eos_token_ids=[1]), record_trace=tmp_path / "no" / "such" / "dir.jsonl"
        )


def test_the_binary_and_the_command_agree_with_the_binding(engine_trace: tuple[Path, dict[str, int]]) -> None:
    path, _ = engine_trace
    report = _core.replay_trace(path)["report"]
    cli = subprocess.run(
        [sys.executable, "-m", "ferrolm.cli", "replay", "-q", str(path)], capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == report
    diverged = subprocess.run(
        [sys.executable, "-m", "ferrolm.cli", "replay", "-q", "--max-prefill-tokens", "4", "--expect-same", str(path)],
        capture_output=True,
        text=True,
    )
    assert diverged.returncode == 3, diverged.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "ferrolm.cli", "replay", str(path) + ".absent"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "absent" in missing.stderr
    binary = replay_binary()
    if binary is None:
        pytest.skip("no ferrolm-replay binary built (make test builds it); the binding was tested above")
    out = subprocess.run([str(binary), "-q", str(path)], capture_output=True, text=True, env=_env_without_log())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == report


def test_a_server_records_a_trace_that_replays(tmp_path: Path) -> None:
    path = tmp_path / "server.trace.jsonl"
    prompts = [SYSTEM + f"Question {i}: what is {i} plus {i}?" for i in range(6)]
    with running_server(
        "--max-total-tokens", "256", "--chunked-prefill-size", "32", "--record-trace", str(path)
    ) as server:

        def ask(prompt: str) -> None:
            body = {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
            r = httpx.post(f"{server.url}/generate", json=body, timeout=120)
            assert r.status_code == 200, r.text

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s = _core.replay_trace(path)
    assert s["ok"] and s["same"], s["report"]
    assert s["requests"] == 6 and s["finishes"] == {"length": 6}
    assert s["steps"] == s["recorded_steps"] > 0
    assert s["generated_tokens"] == 6 * 16
    assert s["cache_hit_tokens"] == s["recorded_cache_hit_tokens"]


def test_serve_and_generate_take_record_trace(tmp_path: Path) -> None:
    import argparse

    from ferrolm.cli import main
    from ferrolm.server.args import ServerArgs, add_serve_arguments, server_args_from

    assert ServerArgs().record_trace is None
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert server_args_from(parser.parse_args(["--record-trace", "t.jsonl"]), environ={}).record_trace == "t.jsonl"
    path = tmp_path / "generate.trace.jsonl"
    assert (
        main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "3", "--record-trace", str(path)])
        == 0
    )
    s = _core.replay_trace(path)
    assert s["ok"] and s["same"] and s["requests"] == 1 and s["generated_tokens"] == 3, s["report"]


def _env_without_log() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "FERROLM_LOG"}
