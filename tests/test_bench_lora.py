"""Smoke test of ``ferrolm bench lora`` on a GGUF the test writes (the quant runner, as the
bench's default model runs): each round's two speeds and their ratio, the median, and
the load while serving, with its report as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ferrolm.cli import main
from gguf_files import wide_tiny, write_tiny_gguf


def test_bench_lora_prints_a_ratio_per_round_and_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(wide_tiny(tmp_path / "wide"), path)
    report = tmp_path / "lora.json"
    argv = ["bench", "lora", "--model", str(path), "--requests", "4", "--adapters", "2", "--rank", "4"]
    argv += ["--prompt-tokens", "8", "--max-tokens", "24", "--rounds", "2", "--json", str(report)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rounds = [line for line in out.splitlines() if line.startswith("round")]
    assert len(rounds) == 2
    assert all(re.search(r"base [\d.]+ tok/s, 2 adapters [\d.]+ tok/s, ratio \d+\.\d{3}", r) for r in rounds)
    assert re.search(r"with 2 adapters over the base model: \d+\.\d{3}x", out)
    assert re.search(r"load while serving: the adapter took [\d.]+ ms to read", out)
    data = json.loads(report.read_text())
    assert data["adapters"] == 2 and len(data["rounds"]) == 2 and data["ratio"] > 0
