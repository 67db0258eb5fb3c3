"""YaRN RoPE scaling (Qwen2.5 / Qwen3 long-context configs and GGUF files): the config read
as transformers reads it, the frequencies against transformers' own and against the float64
reference's independent formula, the attention factor applied by the numpy and quant
runners, and a GGUF's YaRN keys. The whole forward against transformers runs for the
``qwen2-yarn`` variant in ``test_model_transformers.py``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model import gguf_file
from ferrolm.model.config import ModelConfig, RopeScaling
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.random_weights import random_weights
from ferrolm.model.reference import reference_logits
from ferrolm.model.rope import attention_factor, inverse_frequencies
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from gguf_files import write_metadata_gguf
from small_models import small_config


def _yarn(**scaling: Any) -> ModelConfig:
    return small_config("qwen2-yarn", rope_scaling={"rope_type": "yarn", **scaling})


def test_a_yarn_config_reads_as_transformers_reads_it() -> None:
    c = _yarn(factor=4.0, original_max_position_embeddings=64)
    assert c.rope_scaling == RopeScaling(
        "yarn", 4.0, original_max_position_embeddings=64, attention_factor=0.1 * math.log(4.0) + 1.0
    )
    # the original context defaults to max_position_embeddings, the factor to the ratio
    assert _yarn(factor=2.0).rope_scaling.original_max_position_embeddings == 256  # type: ignore[union-attr]
    assert _yarn(original_max_position_embeddings=32).rope_scaling.factor == 8.0  # type: ignore[union-attr]
    # DeepSeek's pair of mscales, and an explicit factor
    deepseek = _yarn(factor=4.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.5)
    want = (0.1 * math.log(4.0) + 1.0) / (0.05 * math.log(4.0) + 1.0)
    assert math.isclose(attention_factor(deepseek), want)
    assert attention_factor(_yarn(factor=4.0, original_max_position_embeddings=64, attention_factor=0.7)) == 0.7
    # written back as a Hugging Face config and read again: the same
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize(
    ("scaling", "field"),
    [
        ({"factor": -2.0, "original_max_position_embeddings": 64}, "factor"),
        ({"factor": 4.0, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
        ({"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": "fast"}, "beta_fast"),
        ({"factor": 4.0, "original_max_position_embeddings": 64, "truncate": "yes"}, "truncate"),
    ],
)
def test_a_bad_yarn_field_is_refused_by_name(scaling: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        _yarn(**scaling)


def test_yarn_keeps_the_fast_pairs_interpolates_the_slow_ones_as_the_reference_does() -> None:
    c = _yarn(factor=4.0, original_max_position_embeddings=64)
    plain = inverse_frequencies(dataclasses.replace(c, rope_scaling=None))
    got = inverse_frequencies(c)
    assert got[0] == plain[0]  # turns far more than beta_fast times over 64 positions: kept
    assert math.isclose(got[-1], plain[-1] / 4.0)  # turns less than once: interpolated
    assert np.all(got <= plain) and np.all(got >= plain / 4.0 - 1e-18)
    # the float64 reference computes each pair's frequency on its own, in a loop
    from ferrolm.model.reference import _rope_angles

    np.testing.assert_allclose(_rope_angles(c, 2)[1], got, rtol=1e-12)


@pytest.mark.parametrize(("original", "factor"), [(64, 4.0), (32, 8.0), (4096, 4.0)])
def test_yarn_frequencies_and_attention_factor_are_transformers(original: int, factor: float) -> None:
    pytest.importorskip("torch", reason="transformers' RoPE functions need torch")
    transformers = pytest.importorskip("transformers", reason="the comparison is with transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    c = _yarn(factor=factor, original_max_position_embeddings=original)
    hf = transformers.Qwen2Config(**c.to_hf_dict())
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    # transformers computes them in float32
    np.testing.assert_allclose(inverse_frequencies(c), inv_freq.double().numpy(), rtol=1e-6)
    assert math.isclose(attention_factor(c), attention)


def _forward(runner: Any, ids: list[int]) -> np.ndarray:
    return runner.forward(ForwardBatch.from_requests([ids], [list(range(len(ids)))]), all_logits=True)


def test_the_runners_multiply_cos_and_sin_by_the_attention_factor() -> None:
    c = _yarn(factor=4.0, original_max_position_embeddings=64)
    weights = random_weights(c, seed=11)
    ids = list(range(3, 43))
    want = reference_logits(c, weights, ids)
    numpy = _forward(NumpyRunner(c, weights, 64, kv_cache_dtype="float32"), ids)
    np.testing.assert_allclose(numpy, want, atol=1e-4 * float(np.ptp(want)))
    # the quant runner (Q8_0 weights): within the int8 rounding of the float forward, and
    # nearer it than the same frequencies without the factor are
    quant = _forward(QuantRunner.from_weights(c, weights, 64, quantization="q8_0", kv_cache_dtype="float32"), ids)
    unscaled = dataclasses.replace(c.rope_scaling, attention_factor=1.0)  # type: ignore[arg-type]
    without = reference_logits(dataclasses.replace(c, rope_scaling=unscaled), weights, ids)
    assert np.abs(quant - want).max() < 0.03 * float(np.ptp(want))
    assert np.abs(quant - want).max() < 0.5 * np.abs(without - want).max()


def test_a_gguf_with_yarn_keys_reads_as_yarn(tmp_path: Path) -> None:
    c = small_config("qwen2")
    keys = {
        "qwen2.rope.scaling.type": "yarn",
        "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 1024,
    }
    path = write_metadata_gguf(tmp_path / "yarn.gguf", "qwen2", c, keys)
    got = gguf_file.read_config(gguf_file.Metadata(gguf_file.open_gguf(path))).rope_scaling
    assert got == RopeScaling(
        "yarn", 4.0, original_max_position_embeddings=1024, attention_factor=0.1 * math.log(4.0) + 1.0
    )
    # DeepSeek's log multiplier is refused by its key, and a missing factor by its own
    path = write_metadata_gguf(
        tmp_path / "log.gguf", "qwen2", c, keys | {"qwen2.rope.scaling.yarn_log_multiplier": 0.1}
    )
    with pytest.raises(InvalidInputError, match="yarn_log_multiplier"):
        gguf_file.read_config(gguf_file.Metadata(gguf_file.open_gguf(path)))
    del keys["qwen2.rope.scaling.factor"]
    path = write_metadata_gguf(tmp_path / "nofactor.gguf", "qwen2", c, keys)
    with pytest.raises(InvalidInputError, match="rope.scaling.factor"):
        gguf_file.read_config(gguf_file.Metadata(gguf_file.open_gguf(path)))
