"""``ferrolm bench engine`` runs in every mode, the device ones (``ids``: the core gets
greedy token ids through ``commit_tokens``; ``device``: it hands out the step's sampling
columns and gets sampled ids and logprobs) included. No timing is asserted."""

from __future__ import annotations

import pytest
from ferrolm.bench.engine import step_times
from ferrolm.cli import main


@pytest.mark.parametrize("mode", ["greedy", "top_p", "ids", "device"])
def test_each_mode_times_every_step(mode: str) -> None:
    times = step_times(batch=3, vocab=500, mode=mode, steps=4)
    assert times.shape == (4,) and (times > 0).all()


def test_the_command_prints_a_row_per_mode_and_the_ids_floor(capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "bench",
            "engine",
            "--vocab",
            "150000",
            "--batch",
            "64",
            "--steps",
            "3",
            "--skip-tiny",
            "--modes",
            "greedy",
            "ids",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines() if line.strip().startswith("150000")]
    assert [r[1] for r in rows] == ["greedy", "ids"]
    assert "commit_tokens (ids from the device) <= 1.0 ms per step at batch 64" in printed


def test_the_device_row_is_printed_beside_the_cpu_samplers_top_p_row(capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "bench",
            "engine",
            "--vocab",
            "150000",
            "--batch",
            "64",
            "--steps",
            "3",
            "--skip-tiny",
            "--modes",
            "top_p",
            "device",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines() if line.strip().startswith("150000")]
    assert [r[1] for r in rows] == ["top_p", "device"]
    assert "top-p sampling at vocab 150000, batch 64: core CPU time per step" in printed
    assert "with the device sampler" in printed
