"""LoRA adapters in PEFT's file format (``adapter_config.json`` and
``adapter_model.safetensors``, tensors named as ``PeftModel.save_pretrained`` names them),
written without torch by the bench's writer, with the merged weights they stand for:
``W + scaling * B @ A``, what PEFT's ``merge_and_unload`` computes. ``test_lora_peft.py``
checks adapters that peft itself writes against transformers."""

from __future__ import annotations

from functools import partial

import numpy as np
from ferrolm.bench.lora import ATTENTION_TARGETS as ATTENTION
from ferrolm.bench.lora import MLP_TARGETS as MLP
from ferrolm.bench.lora import write_random_adapter
from ferrolm.model.weights import Weights

ALL_TARGETS = ATTENTION + MLP
# the bench's writer, with a small adapter's defaults
write_peft_adapter = partial(write_random_adapter, rank=4, alpha=8.0)


def merged(weights: Weights, parts: dict[str, tuple[np.ndarray, np.ndarray, float]]) -> Weights:
    """``weights`` with each adapted projection's ``W + scaling * B @ A`` (float64 product,
    rounded once to float32)."""
    out = dict(weights)
    for module, (a, b, scaling) in parts.items():
        name = f"{module}.weight"
        w = np.asarray(weights[name], dtype=np.float64)
        out[name] = (w + scaling * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
    return out
