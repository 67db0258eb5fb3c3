"""Small random models of every supported architecture, for tests that need a real
forward pass but not a real model (milliseconds per step)."""

from __future__ import annotations

import os
from typing import Any

from ferrolm.model.config import ModelConfig

# where the torch runner's numerical tests run: cpu here and in CI; scripts/gpu_check.sh
# runs them on cuda (FERROLM_TEST_DEVICE=cuda)
TORCH_TEST_DEVICE = os.environ.get("FERROLM_TEST_DEVICE", "cpu")

# one variant per switch of the forward pass; small enough for a float64 reference
SMALL_MODEL_OVERRIDES: dict[str, dict[str, Any]] = {
    # Llama 3: GQA, llama3 RoPE scaling (a short original context so it matters here)
    "llama3": {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    # Llama with every bias, tied embeddings, plain multi-head attention, linear scaling
    "llama-biases": {
        "model_type": "llama",
        "num_key_value_heads": 4,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    },
    # Qwen2: q/k/v biases, one kv head for all query heads
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 1},
    # Qwen3: per-head q/k RMSNorm, head_dim not hidden / heads, tied embeddings
    "qwen3": {"model_type": "qwen3", "head_dim": 24, "tie_word_embeddings": True},
    # Qwen2 with YaRN (Qwen2.5's long-context setting; a short original context so the
    # ramp falls inside this head's 8 dimension pairs)
    "qwen2-yarn": {
        "model_type": "qwen2",
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    },
    # Mistral: a sliding window shorter than the test sequences
    "mistral": {"model_type": "mistral", "sliding_window": 5},
}


def small_config(variant: str = "llama3", **overrides: Any) -> ModelConfig:
    """A 2-layer, 64-wide model of ``variant`` (a key of ``SMALL_MODEL_OVERRIDES``)."""
    raw: dict[str, Any] = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 97,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    raw |= SMALL_MODEL_OVERRIDES[variant]
    raw |= overrides
    return ModelConfig.from_dict(raw)
