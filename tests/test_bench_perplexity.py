"""``ferrolm bench perplexity``: the NLL arithmetic against a direct softmax, and a run on
a GGUF the test writes (a chunk scored, a finite perplexity printed)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from ferrolm.bench.perplexity import chunk_nll
from ferrolm.cli import main
from gguf_files import wide_tiny, write_tiny_gguf


def test_chunk_nll_is_the_negative_log_softmax_of_the_target() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]], dtype=np.float32)
    targets = np.array([2, 1])
    want = [-math.log(math.exp(3) / (math.exp(1) + math.exp(2) + math.exp(3))), 1000.0]
    np.testing.assert_allclose(chunk_nll(logits, targets), want, rtol=1e-9)


@pytest.fixture
def model_and_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A GGUF the test writes and a text of several 64-token chunks."""
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(wide_tiny(tmp_path / "wide"), path)
    text = tmp_path / "text.txt"
    text.write_text("It was the best of times, it was the worst of times. " * 20, encoding="utf-8")
    return path, text


def test_perplexity_run_prints_a_running_estimate_and_the_result(
    model_and_text: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, text = model_and_text
    assert main(["bench", "perplexity", "--model", str(path), "--text", str(text), "--ctx", "64"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\[1\][\d.]+", out, re.M)
    ppl = _ppl(out)
    assert ppl > 1.0 and math.isfinite(ppl)  # a random model: confidently wrong, so large


def _ppl(out: str) -> float:
    return float(re.search(r"PPL = ([\d.]+) over", out).group(1))  # type: ignore[union-attr]


def test_a_chunk_run_in_steps_scores_as_the_whole_chunk_on_a_float_runner(
    model_and_text: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # the numpy runner computes every step in float32: steps of 7 tokens over the cached
    # part of the chunk give the chunk's logits, up to summation order
    path, text = model_and_text
    base = ["bench", "perplexity", "--model", str(path), "--text", str(text), "--ctx", "64", "--runner", "numpy"]
    assert main(base) == 0
    whole = _ppl(capsys.readouterr().out)
    assert main([*base, "--ubatch", "7"]) == 0
    out = capsys.readouterr().out
    assert "steps of 7 tokens" in out
    assert math.isclose(_ppl(out), whole, rel_tol=1e-4)
    assert main([*base, "--ubatch", "0"]) == 2  # a clear error, not a traceback
    assert "--ubatch must be positive" in capsys.readouterr().err
