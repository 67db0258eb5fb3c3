"""LoRA adapters (PEFT's files) on every runner and in the engine: an adapter's forward
equals the base model with the adapter merged into its weights; a batch mixing adapters
and the base model gives each request what it gets alone; the scheduler mixes at most
``max_loras`` adapters in a step; adapters load, unload and are evicted under load without
leaking KV or weights; bad adapter files are refused naming the file; each adapter's
prefixes are cached apart and its KV events name it.

The adapters here are written by ``lora_files`` (PEFT's format, without torch);
``test_lora_peft.py`` checks adapters written by peft itself against transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_engine
from ferrolm import _core
from ferrolm.engine import deltas_of
from ferrolm.errors import InvalidInputError, LoraNotFoundError
from ferrolm.kv_wire import wire_event
from ferrolm.model.lora import registry_for
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.random_weights import random_weights
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from ferrolm.sampling_params import SamplingParams
from lora_files import ALL_TARGETS, ATTENTION, MLP, merged, write_peft_adapter
from small_models import small_config

# float32 forwards of the same weights in another association order
TOLERANCE = 1e-4
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def batch(requests: list[list[int]], loras: list[Any] | None = None) -> ForwardBatch:
    """Prefills of ``requests`` in one batch, slots one after another; each request's
    adapter from ``loras`` (None: the base model)."""
    slots, start = [], 0
    for ids in requests:
        slots.append(list(range(start, start + len(ids))))
        start += len(ids)
    b = ForwardBatch.from_requests(requests, slots)
    step_loras = None if loras is None else _core.StepLoras(loras)
    return ForwardBatch(b.input_ids, b.positions, b.out_slots, b.qo_offsets, b.kv_slots, b.kv_offsets, loras=step_loras)


def prompt(seed: int, length: int = 9) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 90, length)]


@pytest.mark.parametrize(
    ("variant", "targets", "rslora"),
    [
        ("llama3", ALL_TARGETS, False),
        ("llama-biases", ATTENTION, True),
        ("qwen2", ("q_proj", "v_proj"), False),
        ("qwen3", MLP, False),
        ("mistral", ("k_proj", "o_proj", "down_proj"), True),
    ],
)
def test_an_adapter_is_its_merged_weights(tmp_path: Path, variant: str, targets: tuple[str, ...], rslora: bool) -> None:
    config = small_config(variant)
    weights = random_weights(config, seed=5)
    parts = write_peft_adapter(tmp_path / "a", config, targets, use_rslora=rslora, seed=1)
    registry = registry_for(config, 2)
    registry.load("a", str(tmp_path / "a"))
    adapter = registry.acquire("a")
    assert adapter.targets == [t for t in ALL_TARGETS if t in targets]
    requests = [prompt(1), prompt(2, 5)]
    with_adapter = batch(requests, [adapter, adapter])
    expected = NumpyRunner(config, merged(weights, parts), 64).forward(batch(requests), all_logits=True)
    base = NumpyRunner(config, weights, 64).forward(batch(requests), all_logits=True)
    # the adapter moves the logits far beyond the tolerance: a test that can fail
    assert np.abs(expected - base).max() > 100 * TOLERANCE
    actual = NumpyRunner(config, weights, 64).forward(with_adapter, all_logits=True)
    np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=0)
    # the quant runner (the Rust core's kernel) over 2-byte weights: its own base's
    # rounding, and the adapter's update added exactly
    quant = QuantRunner.from_weights(config, weights, 64, dtype="float16", kv_cache_dtype="float32")
    quant_merged = QuantRunner.from_weights(
        config, merged(weights, parts), 64, dtype="float16", kv_cache_dtype="float32"
    )
    got = quant.forward(with_adapter, all_logits=True)
    want = quant_merged.forward(batch(requests), all_logits=True)
    # f16 rounds W and W + BA differently: a difference of the weights' rounding
    assert np.abs(got - want).max() < 2e-2
    assert np.abs(got - expected).max() < 2e-2


@pytest.mark.parametrize("runner", ["numpy", "quant"])
def test_a_mixed_batch_gives_each_request_what_it_gets_alone(tmp_path: Path, runner: str) -> None:
    config = small_config("llama3")
    weights = random_weights(config, seed=7)
    registry = registry_for(config, 4)
    write_peft_adapter(tmp_path / "a", config, ALL_TARGETS, seed=2)
    write_peft_adapter(tmp_path / "b", config, ("q_proj", "v_proj", "down_proj"), rank=8, seed=3)
    registry.load("a", str(tmp_path / "a"))
    registry.load("b", str(tmp_path / "b"))
    a, b = registry.acquire("a"), registry.acquire("b")
    # 31 tokens: the quant runner's steps of 32 and more multiply in floats (its prefill
    # path), those below with integer dots; kept on one path, alone and together
    requests = [prompt(3), prompt(4, 6), prompt(5, 5), prompt(6, 4), prompt(7, 7)]
    loras = [a, None, b, a, None]

    def make() -> Any:
        if runner == "numpy":
            return NumpyRunner(config, weights, 128)
        return QuantRunner.from_weights(config, weights, 128, quantization="q8_0", kv_cache_dtype="float32")

    tolerance = TOLERANCE if runner == "numpy" else 1e-6
    together = make().forward(batch(requests, loras), all_logits=True)
    offsets = np.cumsum([0] + [len(r) for r in requests])
    for i, (ids, lora) in enumerate(zip(requests, loras, strict=True)):
        alone = make().forward(batch([ids], [lora]), all_logits=True)
        # the quant runner's kernels give a row the same floats in any batch; numpy's BLAS
        # may sum a batch's products in another order than one request's
        np.testing.assert_allclose(together[offsets[i] : offsets[i + 1]], alone, atol=tolerance, rtol=0)
    # and the adapters do change what their requests get
    base_alone = make().forward(batch([requests[0]]), all_logits=True)
    assert np.abs(together[: offsets[1]] - base_alone).max() > 1e-2


@pytest.fixture
def adapters(tmp_path: Path, tiny: Any) -> dict[str, Path]:
    """Three adapters of the embedded tiny model."""
    out = {}
    for i, (name, targets) in enumerate([("alpha", ALL_TARGETS), ("beta", ATTENTION), ("gamma", MLP)]):
        write_peft_adapter(tmp_path / name, tiny.config, targets, seed=10 + i, size=2.0)
        out[name] = tmp_path / name
    return out


def tokens(engine: Any, ids: list[int], lora: str | None) -> list[int]:
    return list(engine.generate(ids, GREEDY, lora=lora)[0].token_ids)


def test_the_engine_runs_each_request_with_its_adapter(tiny: Any, adapters: dict[str, Path]) -> None:
    engine = make_engine(tiny, lora_modules={k: str(v) for k, v in adapters.items()})
    ids = prompt(8, 12)
    alone = {name: tokens(engine, ids, name) for name in (None, "alpha", "beta", "gamma")}
    assert len({tuple(t) for t in alone.values()}) == 4, "each adapter changes the output"
    # all four at once (one batch), each as alone
    results = engine.generate([ids] * 4, GREEDY)  # the base model, batched
    assert all(list(r.token_ids) == alone[None] for r in results)
    rids = {name: engine.submit(ids, GREEDY, lora=name) for name in ("alpha", None, "gamma", "beta")}
    out: dict[int, list[int]] = {rid: [] for rid in rids.values()}
    while engine.has_work():
        for d in engine.step():
            out[d.rid] += list(d.token_ids)
    for name, rid in rids.items():
        assert out[rid] == alone[name], name
    # everything finished, every slot back with the cache (namespaces: the KV events test)
    stats = engine.core.stats()
    assert stats["running"] == 0 and stats["kv_used"] == stats["cached_tokens"]


def test_a_step_mixes_at_most_max_loras_adapters(tiny: Any, adapters: dict[str, Path]) -> None:
    engine = make_engine(tiny, lora_modules={k: str(v) for k, v in adapters.items()}, max_loras=2)
    ids = prompt(9)
    expected = {name: tokens(engine, ids, name) for name in (*adapters, None)}
    rids = {engine.submit(ids, GREEDY, lora=name): name for name in [*adapters, *adapters, None]}
    out: dict[int, list[int]] = {rid: [] for rid in rids}
    mixes = []
    while engine.core.has_work():
        plan = engine.core.schedule()
        if len(plan) == 0:
            engine.core.take_outputs()
            continue
        loras = plan.loras.ids.tolist() if plan.loras is not None else []
        mixes.append(len(set(loras) - {0}))
        for d in deltas_of(engine.loop.step(plan)):
            out[d.rid] += list(d.token_ids)
    assert max(mixes) == 2, "two adapters share steps, the third waits"
    for rid, name in rids.items():
        assert out[rid] == expected[name], name


def test_eviction_and_unloading_under_load_leak_nothing(tiny: Any, adapters: dict[str, Path]) -> None:
    engine = make_engine(tiny, lora_modules={k: str(v) for k, v in adapters.items()}, max_loras=1, max_cpu_loras=1)
    registry = engine.loras
    ids = prompt(11, 10)
    expected = {name: tokens(engine, ids, name) for name in adapters}
    reads = registry.reads
    # rounds through the three adapters with room for one: each is dropped and read again
    for _ in range(2):
        for name in adapters:
            assert tokens(engine, ids, name) == expected[name]
    assert registry.reads >= reads + 5
    registry.trim()
    assert registry.resident <= 1
    # unloaded while a request runs with it: that request finishes with its weights
    rid = engine.submit(ids, GREEDY, lora="beta")
    got: list[int] = []
    for d in engine.step():
        got += list(d.token_ids) if d.rid == rid else []
    engine.unload_lora_adapter("beta")
    while engine.has_work():
        for d in engine.step():
            got += list(d.token_ids) if d.rid == rid else []
    assert got == expected["beta"]
    with pytest.raises(LoraNotFoundError, match="beta"):
        engine.generate(ids, GREEDY, lora="beta")
    assert "beta" not in registry and len(registry.list()) == 2
    stats = engine.core.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_used"] == stats["cached_tokens"], "every slot is the cache's: none leaked"


def test_bad_adapters_are_refused_naming_the_file(tmp_path: Path, tiny: Any) -> None:
    config = tiny.config
    registry = registry_for(config, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="adapter_config.json") as e:
        registry.load("x", str(tmp_path / "empty"))
    assert e.value.field == "lora_path"
    # an adapter of another model's size
    other = small_config("llama3", hidden_size=32)
    write_peft_adapter(tmp_path / "other", other, ("q_proj",))
    with pytest.raises(InvalidInputError, match=r"adapter_model\.safetensors.*q_proj"):
        registry.load("x", str(tmp_path / "other"))
    # a module ferrolm does not adapt
    write_peft_adapter(tmp_path / "head", config, ("q_proj",))
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(tmp_path / "head" / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = np.zeros((4, config.hidden_size), np.float32)
    save_file(tensors, str(tmp_path / "head" / "adapter_model.safetensors"))
    with pytest.raises(InvalidInputError, match="lm_head"):
        registry.load("x", str(tmp_path / "head"))
    # PyTorch's pickle only
    write_peft_adapter(tmp_path / "bin", config, ("q_proj",))
    (tmp_path / "bin" / "adapter_model.safetensors").rename(tmp_path / "bin" / "adapter_model.bin")
    with pytest.raises(InvalidInputError, match="adapter_model.bin"):
        registry.load("x", str(tmp_path / "bin"))
    # DoRA is not plain LoRA
    write_peft_adapter(tmp_path / "dora", config, ("q_proj",), extra_config={"use_dora": True})
    with pytest.raises(InvalidInputError, match="use_dora"):
        registry.load("x", str(tmp_path / "dora"))
    assert registry.list() == []
    with pytest.raises(LoraNotFoundError):
        registry.acquire("x")


def test_each_adapter_caches_its_own_prefixes_and_its_events_name_it(tiny: Any, adapters: dict[str, Path]) -> None:
    engine = make_engine(
        tiny, lora_modules={k: str(v) for k, v in adapters.items()}, enable_kv_events=True, kv_event_block_size=4
    )
    ids = prompt(12, 17)
    for lora in (None, "alpha", "beta"):
        tokens(engine, ids, lora)
    assert engine.core.stats()["cache_hit_tokens"] == 0, "no prefix is shared across adapters"
    tokens(engine, ids, "alpha")
    assert engine.core.stats()["cache_hit_tokens"] == 16
    stored = [e for e in engine.core.take_kv_events() if e[0] == "stored"]
    wire = [wire_event(raw) for raw in stored]
    named = {(w["lora_id"], w["lora_name"]) for w in wire}
    assert named == {(None, None), (1, "alpha"), (2, "beta")}
    # the same tokens hash differently under each adapter
    first = {w["lora_name"]: w["block_hashes"][0] for w in wire if w["parent_block_hash"] is None}
    assert len(set(first.values())) == 3
    assert all(w["extra_keys"] == [None] * len(w["block_hashes"]) for w in wire)


def test_generate_runs_the_prompts_with_an_adapter(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from ferrolm.cli import main

    argv = ["generate", "--model", "tiny", "--prompt", "Once upon a time", "--max-new-tokens", "12"]
    assert main(argv) == 0
    base = capsys.readouterr().out
    assert main([*argv, "--lora-modules", f"alpha={adapters['alpha']}", "--lora", "alpha"]) == 0
    adapted = capsys.readouterr().out
    assert adapted.startswith("Once upon a time") and adapted != base
    assert main([*argv, "--lora-modules", f"alpha={adapters['alpha']}", "--lora", "beta"]) == 2
    assert 'LoRA adapter "beta" is not loaded' in capsys.readouterr().err
