"""Rotary position embedding as Hugging Face Llama applies it ("rotate half" / neox
style: dimension ``i`` pairs with ``i + head_dim / 2``), with linear, llama3 and YaRN
scaling."""

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
    if scaling.rope_type == "yarn":
        return _yarn_frequencies(config, inv_freq)
    # llama3: long wavelengths (beyond the original context / low_freq_factor) are slowed
    # by `factor`, short ones (below original / high_freq_factor) are kept, and the band
    # in between is interpolated smoothly in wavelength
    original = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smooth = np.clip(smooth, 0.0, 1.0)
    return (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq


def _yarn_frequencies(config: ModelConfig, inv_freq: np.ndarray) -> np.ndarray:
    """YaRN: dimensions that turn fewer than ``beta_slow`` times over the original context
    are interpolated (divided by the factor), those turning more than ``beta_fast`` times
    are kept, with a linear ramp over the dimensions between."""
    scaling = config.rope_scaling
    assert scaling is not None
    dim, base = config.head_dim, config.rope_theta

    def dimension_of(rotations: float) -> float:
        # the dimension whose wavelength fits `rotations` times in the original context
        return (
            dim * math.log(scaling.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))
        )

    low, high = dimension_of(scaling.beta_fast), dimension_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    kept = 1.0 - ramp  # 1: the original frequency, 0: the interpolated one
    return inv_freq / scaling.factor * (1.0 - kept) + inv_freq * kept


def attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise)."""
    scaling = config.rope_scaling
    return scaling.attention_factor if scaling is not None and scaling.rope_type == "yarn" else 1.0


def rotation(inv_freq: np.ndarray, positions: np.ndarray, factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``cos, sin`` of shape ``[T, 1, head_dim / 2]`` (the 1 broadcasts over heads),
    multiplied by ``factor`` (``attention_factor``).

    Angles are computed in float64: at long positions float32 would lose the low bits of
    ``position * frequency``.
    """
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles) * factor, np.sin(angles) * factor
    return (cos.astype(np.float32)[:, None, :], sin.astype(np.float32)[:, None, :])


def apply_rotation(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotates ``x`` of shape ``[T, heads, head_dim]``; returns a new array."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    out = np.empty_like(x)
    out[..., :half] = first * cos - second * sin
    out[..., half:] = second * cos + first * sin
    return out
