"""The quantized runner: a GGUF file's weights kept in their block formats (Q8_0, Q4_K,
...) and the whole forward pass of a step in the Rust core (``_core.QuantModel``:
integer-dot matrix products, the core's paged attention, its own KV pool), one call per
step with the GIL released. It is what ``--runner auto`` picks for a GGUF file on the
CPU; ``--runner numpy`` dequantizes the same file to float32 instead (the reference it is
tested against). A Hugging Face checkpoint runs on it quantized at load
(``--quantization q8_0|q4_k``) or with its matrices in a 2-byte float type (``--dtype
float16|bfloat16`` on the CPU: half the memory and bytes per step of the numpy runner's
float32), read from the checkpoint one tensor at a time.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model import gguf_file
from ferrolm.model.config import ModelConfig
from ferrolm.model.rope import attention_factor, inverse_frequencies
from ferrolm.model.runner import Batch, ModelRunner
from ferrolm.model.weights import check_weights, read_checkpoint

QUANT_KV_CACHE_DTYPES = ("float32", "float16", "bfloat16", "q8_0")
# --quantization: a float checkpoint's matrices quantized at load
QUANTIZATIONS = ("q8_0", "q4_k")
# --dtype on the CPU: a float checkpoint's matrices kept in this type (2 bytes a weight)
FLOAT_DTYPES = ("float16", "bfloat16")
_GGML_IDS = {"F32": 0, "F16": 1, "Q8_0": 8, "Q4_K": 12, "BF16": 30}


def _shape(config: ModelConfig) -> dict[str, Any]:
    return {
        "hidden": config.hidden_size,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate": config.intermediate_size,
        "vocab": config.vocab_size,
        "rms_eps": config.rms_norm_eps,
        "sliding_window": config.sliding_window,
        "inv_freq": [float(f) for f in inverse_frequencies(config)],
        "rope_scale": attention_factor(config),
    }


def _gguf_tensors(reader: Any, config: ModelConfig) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The file's matrices as ``name -> (ggml type, rows, cols, raw uint8 rows, whether
    those are a view of the file)`` (query and key rows put back in Hugging Face's order,
    which the runner's RoPE expects) and its vectors (norms, biases) as float32."""
    matrices: dict[str, Any] = {}
    vectors: dict[str, np.ndarray] = {}
    permuted = config.model_type in gguf_file.PERMUTED_QK
    for tensor in reader.tensors:
        if gguf_file.hf_tensor_name(tensor.name) is None:
            continue
        raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        dims = [int(d) for d in tensor.shape]  # ne0 (a row's length) first
        heads = None
        if permuted and ".attn_q." in tensor.name:
            heads = config.num_heads
        elif permuted and ".attn_k." in tensor.name:
            heads = config.num_kv_heads
        if len(dims) == 1 or (len(dims) == 2 and dims[1] == 1):
            values = (
                raw.view(np.float32) if int(tensor.tensor_type) == 0 else _core.dequantize(raw, int(tensor.tensor_type))
            )
            if heads is not None:  # a bias of a permuted projection
                values = gguf_file.unpermute(values, heads, tensor.name)
            vectors[tensor.name] = np.ascontiguousarray(values, dtype=np.float32)
            continue
        cols, rows = dims[0], int(np.prod(dims[1:]))
        data = raw.reshape(rows, -1)
        if heads is not None:
            data = gguf_file.unpermute(data, heads, tensor.name)
        flat = np.ascontiguousarray(data).reshape(-1)
        matrices[tensor.name] = (int(tensor.tensor_type), rows, cols, flat, _views_file(flat))
    return matrices, vectors


def _views_file(array: np.ndarray) -> bool:
    """Whether ``array`` is a read-only view of a memory-mapped file (the core then drops
    its pages from this process once copied; a copy, such as an unpermuted projection, is
    the process's own memory and is left alone)."""
    if array.flags.writeable:
        return False
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def _float_tensors(
    weights: Iterable[tuple[str, np.ndarray]], config: ModelConfig, weight_type: str
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A float checkpoint's tensors (Hugging Face names, any float dtype), taken one at a
    time, under their GGUF names: vectors as float32, matrices in ``weight_type``.

    ``float16`` / ``bfloat16``: every matrix in that type (bfloat16 rounds to nearest
    even; a bf16 checkpoint's bits are kept as they are). ``q8_0`` / ``q4_k``: quantized
    (rows that are not whole 256-blocks: Q8_0, as llama.cpp falls back; the embedding and
    head: Q8_0)."""
    matrices: dict[str, Any] = {}
    vectors: dict[str, np.ndarray] = {}
    for hf_name, value in weights:
        name = gguf_file.gguf_tensor_name(hf_name)
        if hf_name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            name = "output.weight"
        if value.ndim == 1:
            vectors[name] = np.ascontiguousarray(value, dtype=np.float32)
            continue
        rows, cols = value.shape
        if weight_type in FLOAT_DTYPES:
            wanted = "F16" if weight_type == "float16" else "BF16"
            matrices[name] = (_GGML_IDS[wanted], rows, cols, _two_byte_floats(value, weight_type), False)
            continue
        array = np.ascontiguousarray(value, dtype=np.float32)
        wanted = "Q8_0" if name in ("token_embd.weight", "output.weight") else weight_type.upper()
        if wanted == "Q4_K" and cols % 256:
            wanted = "Q8_0"
        if cols % 32:
            wanted = "F32"
        data = array.reshape(-1).view(np.uint8) if wanted == "F32" else _core.quantize(array, _GGML_IDS[wanted])
        matrices[name] = (_GGML_IDS[wanted], rows, cols, data, False)
    return matrices, vectors


def _two_byte_floats(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` as the raw uint8 bytes of float16 or bfloat16 values (one conversion,
    no float32 copy where the checkpoint's own type is already 2 bytes)."""
    if dtype == "float16":
        converted = np.ascontiguousarray(value, dtype=np.float16)
    else:
        import ml_dtypes

        if value.dtype.name == "float16":  # no direct f16 -> bf16 cast in ml_dtypes' numpy
            value = value.astype(np.float32)
        converted = np.ascontiguousarray(value, dtype=ml_dtypes.bfloat16)
    return converted.reshape(-1).view(np.uint8)


def _check_weight_type(quantization: str | None, dtype: str | None) -> str:
    """The matrices' type: ``quantization`` or ``dtype``, exactly one of them."""
    if quantization is None and dtype is None:
        raise InvalidInputError(
            "a float checkpoint on the quant runner needs quantization (q8_0|q4_k) or dtype (float16|bfloat16)",
            "quantization",
        )
    if quantization is not None and dtype is not None:
        raise InvalidInputError(
            f"quantization {quantization!r} and dtype {dtype!r} both set the weights' type on the quant runner: "
            "give one of them",
            "dtype",
        )
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InvalidInputError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}", "quantization")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise InvalidInputError(
            f"the quant runner keeps float weights in one of {FLOAT_DTYPES}, got {dtype!r}", "dtype"
        )
    return quantization or dtype or ""


