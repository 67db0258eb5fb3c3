"""Reading Hugging Face config.json files of the supported families, and refusing the rest
with an error that names the field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig, RopeScaling
from ferrolm.model.rope import inverse_frequencies
from small_models import SMALL_MODEL_OVERRIDES, small_config

# the fields that matter, as the released checkpoints write them
LLAMA2_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "vocab_size": 32000,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "rope_scaling": None,
    "torch_dtype": "float16",
}
LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": 128,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
QWEN2_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "tie_word_embeddings": True,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "max_window_layers": 24,
    "hidden_act": "silu",
}
QWEN3_06B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "hidden_act": "silu",
}
MISTRAL_7B: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 32000,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
RELEASED = {"llama2": LLAMA2_7B, "llama3.1": LLAMA31_8B, "qwen2": QWEN2_05B, "qwen3": QWEN3_06B, "mistral": MISTRAL_7B}


def test_llama2_defaults_fill_what_the_file_leaves_out() -> None:
    c = ModelConfig.from_dict(LLAMA2_7B)
    assert (c.model_type, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads) == ("llama", 4096, 32, 32, 32)
    assert c.head_dim == 128  # derived: 4096 / 32
    assert c.rope_theta == 10000.0 and c.rope_scaling is None
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    assert not (c.tie_word_embeddings or c.qk_norm or c.qkv_bias or c.o_bias or c.mlp_bias)
    assert c.sliding_window is None


def test_llama31_reads_llama3_rope_scaling_and_several_eos_ids() -> None:
    c = ModelConfig.from_dict(LLAMA31_8B)
    assert c.num_queries_per_kv == 4
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert c.eos_token_ids == (128001, 128008, 128009)
    assert c.max_position_embeddings == 131072


def test_qwen2_has_qkv_biases_and_ignores_an_unused_window() -> None:
    c = ModelConfig.from_dict(QWEN2_05B)
    assert c.qkv_bias and not c.o_bias and not c.qk_norm
    assert c.head_dim == 64 and c.tie_word_embeddings
    assert c.sliding_window is None  # use_sliding_window is false


def test_qwen3_has_qk_norm_and_an_explicit_head_dim() -> None:
    c = ModelConfig.from_dict(QWEN3_06B)
    assert c.qk_norm and not c.qkv_bias
    assert c.head_dim == 128 != c.hidden_size // c.num_heads
    assert c.rope_theta == 1e6 and isinstance(c.rope_theta, float)


def test_mistral_keeps_its_sliding_window() -> None:
    c = ModelConfig.from_dict(MISTRAL_7B)
    assert c.sliding_window == 4096 and c.num_kv_heads == 8


def test_model_type_may_come_from_architectures_alone() -> None:
    raw = {k: v for k, v in MISTRAL_7B.items() if k != "model_type"}
    assert ModelConfig.from_dict(raw).model_type == "mistral"


def test_transformers5_rope_parameters_are_read() -> None:
    raw = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    raw["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA31_8B["rope_scaling"]}
    assert ModelConfig.from_dict(raw) == ModelConfig.from_dict(LLAMA31_8B)


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_configs_round_trip_through_to_hf_dict(name: str) -> None:
    config = ModelConfig.from_dict(RELEASED[name])
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_hf_dict()))) == config


@pytest.mark.parametrize("variant", sorted(SMALL_MODEL_OVERRIDES))
def test_small_configs_round_trip_through_to_hf_dict(variant: str) -> None:
    config = small_config(variant)
    assert ModelConfig.from_dict(config.to_hf_dict()) == config


def test_from_folder_reads_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    assert ModelConfig.from_folder(tmp_path) == ModelConfig.from_dict(QWEN3_06B)


def test_from_folder_without_config_or_with_bad_json(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no config.json"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        ModelConfig.from_folder(tmp_path)


def test_llama3_scaling_slows_only_the_low_frequencies() -> None:
    scaled = ModelConfig.from_dict(LLAMA31_8B)
    plain = ModelConfig.from_dict({**LLAMA31_8B, "rope_scaling": None})
    ratio = inverse_frequencies(plain) / inverse_frequencies(scaled)
    wavelength = 2 * math.pi / inverse_frequencies(plain)
    high = wavelength < 8192 / 4  # shorter than original / high_freq_factor: kept
    low = wavelength > 8192 / 1  # longer than original / low_freq_factor: divided by factor
    np.testing.assert_allclose(ratio[high], 1.0)
    np.testing.assert_allclose(ratio[low], 8.0)
    middle = ~(high | low)
    assert middle.any() and ((ratio[middle] > 1.0) & (ratio[middle] < 8.0)).all()
    assert (np.diff(ratio) >= -1e-12).all()  # monotone from fast to slow dimensions


def _without(raw: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k != field}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({**LLAMA2_7B, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}, "model_type"),
        ({**_without(LLAMA2_7B, "model_type"), "architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({**LLAMA2_7B, "architectures": ["LlamaForSequenceClassification"]}, "architectures"),
        (_without(LLAMA2_7B, "hidden_size"), "hidden_size"),
        (_without(LLAMA2_7B, "num_hidden_layers"), "num_hidden_layers"),
        (_without(LLAMA2_7B, "intermediate_size"), "intermediate_size"),
        (_without(LLAMA2_7B, "vocab_size"), "vocab_size"),
        (_without(LLAMA2_7B, "num_attention_heads"), "num_attention_heads"),
        ({**LLAMA2_7B, "num_key_value_heads": 5}, "num_key_value_heads"),
        ({**LLAMA2_7B, "hidden_size": 4100}, "hidden_size"),
        ({**LLAMA2_7B, "head_dim": 127}, "head_dim"),
        ({**LLAMA2_7B, "vocab_size": -1}, "vocab_size"),
        ({**LLAMA2_7B, "num_hidden_layers": True}, "num_hidden_layers"),
        ({**LLAMA2_7B, "rms_norm_eps": "small"}, "rms_norm_eps"),
        ({**LLAMA2_7B, "hidden_act": "gelu"}, "hidden_act"),
        ({**LLAMA2_7B, "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({**LLAMA2_7B, "eos_token_id": "</s>"}, "eos_token_id"),
        ({**LLAMA2_7B, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_scaling.rope_type"),
        ({**LLAMA31_8B, "rope_scaling": {**LLAMA31_8B["rope_scaling"], "factor": None}}, "rope_scaling.factor"),
        (
            {**LLAMA31_8B, "rope_scaling": {**LLAMA31_8B["rope_scaling"], "high_freq_factor": 0.5}},
            "rope_scaling.high_freq_factor",
        ),
        ({**QWEN2_05B, "use_sliding_window": True}, "use_sliding_window"),
        ({**MISTRAL_7B, "sliding_window": 0}, "sliding_window"),
    ],
)
def test_unsupported_or_broken_config_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError, match=f"'{field}'"):
        ModelConfig.from_dict(raw)
