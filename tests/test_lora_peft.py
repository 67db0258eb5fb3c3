"""Adapters written by peft itself (``get_peft_model`` + ``save_pretrained``) on small random
checkpoints written by transformers: ferrolm's greedy tokens equal transformers' with
the adapter merged (``merge_and_unload``), for every target-module set, on the numpy and
the torch runner; the quant runner's logits (2-byte weights) are within their rounding.

The same behaviour without torch: ``test_lora.py`` (adapters in PEFT's format written by
``ferrolm.bench.lora``, against the merged weights)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm.engine import Engine
from ferrolm.model.loader import load_model
from ferrolm.model.lora import registry_for
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.runner import ForwardBatch
from ferrolm.sampling_params import SamplingParams

torch: Any = pytest.importorskip("torch", reason="torch is not installed; peft's adapters are checked without it")
transformers: Any = pytest.importorskip("transformers", reason="transformers is not installed")
peft: Any = pytest.importorskip("peft", reason="peft is not installed (make test installs it with torch)")

from test_model_transformers import COMMON, VOCAB, randomize, write_tokenizer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (architecture, LoraConfig settings)
ADAPTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "attention-qv": ("llama", {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}),
    "all-linear": ("llama", {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}),
    "mlp-rslora": (
        "llama",
        {"r": 16, "lora_alpha": 8, "target_modules": ["gate_proj", "up_proj", "down_proj"], "use_rslora": True},
    ),
    "ko-rank-pattern": (
        "qwen2",
        {"r": 4, "lora_alpha": 8, "target_modules": ["k_proj", "o_proj"], "rank_pattern": {"o_proj": 2}},
    ),
    "some-layers": ("qwen2", {"r": 4, "lora_alpha": 4, "target_modules": ALL, "layers_to_transform": [1]}),
}
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 1}),
}
PROMPT = [int(i) for i in np.random.default_rng(31).integers(3, VOCAB, 14)]
NEW_TOKENS = 16


@dataclass
class Written:
    base: Path
    adapter: Path
    greedy: list[int]  # transformers' greedy continuation of PROMPT, adapter merged
    logits: np.ndarray  # its logits of every position of PROMPT
    base_greedy: list[int]


@pytest.fixture(scope="module", params=list(ADAPTERS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Written:
    arch, settings = ADAPTERS[request.param]
    config_class, model_class, extra = ARCHITECTURES[arch]
    root = tmp_path_factory.mktemp(request.param)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**(COMMON | extra)))
    randomize(model, seed=4)
    model.save_pretrained(root / "base")
    write_tokenizer(root / "base")
    lora = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **settings))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # updates that matter: the adapter changes the greedy tokens
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * math.sqrt(3 / p.shape[1]))
    lora.save_pretrained(root / "adapter")
    merged = lora.merge_and_unload().eval()
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        logits = merged(ids).logits[0].double().numpy()
        out = merged.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    base = getattr(transformers, model_class).from_pretrained(root / "base").eval()
    with torch.no_grad():
        base_out = base.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return Written(
        root / "base", root / "adapter", out[0, len(PROMPT) :].tolist(), logits, base_out[0, len(PROMPT) :].tolist()
    )


def until_eos(ids: list[int]) -> list[int]:
    """transformers' tokens as the engine gives them: up to its EOS (2), included."""
    return ids[: ids.index(2) + 1] if 2 in ids else ids


@pytest.mark.parametrize("runner", ["numpy", "torch"])
def test_greedy_tokens_equal_transformers_with_the_adapter_merged(written: Written, runner: str) -> None:
    engine = Engine(
        str(written.base),
        runner=runner,
        device="cpu",
        kv_capacity=256,
        kv_cache_dtype="float32",
        lora_modules={"adapter": str(written.adapter)},
    )
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    assert written.greedy != written.base_greedy, "the adapter changes the output"
    assert list(engine.generate(PROMPT, params, lora="adapter")[0].token_ids) == until_eos(written.greedy)
    assert list(engine.generate(PROMPT, params)[0].token_ids) == until_eos(written.base_greedy)


def test_the_quant_runner_is_within_its_weights_rounding(written: Written) -> None:
    loaded = load_model(written.base)
    registry = registry_for(loaded.config, 1)
    registry.load("adapter", str(written.adapter))
    from ferrolm import _core

    quant = QuantRunner.from_folder(written.base, loaded.config, 64, dtype="float16", kv_cache_dtype="float32")
    b = ForwardBatch.from_requests([PROMPT], [list(range(len(PROMPT)))])
    batch = ForwardBatch(
        b.input_ids,
        b.positions,
        b.out_slots,
        b.qo_offsets,
        b.kv_slots,
        b.kv_offsets,
        loras=_core.StepLoras([registry.acquire("adapter")]),
    )
    logits = quant.forward(batch, all_logits=True)
    # float16 weights: a share of the logits' range. These adapters move every projection's
    # output by about its own size, which carries the weights' rounding further than the
    # base model alone does (measured: 0.2% against its 0.04%; bfloat16 8x both, as its
    # rounding is 8x float16's: rounding, not a misplaced update, which would not scale)
    spread = float(written.logits.max() - written.logits.min())
    assert float(np.abs(logits - written.logits).max()) <= 0.005 * spread
    plain = ForwardBatch.from_requests([PROMPT], [list(range(64 - len(PROMPT), 64))])
    without = quant.forward(plain, all_logits=True)
    assert float(np.abs(without - written.logits).max()) > 0.01 * spread, "the adapter matters"