def _check_pool(num_slots: int, kv_cache_dtype: str) -> None:
    if num_slots < 1:
        raise InvalidInputError(f"num_slots must be positive, got {num_slots}", "num_slots")
    if kv_cache_dtype not in QUANT_KV_CACHE_DTYPES:
        raise InvalidInputError(
            f"kv_cache_dtype must be one of {QUANT_KV_CACHE_DTYPES}, got {kv_cache_dtype!r}", "kv_cache_dtype"
        )


class QuantRunner(ModelRunner):
    """``forward`` of the Rust core's ``QuantModel`` over a GGUF file's weights as stored.

    ``kv_cache_dtype``: the pool's element type (float32, float16, bfloat16, or q8_0:
    ggml's blocks of 32 int8 values and an f16 scale, llama.cpp's ``-ctk/-ctv q8_0``;
    attention reads it in place and computes in float32 either way)."""

    def __init__(self, config: ModelConfig, model: Any) -> None:
        self.config = config
        self.model = model
        self.num_slots = int(model.num_slots)

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], config: ModelConfig, num_slots: int, *, kv_cache_dtype: str = "float16"
    ) -> QuantRunner:
        _check_pool(num_slots, kv_cache_dtype)
        reader = gguf_file.open_gguf(path)
        matrices, vectors = _gguf_tensors(reader, config)  # views of the file's mapping
        del reader
        if config.tie_word_embeddings:
            matrices.pop("output.weight", None)
        # the core copies each matrix; with the last view gone the file is unmapped
        return cls._build(config, matrices, vectors, num_slots, kv_cache_dtype)

    @classmethod
    def from_weights(
        cls,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        num_slots: int,
        *,
        quantization: str | None = None,
        dtype: str | None = None,
        kv_cache_dtype: str = "float16",
    ) -> QuantRunner:
        """A float checkpoint (Hugging Face names) with its matrices quantized at load to
        ``quantization`` (``q8_0`` or ``q4_k``) or kept in ``dtype`` (``float16`` or
        ``bfloat16``): exactly one of the two."""
        _check_pool(num_slots, kv_cache_dtype)
        weight_type = _check_weight_type(quantization, dtype)
        matrices, vectors = _float_tensors(weights.items(), config, weight_type)
        return cls._build(config, matrices, vectors, num_slots, kv_cache_dtype)

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike[str],
        config: ModelConfig,
        num_slots: int,
        *,
        quantization: str | None = None,
        dtype: str | None = None,
        kv_cache_dtype: str = "float16",
    ) -> QuantRunner:
        """``from_weights`` over the safetensors checkpoint in ``folder``, read one tensor
        at a time in its stored type: no float32 copy of the whole model is ever made."""
        _check_pool(num_slots, kv_cache_dtype)
        weight_type = _check_weight_type(quantization, dtype)
        shapes: dict[str, np.ndarray] = {}

        def tensors() -> Iterable[tuple[str, np.ndarray]]:
            for name, tensor in read_checkpoint(Path(folder), config, framework="np"):
                shapes[name] = np.broadcast_to(np.float32(0), tensor.shape)  # for the check, no memory
                yield name, tensor

        matrices, vectors = _float_tensors(tensors(), config, weight_type)
        if config.tie_word_embeddings and "model.embed_tokens.weight" in shapes:
            shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
        check_weights(shapes, config)
        return cls._build(config, matrices, vectors, num_slots, kv_cache_dtype)

    @classmethod
    def _build(
        cls,
        config: ModelConfig,
        matrices: dict[str, Any],
        vectors: dict[str, np.ndarray],
        num_slots: int,
        kv_cache_dtype: str,
    ) -> QuantRunner:
        model = _core.QuantModel(
            _shape(config), config.num_layers, matrices, vectors, num_slots, kv_cache_dtype=kv_cache_dtype
        )
        matrices.clear()  # the core holds its own copy: the arrays (and any file mapping) go now
        vectors.clear()
        return cls(config, model)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads."""
        return int(self.model.weight_bytes)

    def forward(self, batch: Batch, *, all_logits: bool = False) -> np.ndarray:
        return self.model.forward(
            batch.input_ids,
            batch.positions,
            batch.out_slots,
            batch.qo_offsets,
            batch.kv_slots,
            batch.kv_offsets,
            all_logits=all_logits,
            logit_rows=None if all_logits else batch.logit_rows,
            loras=batch.loras,
        )
