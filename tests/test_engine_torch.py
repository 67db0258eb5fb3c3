"""``ferrolm.Engine`` on the torch runner (CPU, float32): greedy outputs token for token
those of the numpy runner's reference run (each prompt alone, cache off), with the prefix
cache on and off, chunked prefill, and retraction under KV pressure; the ways to ask for
the torch runner (an object, ``runner="torch"`` on a loaded model or on a model name,
which reads the checkpoint straight into torch); bf16 end to end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from ferrolm import SamplingParams
from ferrolm.engine import Engine
from ferrolm.model import LoadedModel

torch: Any = pytest.importorskip("torch", reason="torch is not installed; the torch runner tests are skipped")

from ferrolm.model.torch_runner import TorchRunner  # noqa: E402
from small_models import TORCH_TEST_DEVICE  # noqa: E402
from test_engine_identity import GREEDY, PROMPTS, reference, run_batch  # noqa: E402,F401 (reference: a fixture)


def torch_engine(tiny: LoadedModel, kv_capacity: int = 4096, **kw: Any) -> Engine:
    # a float32 pool: these compare with the numpy runner's float32 reference token for token
    kw.setdefault("kv_cache_dtype", "float32")
    # greedy tokens picked by the runner, as on a GPU (the default only off the CPU)
    kw.setdefault("device_greedy", True)
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
    # every step's greedy tokens were picked on the runner's device (ignoring EOS there)
    assert engine.device_greedy_steps > 0
    stats = engine.core.stats()
    assert (stats["cache_hit_tokens"] > 0) == shares_prefix, stats
    assert (stats["retractions"] > 0) == retracts, stats
    assert stats["errors"] == 0, stats


def test_warm_cache_then_repeat_equals_the_reference(tiny: LoadedModel, reference: list[list[int]]) -> None:
    engine = Engine(
        tiny, kv_capacity=4096, runner=TorchRunner(tiny.config, tiny.weights, 4096, device=TORCH_TEST_DEVICE)
    )
    assert [run_batch(engine, [p], GREEDY)[0] for p in PROMPTS] == reference
    hits = engine.core.stats()["cache_hit_tokens"]
    assert hits > 0
    assert run_batch(engine, PROMPTS, GREEDY) == reference
    assert engine.core.stats()["cache_hit_tokens"] > hits


def test_model_by_name_is_read_straight_into_torch(reference: list[list[int]]) -> None:
    engine = Engine(
        "tiny", kv_capacity=512, runner="torch", device=TORCH_TEST_DEVICE, dtype="float32", kv_cache_dtype="float32"
    )
    assert isinstance(engine.runner, TorchRunner)
    [result] = engine.generate(PROMPTS[0], GREEDY)
    assert result.token_ids == reference[0]


def test_bf16_runs_end_to_end_with_a_bf16_pool(tiny: LoadedModel) -> None:
    engine = Engine(
        "tiny",
        kv_capacity=512,
        runner="torch",  # auto: bf16 on the CPU is the quant runner's
        device=TORCH_TEST_DEVICE,
        dtype="bfloat16",
        kv_cache_dtype="bfloat16",
    )
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


def test_device_greedy_off_and_a_sampled_request_beside_greedy_ones(
    tiny: LoadedModel, reference: list[list[int]]
) -> None:
    """Logits to the host and the core's sampler, as with the numpy runner: with
    device_greedy off, and in every step where a request that samples runs beside the
    greedy ones (the step falls back as a whole); greedy outputs are the same either way."""
    off = torch_engine(tiny, device_greedy=False)
    assert run_batch(off, PROMPTS, GREEDY) == reference
    assert off.device_greedy_steps == 0

    mixed = torch_engine(tiny)
    sampled = SamplingParams(temperature=1.0, seed=3, max_new_tokens=4, ignore_eos=True)
    rids = [mixed.submit(p, GREEDY) for p in PROMPTS[:3]] + [mixed.submit(PROMPTS[3], sampled)]
    out: dict[int, list[int]] = {rid: [] for rid in rids}
    steps = 0
    while mixed.has_work():
        for d in mixed.step():
            out[d.rid] += d.token_ids
        steps += 1
    assert [out[r] for r in rids[:3]] == reference[:3]
    # the sampled request's 4 tokens took logits to the host; the greedy ones' tail did not
    assert 0 < mixed.device_greedy_steps < steps
    numpy_engine = Engine(tiny, kv_capacity=4096, runner="numpy", kv_cache_dtype="float32")
    [again] = numpy_engine.generate(PROMPTS[3], sampled)
    assert out[rids[3]] == again.token_ids  # the same seeded draws from the same logits


def test_device_sampling_end_to_end_gives_what_the_cores_sampler_gives(tiny: LoadedModel) -> None:
    """Every token drawn on the runner's device (penalties, bias, a JSON schema's masks,
    seeds, logprobs): the same outputs as the numpy runner with the core's sampler, since
    a seeded plain-temperature draw uses the same uniform in the same token order, and
    the float32 logits of the two runners differ by far less than what would move a
    draw across a boundary here."""
    on_device = torch_engine(tiny, device_sampling=True)
    by_default = Engine(tiny, kv_capacity=64, runner="torch", device="cpu")
    assert not by_default.device_sampling and not by_default.device_greedy, "off by default on the CPU"
    numpy_engine = Engine(tiny, kv_capacity=4096, runner="numpy", kv_cache_dtype="float32")
    params = [
        SamplingParams(temperature=0.8, seed=11, max_new_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=3),
        SamplingParams(
            temperature=0.0,
            max_new_tokens=12,
            repetition_penalty=1.4,
            frequency_penalty=0.5,
            logit_bias={100: 5.0},
            min_new_tokens=4,
        ),
        SamplingParams(
            temperature=0.7,
            seed=5,
            max_new_tokens=40,
            json_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        ),
    ]
    got = [on_device.generate(prompt, p)[0] for prompt, p in zip(PROMPTS, params)]
    want = [numpy_engine.generate(prompt, p)[0] for prompt, p in zip(PROMPTS, params)]
    assert on_device.device_sampling_steps > 0 and on_device.device_greedy_steps == 0
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4, equal_nan=True)
    assert len(got[0].top_logprobs[0]) == 3
    assert '"n":' in got[2].text.replace(" ", "")


def test_forward_greedy_is_the_argmax_of_forward_with_eos_masked_where_ignored() -> None:
    from ferrolm.model.random_weights import random_weights
    from ferrolm.model.runner import ForwardBatch
    from small_models import small_config

    config = small_config("qwen2")
    runner = TorchRunner(config, random_weights(config, seed=9), 64, device=TORCH_TEST_DEVICE)
    batch = ForwardBatch.from_requests([[5, 6, 7], [8], [9, 10]], [[0, 1, 2], [3], [4, 5]])
    logits = runner.forward(batch)
    best = logits.argmax(-1)
    again = ForwardBatch.from_requests([[5, 6, 7], [8], [9, 10]], [[10, 11, 12], [13], [14, 15]])
    assert runner.forward_greedy(again).tolist() == best.tolist()
    # the best token of row 0 and of row 2 as "EOS": masked only where EOS is ignored
    eos = [int(best[0]), int(best[2])]
    picked = runner.forward_greedy(batch, eos, np.array([True, True, False]))
    masked_row0 = logits[0].copy()
    masked_row0[eos] = -np.inf
    assert picked[0] == masked_row0.argmax() and picked[0] not in eos
    assert picked[2] == best[2] and picked.dtype == np.int32
    # only the first vocab_size logits count
    limited = runner.forward_greedy(batch, vocab_size=10)
    assert limited.tolist() == logits[:, :10].argmax(-1).tolist()


def test_pool_sized_from_memory_becomes_the_engines_kv_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferrolm.model import torch_runner as torch_runner_module

    total = 64 * 2**20  # a device reporting 64 MiB, 16 MiB of it in use (the CPU has no mem_get_info)
    monkeypatch.setattr(torch_runner_module, "device_memory", lambda device: (3 * total // 4, total))
    engine = Engine("tiny", runner="torch", device="cpu", mem_fraction_static=0.5, kv_cache_dtype="float32")
    per_slot = engine.config.kv_bytes_per_slot(itemsize=4)
    assert engine.runner.num_slots == engine.core.kv_capacity == (total // 2 - total // 4) // per_slot
    [result] = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(result.token_ids) == 4


def test_a_chat_under_its_prepared_grammar_is_never_picked_greedily_on_the_device(tiny: LoadedModel) -> None:
    # Engine.chat submits the request core's compiled grammar as such (not as SamplingParams
    # fields): the runner's argmax, which sees no mask, must not pick its tokens
    engine = torch_engine(tiny)
    tools = [{"type": "function", "function": {"name": "ping"}}]
    [answer] = engine.chat(
        [{"role": "user", "content": "hi"}],
        SamplingParams(max_new_tokens=64, temperature=0.0),
        tools=tools,
        tool_choice="required",
    )
    assert answer.finish_reason == "tool_calls" and [c.name for c in answer.tool_calls] == ["ping"], answer
    assert engine.device_greedy_steps == 0
