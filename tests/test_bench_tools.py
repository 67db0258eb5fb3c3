"""Smoke test of ``ferrolm bench tools``: both ways run and print their counts (no timing
checked); constrained, every call parses."""

from __future__ import annotations

import pytest
from ferrolm.cli import main


def test_bench_tools_quick_prints_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tools", "--quick", "--max-tokens", "48"]) == 0
    out = capsys.readouterr().out
    assert "constrained  : 4/4 calls parse, 4/4 valid for the schema" in out
    assert "parser only  : " in out and "us per delta" in out
    assert "several calls: 4/4 answers complete" in out
