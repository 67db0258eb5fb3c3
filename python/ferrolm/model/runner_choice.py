"""Which model runner an engine gets: ``--runner auto|numpy|torch|quant``, ``--device
auto|cpu|cuda``, ``--dtype auto|bfloat16|float16|float32``, as ``ferrolm serve``,
``ferrolm generate`` and ``ferrolm.Engine`` take them.

``auto`` picks the torch runner where it can use CUDA, and on the CPU the numpy runner
for a float checkpoint in float32 (the torch runner would compute the same thing, and the
numpy runner needs no torch). The quantized runner (``quant``: the forward in the Rust
core) is ``auto``'s pick on the CPU for a GGUF file (its weights stay in their block
formats; ``numpy`` and ``torch`` dequantize the file instead), for a float checkpoint with
``--quantization q8_0|q4_k`` (quantized at load) and for one with ``--dtype
float16|bfloat16`` (its matrices kept in 2-byte floats; ``--runner torch`` still takes a
half ``--dtype`` on the CPU, as before). A GGUF with a half ``--dtype`` goes to torch.
"""

from __future__ import annotations

import os
from typing import Any

from ferrolm.errors import InvalidInputError
from ferrolm.model import gguf_file
from ferrolm.model.loader import LoadedModel
from ferrolm.model.quant_runner import FLOAT_DTYPES, QUANT_KV_CACHE_DTYPES, QUANTIZATIONS, QuantRunner
from ferrolm.model.runner import ModelRunner, NumpyRunner
from ferrolm.model.torch_runner import (
    DEVICES,
    DTYPES,
    TORCH_MISSING,
    TorchRunner,
    cuda_available,
    resolve_device,
    torch_available,
)

RUNNERS = ("auto", "numpy", "torch", "quant")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "q8_0")


def numpy_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """The numpy runner's pool type for ``kv_cache_dtype``: ``auto`` is
    ``FERROLM_KV_CACHE_DTYPE`` where set, else float16 (the core's attention kernel reads
    the pool in place, so half the bytes is what a decode step costs; it computes in
    float32 all the same)."""
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return os.environ.get("FERROLM_KV_CACHE_DTYPE") or "float16"


def resolve_runner_kind(
    runner: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    *,
    model: Any = None,
    quantization: str | None = None,
) -> str:
    """``"numpy"``, ``"torch"`` or ``"quant"`` (for ``model``, a name or path; ``None``:
    a float checkpoint); refuses combinations the runner cannot do."""
    if runner not in RUNNERS:
        raise InvalidInputError(f"runner must be one of {RUNNERS}, got {runner!r}", "runner")
    if device not in DEVICES and not (isinstance(device, str) and device.startswith("cuda:")):
        raise InvalidInputError(f"device must be one of {DEVICES} (or cuda:N), got {device!r}", "device")
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {DTYPES}, got {dtype!r}", "dtype")
    wants_cuda = device.startswith("cuda")
    half = dtype in FLOAT_DTYPES
    gguf = model is not None and gguf_file.is_gguf(model)
    if quantization is not None:
        if quantization not in QUANTIZATIONS:
            raise InvalidInputError(
                f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}", "quantization"
            )
        if gguf:
            raise InvalidInputError(
                "a GGUF file runs in its own block formats; --quantization is for float checkpoints", "quantization"
            )
        if runner not in ("auto", "quant"):
            raise InvalidInputError(f"--quantization runs on the quant runner, not {runner!r}", "quantization")
        if half:
            raise InvalidInputError(
                f"--quantization {quantization} and --dtype {dtype} both set the weights' type; give one of them",
                "dtype",
            )
        runner = "quant"
    # on the CPU, a GGUF in its block formats and a float checkpoint in 2-byte floats
    if runner == "auto" and gguf != half and not wants_cuda and not (device == "auto" and cuda_available()):
        runner = "quant"
    if runner == "quant":
        if wants_cuda:
            raise InvalidInputError(f"the quant runner computes on the CPU, not on {device!r}", "device")
        if gguf and half:
            raise InvalidInputError(
                f"a GGUF file runs on the quant runner in its own block formats, not --dtype {dtype}", "dtype"
            )
        if not gguf and quantization is None and not half:
            raise InvalidInputError(
                "the quant runner reads GGUF files, or a float checkpoint with --quantization q8_0|q4_k or "
                "--dtype float16|bfloat16",
                "runner",
            )
        return "quant"
    if runner == "auto":
        if wants_cuda or half:
            runner = "torch"  # the numpy runner can do neither; torch's absence is named below
        elif device == "auto" and cuda_available():
            runner = "torch"
        else:
            runner = "numpy"
    if runner == "numpy":
        if wants_cuda:
            raise InvalidInputError(
                f"the numpy runner runs on the CPU only, not on {device!r}; use the torch runner", "device"
            )
        if half:
            raise InvalidInputError(
                f"the numpy runner computes in float32 only, not {dtype}; use the torch runner", "dtype"
            )
        return "numpy"
    if not torch_available():
        raise InvalidInputError(TORCH_MISSING, "runner")
    return "torch"


