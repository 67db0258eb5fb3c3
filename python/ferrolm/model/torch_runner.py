"""``TorchRunner``: the Llama-family forward in torch, on CUDA or the CPU, in the
checkpoint's dtype (or one asked for).

The same ``ForwardBatch`` columns as ``NumpyRunner``, the same architectures (Llama 2/3
with llama3 RoPE scaling, Qwen2 biases, Qwen3 q/k norm, Mistral sliding window) and one
code path for every device: plain torch ops and ``scaled_dot_product_attention`` over
the slots of a paged KV pool held as torch tensors on the runner's device. On the CPU,
attention runs in the Rust core's paged-attention kernel instead (``attention="kernel"``,
reading the pool's tensors in place through zero-copy numpy views; the SDPA path stays as
its reference) and the weight matrices are kept as ``[in, out]`` for ``x @ w`` (MKL's
one-row product over the ``[out, in]`` layout ``F.linear`` takes is several times slower
there: 1.4 ms against 0.34 ms for a 32k-vocabulary head).

In float32 on the CPU the forward is ``NumpyRunner``'s code run over numpy views of this
runner's own tensors (weights and pool: nothing is copied), so the torch runner is never
the slower choice there. Profiled on this project's 2-core EPYC (py-spy, decode at one
request), the same forward in torch ops took 1.5x as long: about 20 ops a layer at 1-2 µs
of dispatch each where numpy's cost 0.3-1 µs (``F.rms_norm`` alone 7 µs a call), and
torch's MKL runs these products 1.5-1.8x slower than OpenBLAS on AMD processors. bf16 and
float16 on the CPU (which numpy cannot compute in) run the torch ops with the kernel; the
torch-ops path with SDPA (``attention="reference"``) is what CUDA runs and what the CPU
tests check against the numpy runner and transformers. Numerics follow
transformers' modeling code (RMSNorm in float32, cast back before the weight; RoPE's
cos/sin cast to the activations' dtype), so a bf16 model gives what transformers gives.

torch is an optional dependency (``pip install 'ferrolm[torch]'``), imported on first use
(importing it takes a second or more, and the API process never needs it); without it
this module still imports, and building a runner raises ``InvalidInputError`` saying so.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig
from ferrolm.model.device_sampler import DeviceDraws
from ferrolm.model.device_sampler import sample as sample_on_device
from ferrolm.model.lora import AdapterCache, StepAdapters
from ferrolm.model.rope import attention_factor, inverse_frequencies, rotation
from ferrolm.model.runner import Batch, ModelRunner, NumpyRunner, _AttentionPlan, _Layer
from ferrolm.model.weights import check_weights, layer_prefix, read_checkpoint

# torch and torch.nn.functional once loaded (see _load_torch)
torch: Any = None
F: Any = None

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bfloat16", "float16", "float32")
TORCH_MISSING = "torch is not installed: pip install 'ferrolm[torch]' (or pip install torch) to use the torch runner"


def _import_torch() -> Any:
    """The torch module, or None where it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _load_torch() -> Any:
    global torch, F
    if torch is None:
        module = _import_torch()
        if module is not None:
            F = importlib.import_module("torch.nn.functional")
            torch = module
    return torch


def torch_available() -> bool:
    return _load_torch() is not None


def _require_torch() -> Any:
    if _load_torch() is None:
        raise InvalidInputError(TORCH_MISSING, "runner")
    return torch


