"""``_core.rms_norm``: the core's RMSNorm, one call where numpy takes five ops (the CPU
runners' norms), against a float64 reference; its refusals name the argument."""

from __future__ import annotations

import numpy as np
import pytest
from ferrolm import _core
from ferrolm.errors import InvalidInputError


def reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + eps) * weight


@pytest.mark.parametrize("shape", [(1, 64), (5, 128), (3, 4, 24), (700, 512), (2, 7)])
def test_rows_match_the_float64_reference(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    weight = rng.random(shape[-1]).astype(np.float32) + 0.5
    out = np.full_like(x, np.nan)
    _core.rms_norm(x, weight, out, eps=1e-5)
    # float32 products after a float64 mean: within a few float32 ulps
    np.testing.assert_allclose(out, reference(x, weight, 1e-5), rtol=1e-6, atol=1e-6)
    assert out.dtype == np.float32


def test_refusals_name_the_argument() -> None:
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    cases = [
        ((x.astype(np.float64), w, np.empty_like(x)), "x"),
        ((x, w, np.empty((2, 7), np.float32)), "out"),
        ((x, np.ones(7, np.float32), np.empty_like(x)), "weight"),
        ((x, w.astype(np.float64), np.empty_like(x)), "weight"),
        ((np.ones((8, 2), np.float32).T, w[:2], np.empty((2, 8), np.float32)), "x"),
        ((x, w, x), "out"),
    ]
    for args, field in cases:
        with pytest.raises(InvalidInputError) as e:
            _core.rms_norm(*args, eps=1e-5)
        assert e.value.field == field, (field, str(e.value))
    with pytest.raises(InvalidInputError) as e:
        _core.rms_norm(x, w, np.empty_like(x), eps=float("nan"))
    assert e.value.field == "eps"
