"""``ferrolm.Engine`` on the torch runner (CPU, float32): greedy outputs token for token
those of the numpy runner's reference run (each prompt alone, cache off), with the prefix
cache on and off, chunked prefill, and retraction under KV pressure; the ways to ask for
the torch runner (an object, ``runner="torch"`` on a loaded model or on a model name,
which reads the checkpoint straight into torch); bf16 end to end."""

from __future__ import annotations

from typing import Any

import pytest

from ferrolm import SamplingParams
from ferrolm.engine import Engine
from ferrolm.model import LoadedModel

torch: Any = pytest.importorskip("torch", reason="torch is not installed; the torch runner tests are skipped")

from ferrolm.model.torch_runner import TorchRunner  # noqa: E402
from small_models import TORCH_TEST_DEVICE  # noqa: E402
from test_engine_identity import GREEDY, PROMPTS, reference, run_batch  # noqa: E402,F401 (reference: a fixture)


def torch_engine(tiny: LoadedModel, kv_capacity: int = 4096, **kw: Any) -> Engine:
    return Engine(tiny, kv_capacity=kv_capacity, runner="torch", device=TORCH_TEST_DEVICE, **kw)


@pytest.mark.parametrize(
    ("settings", "shares_prefix", "retracts"),
    [
        pytest.param({}, False, False, id="batch-cache-on"),
        pytest.param({"enable_prefix_cache": False}, False, False, id="batch-cache-off"),
        # later prompts are admitted once earlier ones have cached the shared prefix
        pytest.param({"max_prefill_tokens": 7}, True, False, id="batch-chunked-7"),
        pytest.param({"kv_capacity": 96, "max_prefill_tokens": 7}, True, True, id="retraction-kv96-chunked-7"),
        pytest.param({"kv_capacity": 80, "enable_prefix_cache": False}, False, True, id="retraction-kv80-cache-off"),
    ],
)
def test_torch_runner_greedy_equals_the_numpy_reference(
    tiny: LoadedModel, reference: list[list[int]], settings: dict, shares_prefix: bool, retracts: bool
) -> None:
    engine = torch_engine(tiny, **settings)
    assert isinstance(engine.runner, TorchRunner) and engine.runner.dtype == torch.float32
    assert run_batch(engine, PROMPTS, GREEDY) == reference
    stats = engine.core.stats()
    assert (stats["cache_hit_tokens"] > 0) == shares_prefix, stats
    assert (stats["retractions"] > 0) == retracts, stats
    assert stats["errors"] == 0, stats


def test_warm_cache_then_repeat_equals_the_reference(tiny: LoadedModel, reference: list[list[int]]) -> None:
    engine = Engine(tiny, kv_capacity=4096, runner=TorchRunner(tiny.config, tiny.weights, 4096, device=TORCH_TEST_DEVICE))
    assert [run_batch(engine, [p], GREEDY)[0] for p in PROMPTS] == reference
    hits = engine.core.stats()["cache_hit_tokens"]
    assert hits > 0
    assert run_batch(engine, PROMPTS, GREEDY) == reference
    assert engine.core.stats()["cache_hit_tokens"] > hits


def test_model_by_name_is_read_straight_into_torch(reference: list[list[int]]) -> None:
    engine = Engine("tiny", kv_capacity=512, runner="torch", device=TORCH_TEST_DEVICE, dtype="float32")
    assert isinstance(engine.runner, TorchRunner)
    [result] = engine.generate(PROMPTS[0], GREEDY)
    assert result.token_ids == reference[0]


def test_bf16_runs_end_to_end_with_a_bf16_pool(tiny: LoadedModel) -> None:
    engine = Engine("tiny", kv_capacity=512, device=TORCH_TEST_DEVICE, dtype="bfloat16")  # auto: bf16 needs torch
    assert isinstance(engine.runner, TorchRunner) and engine.runner.k_pool[0].dtype == torch.bfloat16
    results = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [8, 8, 8]
    assert all(r.finish_reason == "length" for r in results)


def test_generate_command_on_the_torch_runner_prints_what_numpy_prints(capsys: pytest.CaptureFixture) -> None:
    from ferrolm.cli import main

    flags = ["generate", "--prompt", "Once upon a time", "--max-new-tokens", "6", "--ignore-eos"]
    assert main([*flags, "--runner", "numpy"]) == 0
    on_numpy = capsys.readouterr().out
    assert main([*flags, "--runner", "torch", "--device", TORCH_TEST_DEVICE, "--dtype", "float32"]) == 0
    assert capsys.readouterr().out == on_numpy
    assert "[length, 6 tokens]" in on_numpy
