"""A dense reference forward pass: one sequence, no cache, no paging, float64.

Written to be obviously right rather than fast, and independently of the runner (its
own RoPE frequencies, per-head attention, an explicit mask), so that tests comparing the
two catch mistakes in either. Follows transformers' Llama/Qwen/Mistral modeling code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ferrolm.model.config import ModelConfig
from ferrolm.model.weights import Weights


def reference_logits(config: ModelConfig, weights: Weights, token_ids: Sequence[int]) -> np.ndarray:
    """Logits ``float64 [len(token_ids), vocab]`` of every position of one sequence."""
    c = config

    def w(name: str) -> np.ndarray:
        return np.asarray(weights[name], dtype=np.float64)

    def bias(name: str, width: int) -> np.ndarray:
        return w(name) if name in weights else np.zeros(width)

    def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_norm_eps)

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        weight = w(name + ".weight")
        return x @ weight.T + bias(name + ".bias", weight.shape[0])

    ids = list(token_ids)
    n = len(ids)
    angles = _rope_angles(c, n)  # [n, head_dim / 2]
    x = w("model.embed_tokens.weight")[ids]

    def rope(vec: np.ndarray) -> np.ndarray:  # [n, head_dim]: rotate pairs (i, i + d/2)
        half = c.head_dim // 2
        a, b = vec[:, :half], vec[:, half:]
        scale = c.rope_scaling.attention_factor if c.rope_scaling and c.rope_scaling.rope_type == "yarn" else 1.0
        cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=1)

    allowed = np.tril(np.ones((n, n), dtype=bool))
    if c.sliding_window is not None:
        for i in range(n):
            for j in range(n):
                if i - j >= c.sliding_window:
                    allowed[i, j] = False

    for layer in range(c.num_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w(p + "input_layernorm.weight"))
        q = linear(h, p + "self_attn.q_proj")
        k = linear(h, p + "self_attn.k_proj")
        v = linear(h, p + "self_attn.v_proj")
        heads_out = []
        for head in range(c.num_heads):
            kv_head = head // (c.num_heads // c.num_kv_heads)
            qh = q[:, head * c.head_dim : (head + 1) * c.head_dim]
            kh = k[:, kv_head * c.head_dim : (kv_head + 1) * c.head_dim]
            vh = v[:, kv_head * c.head_dim : (kv_head + 1) * c.head_dim]
            if c.qk_norm:
                qh = rms_norm(qh, w(p + "self_attn.q_norm.weight"))
                kh = rms_norm(kh, w(p + "self_attn.k_norm.weight"))
            qh, kh = rope(qh), rope(kh)
            scores = qh @ kh.T / math.sqrt(c.head_dim)
            scores = np.where(allowed, scores, -np.inf)
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            probs = probs / probs.sum(axis=1, keepdims=True)
            heads_out.append(probs @ vh)
        x = x + linear(np.concatenate(heads_out, axis=1), p + "self_attn.o_proj")
        h = rms_norm(x, w(p + "post_attention_layernorm.weight"))
        gate = linear(h, p + "mlp.gate_proj")
        silu = gate / (1.0 + np.exp(-np.clip(gate, -500, 500)))
        x = x + linear(silu * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms_norm(x, w("model.norm.weight"))
    output = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    return x @ w(output).T


def _rope_angles(config: ModelConfig, length: int) -> np.ndarray:
    """``angles[p, i] = p * frequency_i``, the frequencies computed one by one."""
    c = config
    frequencies = []
    for i in range(c.head_dim // 2):
        freq = 1.0 / (c.rope_theta ** (2 * i / c.head_dim))
        scaling = c.rope_scaling
        if scaling is not None and scaling.rope_type == "linear":
            freq = freq / scaling.factor
        elif scaling is not None and scaling.rope_type == "llama3":
            wavelength = 2 * math.pi / freq
            low_freq_wavelength = scaling.original_max_position_embeddings / scaling.low_freq_factor
            high_freq_wavelength = scaling.original_max_position_embeddings / scaling.high_freq_factor
            if wavelength > low_freq_wavelength:
                freq = freq / scaling.factor
            elif wavelength >= high_freq_wavelength:
                t = (scaling.original_max_position_embeddings / wavelength - scaling.low_freq_factor) / (
                    scaling.high_freq_factor - scaling.low_freq_factor
                )
                freq = (1 - t) * freq / scaling.factor + t * freq
        elif scaling is not None and scaling.rope_type == "yarn":
            # pair i's share of interpolation: 0 below the dimension turning beta_fast times
            # over the original context, 1 above the one turning beta_slow times
            def turning(rotations: float) -> float:
                original = scaling.original_max_position_embeddings
                return c.head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(c.rope_theta))

            low, high = turning(scaling.beta_fast), turning(scaling.beta_slow)
            if scaling.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, c.head_dim - 1)
            share = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
            freq = share * freq / scaling.factor + (1 - share) * freq
        frequencies.append(freq)
    return np.arange(length, dtype=np.float64)[:, None] * np.array(frequencies)[None, :]