def cuda_driver_present() -> bool:
    """Whether the CUDA driver library loads: a check that costs microseconds, where
    importing torch to ask it costs a second or more."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def cuda_available() -> bool:
    """Whether torch can use a CUDA device; without a CUDA driver, known without importing
    torch (so ``--runner auto`` on a CPU-only machine never loads it)."""
    if torch is None and not cuda_driver_present():
        return False
    return _load_torch() is not None and bool(torch.cuda.is_available())


def resolve_device(device: Any = "auto") -> Any:
    """A ``torch.device`` for ``auto`` (CUDA where present, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N``; CUDA asked for but absent is an error."""
    _require_torch()
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str) or not (device in DEVICES or device.startswith("cuda:")):
        raise InvalidInputError(f"device must be one of {DEVICES} (or cuda:N), got {device!r}", "device")
    if device == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    if device.startswith("cuda"):
        if not cuda_available():
            raise InvalidInputError(
                f"device {device!r} asked for, but torch sees no CUDA device "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); use --device cpu",
                "device",
            )
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise InvalidInputError(
                f"device {device!r} asked for, but there are {torch.cuda.device_count()} CUDA devices", "device"
            )
    return torch.device(device)


def resolve_dtype(dtype: Any, device: Any, stored: Any = None) -> Any:
    """The compute dtype: ``auto`` is the checkpoint's ``stored`` dtype on CUDA (float32
    if unknown or float64) and float32 on the CPU, where bf16 matmuls are slow on most
    processors; or ``bfloat16``/``float16``/``float32`` (a ``torch.dtype`` too)."""
    _require_torch()
    names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if isinstance(dtype, torch.dtype):
        if dtype not in names.values():
            raise InvalidInputError(f"dtype must be one of {DTYPES}, got {dtype}", "dtype")
        chosen = dtype
    elif dtype is None or dtype == "auto":
        on_cuda = torch.device(device).type == "cuda"
        chosen = stored if on_cuda and stored in names.values() else torch.float32
    elif dtype in names:
        chosen = names[dtype]
    else:
        raise InvalidInputError(f"dtype must be one of {DTYPES}, got {dtype!r}", "dtype")
    if torch.device(device).type == "cuda" and chosen == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise InvalidInputError("this CUDA device cannot run bfloat16; use --dtype float16 or float32", "dtype")
    return chosen


def device_memory(device: Any) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device's memory."""
    if torch.device(device).type != "cuda":
        raise InvalidInputError(
            "--mem-fraction-static sizes the KV pool from a CUDA device's memory; on the CPU give --max-total-tokens",
            "mem_fraction_static",
        )
    torch.cuda.empty_cache()  # blocks freed while loading count as free
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def pool_slots_for(config: ModelConfig, device: Any, dtype: Any, fraction: float) -> int:
    """KV slots that fit when weights, pool and what else is allocated take at most
    ``fraction`` of the device's memory (SGLang's ``--mem-fraction-static``): the rest is
    left to activations and the allocator."""
    if not 0 < fraction < 1:
        raise InvalidInputError(f"mem_fraction_static must be in (0, 1), got {fraction}", "mem_fraction_static")
    free, total = device_memory(device)
    in_use = total - free
    budget = fraction * total - in_use
    per_slot = config.kv_bytes_per_slot(torch.empty((), dtype=dtype).element_size())
    slots = int(budget // per_slot)
    if slots < 1:
        raise InvalidInputError(
            f"--mem-fraction-static {fraction}: {fraction} of {total / 2**30:.1f} GiB leaves no room for a KV pool "
            f"beside the {in_use / 2**30:.1f} GiB in use (weights included); raise it or use a smaller --dtype",
            "mem_fraction_static",
        )
    return slots


def _as_tensor(value: Any) -> Any:
    """A torch tensor of a numpy array (bf16 from ml_dtypes included) or a tensor."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.ascontiguousarray(value)
    if array.dtype.name == "bfloat16":  # ml_dtypes: torch cannot read it, but the bits are the same
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
ATTENTION_BACKENDS = ("kernel", "reference")
KV_CACHE_DTYPES = ("float32", "float16", "bfloat16")


def _numpy_fields(layer: Any) -> dict[str, Any]:
    """A layer's tensors as numpy arrays (no copy), by ``_Layer``'s field names."""
    return {f: None if getattr(layer, f) is None else getattr(layer, f).numpy() for f in _Layer.__slots__}


def _numpy_view(tensor: Any) -> np.ndarray:
    """A CPU tensor's memory as a numpy array, no copy (bf16 through ml_dtypes, whose bits
    are torch's)."""
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


@dataclass(frozen=True, slots=True)
class _TorchLayer:
    input_norm: Any
    qkv: Any  # [(heads + 2 * kv_heads) * head_dim, hidden]: one matmul for q, k, v
    qkv_bias: Any
    q_norm: Any
    k_norm: Any
    o: Any
    o_bias: Any
    post_norm: Any
    gate_up: Any  # [2 * intermediate, hidden]: one matmul for gate and up
    gate_up_bias: Any
    down: Any
    down_bias: Any


@dataclass(frozen=True, slots=True)
class _TorchPlan:
    """A batch's index tensors on the device, built once per forward, used by every layer."""

    decode_rows: Any  # [S] or None
    decode_slots: Any  # [S, L]
    decode_mask: Any  # [S, 1, 1, L]: True where attended
    chunks: list[tuple[int, int, Any, Any]]  # (first token, end token, slots, mask, "causal" or None)


class TorchRunner(ModelRunner):
    """The Llama-family forward in torch over a paged KV pool on ``device``.

    ``weights``: Hugging Face names to numpy arrays or torch tensors (any float dtype);
    they are converted once to ``dtype`` on ``device``. ``TorchRunner.from_folder`` reads a
    checkpoint straight into torch instead (no float32 numpy copy on the way).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, Any],
        num_slots: int | None,
        *,
        device: Any = "auto",
        dtype: Any = "auto",
        mem_fraction_static: float | None = None,
        kv_cache_dtype: str | None = None,
        attention: str | None = None,
        _consume: bool = False,
    ) -> None:
        """``num_slots=None`` with ``mem_fraction_static`` (CUDA): as many slots as fit in
        that fraction of the device's memory once the weights are in (see ``pool_slots_for``).
        ``kv_cache_dtype``: the pool's element type (``float32``/``float16``/``bfloat16``;
        None: the compute ``dtype``). ``attention``: ``kernel`` (the core's kernel, CPU
        only) or ``reference`` (SDPA over the gathered slots); None: the kernel on the
        CPU unless ``FERROLM_ATTENTION=reference``, SDPA elsewhere."""
        _require_torch()
        if num_slots is None:
            if mem_fraction_static is None:
                raise InvalidInputError("give num_slots, or mem_fraction_static to size the pool from memory")
        elif num_slots < 1:
            raise InvalidInputError(f"num_slots must be positive, got {num_slots}")
        check_weights(weights, config)
        self.config = config
        self.num_slots = num_slots or 0  # set below when sized from memory
        self.device = resolve_device(device)
        stored = _as_tensor(weights["model.embed_tokens.weight"]).dtype
        self.dtype = resolve_dtype(dtype, self.device, stored)
        on_cpu = self.device.type == "cpu"
        if attention is None:
            attention = "reference" if os.environ.get("FERROLM_ATTENTION") == "reference" or not on_cpu else "kernel"
        if attention not in ATTENTION_BACKENDS:
            raise InvalidInputError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}", "attention")
        if attention == "kernel" and not on_cpu:
            raise InvalidInputError(
                "the core's attention kernel runs on the CPU; on CUDA use attention='reference'", "attention"
            )
        self.attention = attention
        if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidInputError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}", "kv_cache_dtype"
            )
        self.kv_dtype = getattr(torch, kv_cache_dtype) if kv_cache_dtype else self.dtype
        # [in, out] matrices for x @ w on the CPU (see the module's doc); [out, in] for F.linear elsewhere
        self.rows_in = on_cpu

        c = config
        converted: dict[int, Any] = {}  # id of a source array -> its tensor (tied weights stay one)

        def t(name: str) -> Any:
            value = weights[name]
            if id(value) not in converted:
                tensor = _as_tensor(value)
                if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
                    raise InvalidInputError(
                        f"checkpoint tensor {name!r} has dtype {tensor.dtype}; expected bf16, fp16 or fp32"
                    )
                converted[id(value)] = tensor.to(device=self.device, dtype=self.dtype).contiguous()
            return converted[id(value)]

        def opt(name: str) -> Any:
            return t(name) if name in weights else None

        def cat(names: list[str]) -> Any:
            if names[0] not in weights:
                return None
            return torch.cat([t(n) for n in names]).contiguous()

        def matrix(tensor: Any) -> Any:
            return tensor.t().contiguous() if self.rows_in and tensor is not None else tensor

        self.lm_head = matrix(t("lm_head.weight"))
        tied = weights["model.embed_tokens.weight"] is weights["lm_head.weight"]
        # tied on the CPU: the embedding rows are read as columns of the [hidden, vocab] head
        self.embed = None if tied and self.rows_in else t("model.embed_tokens.weight")
        self.final_norm = t("model.norm.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = layer_prefix(i)
            attn, mlp = p + "self_attn.", p + "mlp."
            self.layers.append(
                _TorchLayer(
                    input_norm=t(p + "input_layernorm.weight"),
                    qkv=matrix(cat([attn + f"{x}_proj.weight" for x in "qkv"])),
                    qkv_bias=cat([attn + f"{x}_proj.bias" for x in "qkv"]),
                    q_norm=opt(attn + "q_norm.weight"),
                    k_norm=opt(attn + "k_norm.weight"),
                    o=matrix(t(attn + "o_proj.weight")),
                    o_bias=opt(attn + "o_proj.bias"),
                    post_norm=t(p + "post_attention_layernorm.weight"),
                    gate_up=matrix(cat([mlp + "gate_proj.weight", mlp + "up_proj.weight"])),
                    gate_up_bias=cat([mlp + "gate_proj.bias", mlp + "up_proj.bias"]),
                    down=matrix(t(mlp + "down_proj.weight")),
                    down_bias=opt(mlp + "down_proj.bias"),
                )
            )
            # the per-projection tensors were only needed for the fused ones
            for n in [attn + f"{x}_proj.{k}" for x in "qkv" for k in ("weight", "bias")] + [
                mlp + f"{x}_proj.{k}" for x in ("gate", "up") for k in ("weight", "bias")
            ]:
                if n in weights:
                    converted.pop(id(weights[n]), None)
                    if _consume:  # from_folder's own dict: drop them now, not after the last layer
                        del weights[n]  # type: ignore[attr-defined]
        self.inv_freq = inverse_frequencies(c)
        if _consume:
            weights.clear()  # type: ignore[attr-defined]  # from_folder's tensors: only the runner holds them now
        converted.clear()
        if num_slots is None:
            num_slots = pool_slots_for(c, self.device, self.kv_dtype, float(mem_fraction_static or 0))
            self.num_slots = num_slots
        pool_shape = (num_slots, c.num_kv_heads, c.head_dim)
        # the paged KV pool: slot s of layer l holds the key/value of one token
        try:
            self.k_pool = [
                torch.zeros(pool_shape, dtype=self.kv_dtype, device=self.device) for _ in range(c.num_layers)
            ]
            self.v_pool = [
                torch.zeros(pool_shape, dtype=self.kv_dtype, device=self.device) for _ in range(c.num_layers)
            ]
        except (torch.OutOfMemoryError, RuntimeError) as e:  # CUDA OOM; the CPU allocator's RuntimeError
            self.k_pool = self.v_pool = []
            size = num_slots * c.kv_bytes_per_slot(torch.empty((), dtype=self.kv_dtype).element_size())
            raise InvalidInputError(
                f"a KV pool of {num_slots} slots ({size / 2**30:.2f} GiB in {str(self.kv_dtype).removeprefix('torch.')}) "
                f"does not fit on {self.device} beside the weights; ask for fewer slots "
                f"(--max-total-tokens): {str(e).splitlines()[0]}",
                "kv_capacity",
            ) from None
        # adapters' matrices on the device, in the compute dtype, for the adapters of recent steps
        self._lora_cache = AdapterCache(
            lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device=self.device, dtype=self.dtype)
        )
        # the kernel reads and writes the pool in place through these views (same memory)
        self._k_views = [_numpy_view(p) for p in self.k_pool] if attention == "kernel" else []
        self._v_views = [_numpy_view(p) for p in self.v_pool] if attention == "kernel" else []
        # float32 with the kernel on the CPU: NumpyRunner's forward over views of these
        # tensors (see the module's doc)
        self._numpy: NumpyRunner | None = None
        if attention == "kernel" and self.dtype == torch.float32:
            self._numpy = NumpyRunner.over(
                c,
                [_Layer(**_numpy_fields(layer)) for layer in self.layers],
                head=self.lm_head.numpy(),
                embed=None if self.embed is None else self.embed.numpy(),
                final_norm=self.final_norm.numpy(),
                k_pool=self._k_views,
                v_pool=self._v_views,
            )

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        config: ModelConfig,
        num_slots: int | None,
        *,
        device: Any = "auto",
        dtype: Any = "auto",
        mem_fraction_static: float | None = None,
        kv_cache_dtype: str | None = None,
        attention: str | None = None,
    ) -> TorchRunner:
        """Reads the safetensors checkpoint in ``folder`` (sharded or not) straight into
        torch tensors on the device, in their stored dtype, then converts to ``dtype``."""
        _require_torch()
        place = resolve_device(device)
        tensors: dict[str, Any] = dict(read_checkpoint(folder, config, framework="pt", device=str(place)))
        if config.tie_word_embeddings and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        # consumed as the fused tensors are built: peak memory is the checkpoint plus one layer
        return cls(
            config,
            tensors,
            num_slots,
            device=place,
            dtype=dtype,
            mem_fraction_static=mem_fraction_static,
            kv_cache_dtype=kv_cache_dtype,
            attention=attention,
            _consume=True,
        )

    def embedding_matrix(self) -> Any:
        """The token embedding ``[vocab, hidden]``: a view of the head where the two are
        tied and the head is kept as ``[hidden, vocab]`` (the CPU)."""
        return self.lm_head.t() if self.embed is None else self.embed

    def kv_pool_bytes(self) -> int:
        return sum(int(p.numel() * p.element_size()) for p in (*self.k_pool, *self.v_pool))

    def forward(self, batch: Batch, *, all_logits: bool = False) -> np.ndarray:
        self._check(batch)
        if self._numpy is not None:
            return self._numpy.logits(batch, all_logits=all_logits)
        with torch.inference_mode():
            logits = self._forward(batch, all_logits)
            return logits.float().cpu().numpy()

    def _logits(self, batch: Batch) -> Any:
        """Each request's logits as a tensor on the device (a view of the numpy result on
        the CPU in float32)."""
        if self._numpy is not None:
            return torch.from_numpy(self._numpy.logits(batch))
        return self._forward(batch, all_logits=False)

    def forward_greedy(
        self,
        batch: Batch,
        eos_token_ids: Sequence[int] = (),
        ignore_eos: np.ndarray | None = None,
        vocab_size: int | None = None,
    ) -> np.ndarray:
        """As ``forward``, but returns each request's greedy token (int32 ``[B]``), picked
        on the device: only B ids cross to the host, not B x vocab logits. Rows where
        ``ignore_eos`` is true never pick an id of ``eos_token_ids``; only the first
        ``vocab_size`` logits count (the engine core's vocabulary may be smaller than the
        model's padded one). Ties go to the lowest id, as in the core's sampler."""
        self._check(batch)
        # the rows that never pick an EOS id (none without EOS ids to exclude)
        eos_rows = np.flatnonzero(ignore_eos) if ignore_eos is not None and len(eos_token_ids) > 0 else np.empty(0, int)
        masked = len(eos_rows) > 0
        with torch.inference_mode():
            logits = self._logits(batch)
            if self.device.type == "cpu":
                # numpy's argmax (first of equals too) is ~10x torch's here, and its fancy
                # assignment ~20x torch's on a column slice
                host = logits.float().numpy()
                if masked:
                    host[np.ix_(eos_rows, np.asarray(eos_token_ids))] = -np.inf
                return np.argmax(host[:, :vocab_size], axis=-1).astype(np.int32)
            if masked:
                rows = self._index(eos_rows)
                eos = self._index(np.asarray(eos_token_ids))
                logits[rows[:, None], eos[None, :]] = float("-inf")
            return logits[:, :vocab_size].argmax(dim=-1).to(torch.int32).cpu().numpy()

    def forward_sample(self, batch: Batch, sampling: Any, vocab_size: int | None = None) -> DeviceDraws:
        """As ``forward``, then each request's token drawn on the device under
        ``sampling`` (the step's ``SamplingBatch`` from the engine core; see
        ``device_sampler``): only the ids, and the logprobs asked for, cross to the host.
        Only the first ``vocab_size`` logits count (the core's vocabulary may be smaller
        than the model's padded one)."""
        self._check(batch)
        with torch.inference_mode():
            logits = self._logits(batch)
            return sample_on_device(logits, sampling, vocab_size or logits.shape[1])

    def _check(self, batch: Batch) -> None:
        if batch.num_tokens and int(batch.input_ids.max()) >= self.config.vocab_size:
            raise InvalidInputError(f"ForwardBatch.input_ids holds an id >= vocab size {self.config.vocab_size}")
        if batch.kv_slots.size and int(batch.kv_slots.max()) >= self.num_slots:
            raise InvalidInputError(f"ForwardBatch.kv_slots holds a slot >= num_slots {self.num_slots}")

    def _index(self, array: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(self.device)

    def _norm(self, x: Any, weight: Any) -> Any:
        return _rms_norm(x, weight, self.config.rms_norm_eps)

    def _linear(self, x: Any, weight: Any, bias: Any) -> Any:
        if not self.rows_in:
            return F.linear(x, weight, bias)
        return torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)

    def _plan(self, batch: Batch) -> _TorchPlan | None:
        if self.attention == "kernel":
            return None  # the kernel reads the batch's columns as they are
        plan = _AttentionPlan.of(batch, self.config.sliding_window)
        window = self.config.sliding_window
        rows = slots = mask = None
        if plan.decode_rows.size:
            rows = self._index(plan.decode_rows)
            slots = self._index(plan.decode_slots)
            mask = torch.from_numpy(~plan.decode_hidden).to(self.device)[:, None, None, :]
        chunks = []
        for q0, q1, chunk_slots in plan.chunks:
            n, m = q1 - q0, chunk_slots.size
            chunk_mask: Any = None
            if n > 1 and n == m and (window is None or m <= window):
                # a whole prompt: the plain causal mask, which fused kernels (flash) take
                # without a mask tensor
                chunk_mask = "causal"
            elif n > 1 or (window is not None and m > window):
                # query i sits at kv index m - n + i and sees kv indices up to it (and,
                # with a sliding window, only the last `window` of them)
                query = torch.arange(m - n, m, device=self.device)[:, None]
                kv = torch.arange(m, device=self.device)[None, :]
                visible = kv <= query
                if window is not None:
                    visible &= kv > query - window
                chunk_mask = visible
            chunks.append((q0, q1, self._index(chunk_slots), chunk_mask))
        return _TorchPlan(rows, slots, mask, chunks)

    def _forward(self, batch: Batch, all_logits: bool) -> Any:
        # float32 [T, 1, d/2], angles in float64
        cos_np, sin_np = rotation(self.inv_freq, batch.positions, attention_factor(self.config))
        cos = torch.from_numpy(np.concatenate([cos_np, cos_np], axis=-1)).to(device=self.device, dtype=self.dtype)
        sin = torch.from_numpy(np.concatenate([-sin_np, sin_np], axis=-1)).to(device=self.device, dtype=self.dtype)
        plan = self._plan(batch)
        out_slots = self._index(batch.out_slots)
        ids = self._index(batch.input_ids)
        if self.embed is None:  # tied, on the CPU: rows of the embedding are columns of the head
            x = self.lm_head.index_select(1, ids).t().contiguous()
        else:
            x = self.embed.index_select(0, ids)
        adapters = StepAdapters.of(batch, self._lora_cache, self._index)
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            x = x + self._attention(layer, h, batch, plan, cos, sin, out_slots, i, adapters)
            x = x + self._mlp(layer, self._norm(x, layer.post_norm), i, adapters)
        if not all_logits:
            rows = batch.logit_rows  # each request's last new token (and its drafts' rows)
            assert rows is not None, "set by ForwardBatch.__post_init__"
            x = x.index_select(0, self._index(rows))
        return self._linear(self._norm(x, self.final_norm), self.lm_head, None)

    def _attention(
        self,
        layer: _TorchLayer,
        h: Any,
        batch: Batch,
        plan: _TorchPlan | None,
        cos: Any,
        sin: Any,
        out_slots: Any,
        index: int,
        adapters: StepAdapters | None = None,
    ) -> Any:
        c = self.config
        num_new = h.shape[0]
        k_pool, v_pool = self.k_pool[index], self.v_pool[index]
        qkv = self._linear(h, layer.qkv, layer.qkv_bias)
        q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        if adapters is not None:
            adapters.add(index, "q_proj", h, qkv[:, :q_width])
            adapters.add(index, "k_proj", h, qkv[:, q_width : q_width + kv_width])
            adapters.add(index, "v_proj", h, qkv[:, q_width + kv_width :])
        v = qkv[:, q_width + kv_width :].reshape(num_new, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: each head normalized first
            q = qkv[:, :q_width].reshape(num_new, c.num_heads, c.head_dim)
            k = qkv[:, q_width : q_width + kv_width].reshape(num_new, c.num_kv_heads, c.head_dim)
            q = _rotate(self._norm(q, layer.q_norm), cos, sin)
            k = _rotate(self._norm(k, layer.k_norm), cos, sin)
        else:  # q and k side by side in qkv: rotated in one go
            qk = _rotate(
                qkv[:, : q_width + kv_width].reshape(num_new, c.num_heads + c.num_kv_heads, c.head_dim), cos, sin
            )
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
        # index_copy_/index_select move whole slots: far faster on the CPU than
        # advanced indexing, which walks element by element
        k_pool.index_copy_(0, out_slots, k.to(self.kv_dtype))
        v_pool.index_copy_(0, out_slots, v.to(self.kv_dtype))
        if plan is None:
            out = self._attend_kernel(q, batch, index)
        else:
            out = self._attend_reference(q, plan, k_pool, v_pool)
        attended = out.reshape(num_new, q_width)
        o = self._linear(attended, layer.o, layer.o_bias)
        if adapters is not None:
            adapters.add(index, "o_proj", attended, o)
        return o

    def _attend_kernel(self, q: Any, batch: Batch, index: int) -> Any:
        """The core's paged-attention kernel over the pool's memory, in place (float32
        queries and output; the pool in its own dtype)."""
        c = self.config
        out = torch.empty((q.shape[0], c.num_heads, c.head_dim), dtype=torch.float32)
        _core.paged_attention(
            q.to(torch.float32).contiguous().numpy(),
            self._k_views[index],
            self._v_views[index],
            batch.positions,
            batch.qo_offsets,
            batch.kv_slots,
            batch.kv_offsets,
            out.numpy(),
            scale=c.head_dim**-0.5,
            sliding_window=c.sliding_window,
        )
        return out.to(q.dtype)

    def _attend_reference(self, q: Any, plan: _TorchPlan, k_pool: Any, v_pool: Any) -> Any:
        """SDPA over the slots gathered out of the pool (decodes padded to the longest)."""
        c = self.config
        out = torch.empty((q.shape[0], c.num_heads, c.head_dim), dtype=q.dtype, device=q.device)
        grouped = c.num_kv_heads != c.num_heads
        if plan.decode_rows is not None:
            # [S, heads, 1, d] over [S, kv_heads, L, d]
            shape = (*plan.decode_slots.shape, c.num_kv_heads, c.head_dim)
            flat = plan.decode_slots.view(-1)
            keys = k_pool.index_select(0, flat).to(q.dtype).view(shape).transpose(1, 2)
            values = v_pool.index_select(0, flat).to(q.dtype).view(shape).transpose(1, 2)
            attended = F.scaled_dot_product_attention(
                q.index_select(0, plan.decode_rows).unsqueeze(2),
                keys,
                values,
                attn_mask=plan.decode_mask,
                enable_gqa=grouped,
            )
            out.index_copy_(0, plan.decode_rows, attended.squeeze(2))
        for q0, q1, slots, mask in plan.chunks:
            causal = isinstance(mask, str)
            # [1, heads, n, d] over [1, kv_heads, m, d]
            attended = F.scaled_dot_product_attention(
                q[q0:q1].transpose(0, 1).unsqueeze(0),
                k_pool.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0),
                v_pool.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0),
                attn_mask=None if causal else mask,
                is_causal=causal,
                enable_gqa=grouped,
            )
            out[q0:q1] = attended[0].transpose(0, 1)
        return out

    def _mlp(self, layer: _TorchLayer, h: Any, index: int = 0, adapters: StepAdapters | None = None) -> Any:
        gate, up = self._linear(h, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
        if adapters is not None:
            adapters.add(index, "gate_proj", h, gate)
            adapters.add(index, "up_proj", h, up)
        act = F.silu(gate) * up
        down = self._linear(act, layer.down, layer.down_bias)
        if adapters is not None:
            adapters.add(index, "down_proj", act, down)
        return down


def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """As transformers: normalized in float32, cast back, then scaled by the weight (in
    float32, torch's fused kernel does the same in one op instead of seven)."""
    dtype = x.dtype
    if dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    """RoPE, rotate-half style: dimension i pairs with i + head_dim / 2. ``cos`` is the
    half-width cosines twice, ``sin`` the sines negated then as they are, so that with the
    halves swapped (a roll by half the width) it is four ops, each value the same as
    transformers' ``q * cos + rotate_half(q) * sin``."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
