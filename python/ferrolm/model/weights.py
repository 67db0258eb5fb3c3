"""Loading Hugging Face safetensors checkpoints into float32 numpy arrays.

Weights are a plain ``dict`` from the Hugging Face tensor name to a float32 array; the
runners read them by those names. bf16 and fp16 checkpoints are widened to float32 on
load (bf16 through ``ml_dtypes``, which safetensors uses for numpy), because the numpy
runner computes in float32.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig

Weights = dict[str, np.ndarray]

INDEX_FILE = "model.safetensors.index.json"
_LOADABLE_DTYPES = ("float32", "float16", "bfloat16", "float64")


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, by Hugging Face name, with its shape.

    ``lm_head.weight`` is listed even when the embeddings are tied: the loader fills it
    with the embedding matrix so the runners never special-case tying.
    """
    c = config
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
        "lm_head.weight": (c.vocab_size, c.hidden_size),
    }
    for i in range(c.num_layers):
        p = layer_prefix(i)
        shapes |= {
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (q_out, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q_out),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        }
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        if c.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_out,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_out,)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (c.hidden_size,)
        if c.mlp_bias:
            shapes[p + "mlp.gate_proj.bias"] = (c.intermediate_size,)
            shapes[p + "mlp.up_proj.bias"] = (c.intermediate_size,)
            shapes[p + "mlp.down_proj.bias"] = (c.hidden_size,)
    return shapes


def load_weights(folder: str | Path, config: ModelConfig) -> Weights:
    """Reads the checkpoint in ``folder`` (one ``*.safetensors`` file, or shards listed in
    ``model.safetensors.index.json``), checks every tensor against ``config`` and returns
    them as float32. Tensors the forward pass does not use are skipped."""
    found: Weights = {}
    for name, tensor in read_checkpoint(folder, config, framework="np"):
        found[name] = _to_float32(name, tensor)
    if config.tie_word_embeddings:
        found["lm_head.weight"] = found.get("model.embed_tokens.weight", np.empty(0, np.float32))
    check_weights(found, config)
    return found


def read_checkpoint(
    folder: str | Path, config: ModelConfig, *, framework: str = "np", device: str = "cpu"
) -> Iterator[tuple[str, Any]]:
    """The tensors of the checkpoint the forward pass uses, by name, in their stored dtype,
    as safetensors gives them for ``framework`` (``"np"`` or ``"pt"``, the latter placed
    on ``device`` as it is read). A tied model's stored ``lm_head.weight`` is skipped: the
    embedding serves. Shapes are the caller's to check (``check_weights``)."""
    if framework == "np":
        # numpy knows "bfloat16" once ml_dtypes is imported (safetensors asks for it by
        # name); imported here, not with this module, as it costs 8 MB resident
        import ml_dtypes  # noqa: F401

    wanted = expected_shapes(config)
    tied = config.tie_word_embeddings
    for file in _checkpoint_files(Path(folder)):
        options = {"device": device} if framework == "pt" else {}
        with safe_open(str(file), framework=framework, **options) as reader:
            for name in reader.keys():
                if name not in wanted or (tied and name == "lm_head.weight"):
                    continue
                yield name, reader.get_tensor(name)


def check_weights(weights: Mapping[str, Any], config: ModelConfig) -> None:
    """Raises ``InvalidInputError`` naming the first tensor missing or of the wrong shape."""
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            hint = " (config says tie_word_embeddings is false)" if name == "lm_head.weight" else ""
            raise InvalidInputError(f"checkpoint has no tensor {name!r}{hint}")
        if tuple(weights[name].shape) != shape:
            raise InvalidInputError(
                f"checkpoint tensor {name!r} has shape {tuple(weights[name].shape)}, config implies {shape}"
            )


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"{INDEX_FILE} has no valid 'weight_map': {exc}") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise InvalidInputError(f"{INDEX_FILE} lists shard(s) not in the folder: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidInputError(f"model folder {folder.name!r} has no *.safetensors file")
    return files


def _to_float32(name: str, array: np.ndarray) -> np.ndarray:
    if array.dtype.name not in _LOADABLE_DTYPES:
        raise InvalidInputError(f"checkpoint tensor {name!r} has dtype {array.dtype}; expected bf16, fp16 or fp32")
    return np.ascontiguousarray(array, dtype=np.float32)
