"""``ferrolm bench gpu`` and ``scripts/gpu_check.sh --smoke`` on the CPU with the tiny
config, so the GPU check cannot rot where there is no GPU. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ferrolm.cli import main

torch: Any = pytest.importorskip("torch", reason="torch is not installed; the GPU benchmark needs it")

ROOT = Path(__file__).resolve().parent.parent


def test_bench_gpu_reports_each_batch_against_the_bandwidth_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "gpu.json"
    code = main(
        [
            "bench",
            "gpu",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--batches",
            "1,3",
            "--context",
            "20",
            "--steps",
            "3",
            "--bandwidth-gbs",
            "10",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "bandwidth 10 GB/s (given)" in printed
    assert printed.count("device sampler (top-p, logprobs)") == 2
    assert [line.split(":")[0] for line in printed.splitlines() if line.startswith("batch")] == [
        "batch    1",
        "batch    3",
    ]
    figures = json.loads(out.read_text())
    assert [r["batch"] for r in figures["results"]] == [1, 3]
    for row in figures["results"]:
        assert row["tokens_per_s"] > 0 and 0 < row["fraction_of_limit"] and row["sampler_ms"] > 0
        # bytes read per step: the weights, plus more KV for the larger batch
        assert row["bytes_per_step"] > figures["weight_bytes"]
    assert figures["results"][1]["bytes_per_step"] > figures["results"][0]["bytes_per_step"]


def test_gpu_check_script_smoke_mode_runs_on_the_cpu() -> None:
    env = os.environ | {"PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--smoke", "--bandwidth-gbs", "10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "device cpu" in done.stdout and "batch    4:" in done.stdout
