"""Random weights from a seed, identical on every machine and numpy version.

numpy promises a stable stream only for the raw output of its bit generators (PCG64
here), not for ``Generator.normal`` and friends, so the values are built from raw 64-bit
words by hand: uniform in [-1, 1) with 24 bits, which float32 holds exactly.
"""

from __future__ import annotations

import math

import numpy as np

from ferrolm.model.config import ModelConfig
from ferrolm.model.weights import Weights, expected_shapes


def seeded_uniform(bit_generator: np.random.PCG64, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values uniform in [-1, 1), exactly reproducible from the generator state."""
    count = math.prod(shape)
    raw = bit_generator.random_raw(count)
    assert isinstance(raw, np.ndarray)
    top24 = (raw >> np.uint64(40)).astype(np.float32)
    return (top24 * np.float32(2.0**-23) - np.float32(1.0)).reshape(shape)


def random_weights(config: ModelConfig, seed: int, *, embed_std: float = 0.3) -> Weights:
    """A full set of weights for ``config``.

    Scales keep activations of order one through the layers, and ``embed_std`` sets how
    peaked the next-token distribution is (logits are roughly
    ``sqrt(hidden_size) * embed_std`` wide), so greedy choices are not near-ties that
    rounding could flip. Norm weights and biases are perturbed so tests exercise them.
    """
    bits = np.random.PCG64(seed)
    weights: Weights = {}
    sqrt3 = math.sqrt(3.0)  # a uniform in [-a, a) has standard deviation a / sqrt(3)
    for name, shape in expected_shapes(config).items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            weights[name] = weights["model.embed_tokens.weight"]
            continue
        u = seeded_uniform(bits, shape)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.2 * u
        elif name.endswith(".bias"):
            value = 0.1 * u
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            value = embed_std * sqrt3 * u
        else:  # a projection [out, in]: unit-variance outputs for unit-variance inputs
            value = (sqrt3 / math.sqrt(shape[1])) * u
        weights[name] = value.astype(np.float32)
    return weights