def build_runner(
    model: LoadedModel,
    num_slots: int,
    *,
    runner: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    mem_fraction_static: float | None = None,
) -> ModelRunner:
    """The runner for ``model`` with a pool of ``num_slots``, or, with
    ``mem_fraction_static`` (torch on CUDA), of as many slots as that fraction of the
    device's memory holds beside the weights. The torch runner reads the checkpoint from
    ``model.folder`` when ``model`` was loaded without weights."""
    kind = resolve_runner_kind(runner, device, dtype, model=model.gguf, quantization=quantization)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidInputError(
            f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}", "kv_cache_dtype"
        )
    if kv_cache_dtype == "q8_0" and kind != "quant":
        raise InvalidInputError(
            f"a q8_0 KV cache is the quant runner's (a GGUF file, --quantization, or --runner quant "
            f"with --dtype float16/bfloat16), not the {kind} runner's",
            "kv_cache_dtype",
        )
    if kind == "quant":
        pool = numpy_kv_cache_dtype(kv_cache_dtype)
        if pool not in QUANT_KV_CACHE_DTYPES:
            raise InvalidInputError(f"the quant runner's KV pool is one of {QUANT_KV_CACHE_DTYPES}", "kv_cache_dtype")
        if model.gguf is not None:
            return QuantRunner.from_gguf(model.gguf, model.config, num_slots, kv_cache_dtype=pool)
        weight_type: dict[str, Any] = {"quantization": quantization} if quantization else {"dtype": dtype}
        if model.weights:
            return QuantRunner.from_weights(model.config, model.weights, num_slots, kv_cache_dtype=pool, **weight_type)
        if model.folder is None:
            raise InvalidInputError("the model has neither weights nor a folder to read them from", "model")
        return QuantRunner.from_folder(model.folder, model.config, num_slots, kv_cache_dtype=pool, **weight_type)
    if kind == "numpy":
        if mem_fraction_static is not None:
            raise InvalidInputError(
                "--mem-fraction-static sizes a CUDA pool (the torch runner); give --max-total-tokens",
                "mem_fraction_static",
            )
        if not model.weights:
            raise InvalidInputError("the numpy runner needs the model loaded with its weights", "model")
        return NumpyRunner(model.config, model.weights, num_slots, kv_cache_dtype=numpy_kv_cache_dtype(kv_cache_dtype))
    slots = None if mem_fraction_static is not None else num_slots
    # auto: on the CPU as the numpy runner (the core's kernel reads the pool there), else
    # the runner's compute dtype
    on_cpu = resolve_device(device).type == "cpu"
    kv = numpy_kv_cache_dtype(kv_cache_dtype) if on_cpu else (None if kv_cache_dtype == "auto" else kv_cache_dtype)
    options: dict[str, Any] = {
        "device": device,
        "dtype": dtype,
        "mem_fraction_static": mem_fraction_static,
        "kv_cache_dtype": kv,
    }
    if model.weights:
        return TorchRunner(model.config, model.weights, slots, **options)
    if model.folder is None:
        raise InvalidInputError("the model has neither weights nor a folder to read them from", "model")
    return TorchRunner.from_folder(model.folder, model.config, slots, **options)
