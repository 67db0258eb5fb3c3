"""Rotary position embedding as Hugging Face Llama applies it ("rotate half" / neox
style: dimension ``i`` pairs with ``i + head_dim / 2``), with linear and llama3 scaling."""

from __future__ import annotations

import math

import numpy as np

from ferrolm.model.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """float64 ``[head_dim / 2]``: the rotation speed of each dimension pair."""
    exponents = np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
    inv_freq = 1.0 / config.rope_theta**exponents
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: long wavelengths (beyond the original context / low_freq_factor) are slowed
    # by `factor`, short ones (below original / high_freq_factor) are kept, and the band
    # in between is interpolated smoothly in wavelength
    original = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smooth = np.clip(smooth, 0.0, 1.0)
    return (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq


def rotation(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``cos, sin`` of shape ``[T, 1, head_dim / 2]`` (the 1 broadcasts over heads).

    Angles are computed in float64: at long positions float32 would lose the low bits of
    ``position * frequency``.
    """
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return (np.cos(angles).astype(np.float32)[:, None, :], np.sin(angles).astype(np.float32)[:, None, :])


def apply_rotation(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotates ``x`` of shape ``[T, heads, head_dim]``; returns a new array."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    out = np.empty_like(x)
    out[..., :half] = first * cos - second * sin
    out[..., half:] = second * cos + first * sin
    return out
