"""Smoke test of ``ferrolm bench attention``: it runs both paths on its quick cases and
prints a ratio per case (no timing checked)."""

from __future__ import annotations

import pytest
from ferrolm.cli import main


def test_bench_attention_quick_prints_a_ratio_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "attention", "--quick", "--budget", "0"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("decode", "prefill"))]
    assert len(rows) == 3
    assert all(row.count("x") >= 2 for row in rows)
    assert "geometric mean ratio (float16 pool)" in out
