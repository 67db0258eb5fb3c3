"""Loading safetensors checkpoints: one file or shards, fp32/fp16/bf16, tied embeddings,
and the errors a broken checkpoint gives."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import random_weights
from ferrolm.model.weights import Weights, expected_shapes, load_weights
from safetensors.numpy import save_file
from small_models import small_config


def write_checkpoint(folder: Path, weights: Weights, dtype: type | None = None, shards: int = 1) -> None:
    """Saves ``weights`` (converted to ``dtype`` when given) as a Hugging Face checkpoint."""
    tensors = {
        name: np.ascontiguousarray(value if dtype is None else value.astype(dtype)) for name, value in weights.items()
    }
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        save_file({n: tensors[n] for n in part}, str(folder / file))
        weight_map |= {n: file for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def untied_config() -> ModelConfig:
    return small_config("qwen2")


def tied_config() -> ModelConfig:
    return small_config("qwen3")


def test_single_file_fp32_loads_exactly(tmp_path: Path) -> None:
    config = untied_config()
    weights = random_weights(config, seed=1)
    write_checkpoint(tmp_path, weights)
    loaded = load_weights(tmp_path, config)
    assert set(loaded) == set(expected_shapes(config))
    for name, value in weights.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], value)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_half_precision_is_widened_to_float32(tmp_path: Path, dtype: type) -> None:
    config = untied_config()
    weights = random_weights(config, seed=2)
    write_checkpoint(tmp_path, weights, dtype=dtype)
    loaded = load_weights(tmp_path, config)
    for name, value in weights.items():
        assert loaded[name].dtype == np.float32
        # exactly the half-precision value, widened
        np.testing.assert_array_equal(loaded[name], value.astype(dtype).astype(np.float32))
    # and bf16/fp16 really were stored: the values moved
    name = "model.layers.0.mlp.up_proj.weight"
    assert not np.array_equal(loaded[name], weights[name])


def test_sharded_checkpoint_follows_the_index(tmp_path: Path) -> None:
    config = untied_config()
    weights = random_weights(config, seed=3)
    write_checkpoint(tmp_path, weights, shards=3)
    # a stray file the index does not list must not be read
    save_file({"model.norm.weight": np.zeros(config.hidden_size, np.float32)}, str(tmp_path / "stray.safetensors"))
    loaded = load_weights(tmp_path, config)
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_tied_embeddings_serve_as_the_output_head(tmp_path: Path) -> None:
    config = tied_config()
    weights = random_weights(config, seed=4)
    stored = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    write_checkpoint(tmp_path, stored)
    loaded = load_weights(tmp_path, config)
    assert loaded["lm_head.weight"] is loaded["model.embed_tokens.weight"]


def test_tied_checkpoint_that_also_stores_lm_head_still_uses_the_embedding(tmp_path: Path) -> None:
    config = tied_config()
    weights = random_weights(config, seed=5)
    write_checkpoint(tmp_path, weights | {"lm_head.weight": np.zeros_like(weights["lm_head.weight"])})
    loaded = load_weights(tmp_path, config)
    np.testing.assert_array_equal(loaded["lm_head.weight"], weights["model.embed_tokens.weight"])


def test_tensors_the_forward_pass_does_not_use_are_skipped(tmp_path: Path) -> None:
    config = untied_config()
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}
    write_checkpoint(tmp_path, random_weights(config, seed=6) | extra)
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in load_weights(tmp_path, config)


def test_untied_checkpoint_without_lm_head_is_refused(tmp_path: Path) -> None:
    config = untied_config()
    weights = random_weights(config, seed=7)
    write_checkpoint(tmp_path, {k: v for k, v in weights.items() if k != "lm_head.weight"})
    with pytest.raises(InvalidInputError, match="'lm_head.weight'.*tie_word_embeddings"):
        load_weights(tmp_path, config)


def test_missing_bias_is_named(tmp_path: Path) -> None:
    config = untied_config()  # qwen2: q/k/v biases are required
    weights = random_weights(config, seed=8)
    del weights["model.layers.1.self_attn.k_proj.bias"]
    write_checkpoint(tmp_path, weights)
    with pytest.raises(InvalidInputError, match="'model.layers.1.self_attn.k_proj.bias'"):
        load_weights(tmp_path, config)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    config = untied_config()
    weights = random_weights(config, seed=9)
    weights["model.layers.0.mlp.down_proj.weight"] = weights["model.layers.0.mlp.down_proj.weight"].T.copy()
    write_checkpoint(tmp_path, weights)
    with pytest.raises(InvalidInputError, match="'model.layers.0.mlp.down_proj.weight' has shape"):
        load_weights(tmp_path, config)


def test_integer_tensor_is_refused(tmp_path: Path) -> None:
    config = untied_config()
    weights = random_weights(config, seed=10)
    write_checkpoint(tmp_path, weights | {"model.norm.weight": np.ones(config.hidden_size, np.int32)})
    with pytest.raises(InvalidInputError, match="'model.norm.weight' has dtype int32"):
        load_weights(tmp_path, config)


def test_folder_without_checkpoint_or_with_missing_shard(tmp_path: Path) -> None:
    config = untied_config()
    with pytest.raises(InvalidInputError, match="no \\*.safetensors"):
        load_weights(tmp_path, config)
    write_checkpoint(tmp_path, random_weights(config, seed=11), shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InvalidInputError, match="model-00002-of-00002.safetensors"):
        load_weights(tmp_path, config)


def test_random_weights_are_reproducible_and_seed_dependent() -> None:
    config = small_config("llama3")
    a, b, c = random_weights(config, seed=1), random_weights(config, seed=1), random_weights(config, seed=2)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["model.norm.weight"], c["model.norm.weight"])
    # a projection has the scale it is meant to have: unit variance out for unit variance in
    q = a["model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std() * np.sqrt(config.hidden_size) - 1.0) < 0.05
