"""Smoke test of ``ferrolm bench quant`` on a GGUF the test writes: it prints the probe's
bandwidth, the weights a decode step reads and a ratio per case."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ferrolm.cli import main
from gguf_files import wide_tiny, write_tiny_gguf


def test_bench_quant_prints_bandwidth_and_a_ratio_per_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(wide_tiny(tmp_path / "wide"), path)
    argv = ["bench", "quant", "--model", str(path), "--budget", "0", "--batch", "2", "--context", "8"]
    assert main([*argv, "--prompt-tokens", "16", "--probe-mb", "16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"memory read bandwidth .*: [\d.]+ GB/s", out)
    assert re.search(r"[\d.]+ MB of weights read per decode step", out)
    rows = [line for line in out.splitlines() if line.startswith(("decode", "prefill"))]
    assert [r.split()[0] for r in rows] == ["decode", "decode", "prefill"]
    assert all(re.search(r"\s\d+\.\d\d(\s|$)", r) for r in rows)  # the numpy / quant ratio
    # a draft's verification, 1 + k rows in one forward, with a row's cost against a step
    verify = [line for line in out.splitlines() if line.startswith("verify")]
    assert [v.split()[1] for v in verify] == ["1+1", "1+2", "1+4", "1+8"]
    assert all(re.search(r"a draft row costs -?\d+\.\d\d of a step", v) for v in verify)
