"""The model runner: one forward step over a batch of requests and a paged KV pool.

The engine owns the bookkeeping (which slot holds which token); the runner owns the
pool's arrays and only reads and writes the slots a batch names. A batch is columnar:
flat arrays plus offsets, so it crosses the Rust/Python boundary as a few numpy arrays.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig
from ferrolm.model.lora import AdapterCache, StepAdapters
from ferrolm.model.rope import apply_rotation, attention_factor, inverse_frequencies, rotation
from ferrolm.model.weights import Weights, check_weights, layer_prefix


def _int32_vector(name: str, value: np.ndarray | Sequence[int]) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 1:
        raise InvalidInputError(f"ForwardBatch.{name} must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise InvalidInputError(f"ForwardBatch.{name} must hold integers, got {array.dtype}")
    if array.size and (array.min() < 0 or array.max() > np.iinfo(np.int32).max):
        raise InvalidInputError(f"ForwardBatch.{name} holds a value outside [0, 2**31)")
    return np.ascontiguousarray(array, dtype=np.int32)


def _check_offsets(name: str, offsets: np.ndarray, total: int, data: str) -> None:
    if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != total:
        raise InvalidInputError(
            f"ForwardBatch.{name} must start at 0 and end at len({data}) = {total} (B + 1 entries, B >= 1)"
        )


# rows of queries attended at once in a prefill: bounds its score matrix to
# heads x _QUERY_BLOCK x context floats
_QUERY_BLOCK = 256


# KV pool element types: name -> numpy dtype (bfloat16 from ml_dtypes)
def _kv_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name in ("float32", "float16"):
        return np.dtype(name)
    raise InvalidInputError(f"kv_cache_dtype must be float32, float16 or bfloat16, got {name!r}")


_ATTENTION_BACKENDS = ("kernel", "reference")

_COLUMNS = ("input_ids", "positions", "out_slots", "qo_offsets", "kv_slots", "kv_offsets")


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """One step's work, for B requests and T new tokens in all.

    - ``input_ids``, ``positions``, ``out_slots``: int32 ``[T]``, the new tokens of every
      request one after another, each token's position in its sequence, and the KV slot
      its key and value are written to.
    - ``qo_offsets``: int32 ``[B + 1]``; request b's new tokens are
      ``input_ids[qo_offsets[b]:qo_offsets[b + 1]]`` (at least one each).
    - ``kv_slots`` + ``kv_offsets``: the slots request b attends to, in position order:
      its cached prefix first, then its new tokens (so the last ones equal its
      ``out_slots``, and the ``positions`` of its new tokens are their indices there).

    A decode batch is B requests with one new token each; a prefill of an uncached suffix
    is one request whose ``kv_slots`` start with the cached prefix. Construction checks
    the shapes and the consistency between the columns (cheap next to a forward pass).
    """

    input_ids: np.ndarray
    positions: np.ndarray
    out_slots: np.ndarray
    qo_offsets: np.ndarray
    kv_slots: np.ndarray
    kv_offsets: np.ndarray
    # the new tokens whose logits ``forward`` returns, in order (None: each request's last)
    logit_rows: np.ndarray | None = None
    # each request's LoRA adapter (``_core.StepLoras``), or None when none has one
    loras: _core.StepLoras | None = None

    def __post_init__(self) -> None:
        for name in _COLUMNS:
            object.__setattr__(self, name, _int32_vector(name, getattr(self, name)))
        num_new = self.input_ids.size
        if self.positions.size != num_new or self.out_slots.size != num_new:
            raise InvalidInputError(
                f"ForwardBatch.positions ({self.positions.size}) and out_slots ({self.out_slots.size}) "
                f"must have one entry per new token ({num_new})"
            )
        _check_offsets("qo_offsets", self.qo_offsets, num_new, "input_ids")
        _check_offsets("kv_offsets", self.kv_offsets, self.kv_slots.size, "kv_slots")
        if self.kv_offsets.size != self.qo_offsets.size:
            raise InvalidInputError("ForwardBatch.kv_offsets and qo_offsets must both have B + 1 entries")
        new_lengths = np.diff(self.qo_offsets)
        kv_lengths = np.diff(self.kv_offsets)
        if (new_lengths < 1).any():
            raise InvalidInputError("ForwardBatch.qo_offsets gives a request no new token")
        if (kv_lengths < new_lengths).any():
            raise InvalidInputError("ForwardBatch.kv_offsets gives a request fewer KV slots than new tokens")
        # the tail of each request's kv_slots must be the slots its new tokens write
        request_of_token = np.repeat(np.arange(self.batch_size), new_lengths)
        tail_index = (
            self.kv_offsets[1:][request_of_token]
            - new_lengths[request_of_token]
            + (np.arange(num_new) - self.qo_offsets[:-1][request_of_token])
        )
        if not np.array_equal(self.kv_slots[tail_index], self.out_slots):
            raise InvalidInputError("ForwardBatch.kv_slots must end, for each request, with its out_slots")
        # slot j of a request holds position j: the causal mask relies on it
        if not np.array_equal(tail_index - self.kv_offsets[:-1][request_of_token], self.positions):
            raise InvalidInputError("ForwardBatch.positions must number each request's kv_slots from 0")
        if np.unique(self.out_slots).size != num_new:
            raise InvalidInputError("ForwardBatch.out_slots names a slot twice")
        if self.loras is not None and len(self.loras) != self.batch_size:
            raise InvalidInputError(f"ForwardBatch.loras has {len(self.loras)} entries for {self.batch_size} requests")
        if self.logit_rows is None:
            object.__setattr__(self, "logit_rows", self.qo_offsets[1:] - 1)
        else:
            rows = _int32_vector("logit_rows", self.logit_rows)
            if rows.size and (rows.max() >= num_new or (np.diff(rows) <= 0).any()):
                raise InvalidInputError("ForwardBatch.logit_rows must be increasing indices of new tokens")
            object.__setattr__(self, "logit_rows", rows)

    @property
    def batch_size(self) -> int:
        return int(self.qo_offsets.size - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.size)

    @classmethod
    def from_plan(cls, plan: Any) -> ForwardBatch:
        """The forward part of the engine core's ``BatchPlan`` (any object with these
        columns as attributes); its other columns (rids, samples, ...) stay with the loop.

        A ``_core.BatchPlan`` is taken as it is: only the core makes one (Python can
        neither construct nor subclass it), its columns are already contiguous int32,
        and the core's own tests hold it to the invariants checked here; checking again
        cost more than a decode step's whole bookkeeping. Any other plan is checked."""
        if type(plan) is _core.BatchPlan:
            return cls._unchecked(
                plan.input_ids,
                plan.positions,
                plan.out_slots,
                plan.qo_offsets,
                plan.kv_slots,
                plan.kv_offsets,
                plan.logit_rows,
                plan.loras,
            )
        columns = {name: getattr(plan, name) for name in _COLUMNS}
        return cls(**columns, logit_rows=getattr(plan, "logit_rows", None), loras=getattr(plan, "loras", None))

    @classmethod
    def _unchecked(cls, *columns: Any) -> ForwardBatch:
        """A batch of columns known to be consistent int32 vectors (``_COLUMNS`` order),
        without ``__post_init__``'s checks."""
        batch = object.__new__(cls)
        for name, column in zip((*_COLUMNS, "logit_rows", "loras"), columns, strict=True):
            object.__setattr__(batch, name, column)
        return batch

    @classmethod
    def from_requests(cls, new_token_ids: Sequence[Sequence[int]], kv_slots: Sequence[Sequence[int]]) -> ForwardBatch:
        """Builds a batch from per-request lists (for tests and simple callers): request b
        appends ``new_token_ids[b]`` to a sequence whose slots, new tokens included, are
        ``kv_slots[b]``; positions count from 0 at the first slot."""
        if not new_token_ids or len(new_token_ids) != len(kv_slots):
            raise InvalidInputError("from_requests needs at least one request and one kv_slots list per request")
        positions, out_slots = [], []
        for ids, slots in zip(new_token_ids, kv_slots, strict=True):
            n, m = len(ids), len(slots)
            positions.append(np.arange(m - n, m))
            out_slots.append(np.asarray(slots[m - n :], dtype=np.int64))
        return cls(
            input_ids=np.concatenate([np.asarray(ids, dtype=np.int64) for ids in new_token_ids]),
            positions=np.concatenate(positions),
            out_slots=np.concatenate(out_slots),
            qo_offsets=np.concatenate([[0], np.cumsum([len(ids) for ids in new_token_ids])]),
            kv_slots=np.concatenate([np.asarray(s, dtype=np.int64) for s in kv_slots]),
            kv_offsets=np.concatenate([[0], np.cumsum([len(s) for s in kv_slots])]),
        )


# What a runner's ``forward`` takes: a ``ForwardBatch``, or the core's ``BatchPlan`` as it
# is (the same columns, contiguous int32, which the core holds to the invariants that
# ``ForwardBatch`` checks): a step loop then builds no Python object per step for it.
Batch: TypeAlias = ForwardBatch | _core.BatchPlan


class ModelRunner(ABC):
    """Runs the model over a paged KV pool of ``num_slots`` token slots it owns."""

    config: ModelConfig
    num_slots: int

    @abstractmethod
    def forward(self, batch: Batch, *, all_logits: bool = False) -> np.ndarray:
        """Writes the new tokens' keys and values to their slots and returns float32
        logits ``[R, vocab]`` of the new tokens at ``batch.logit_rows`` (each request's
        last new token, and the tokens before it that a draft asks for), or ``[T, vocab]``
        of every new token when ``all_logits``."""


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's weights, laid out for ``activations @ weight``."""

    input_norm: np.ndarray
    qkv: np.ndarray  # [hidden, (heads + 2 * kv_heads) * head_dim]: one matmul for q, k, v
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    o: np.ndarray
    o_bias: np.ndarray | None
    post_norm: np.ndarray
    gate_up: np.ndarray  # [hidden, 2 * intermediate]: one matmul for gate and up
    gate_up_bias: np.ndarray | None
    down: np.ndarray
    down_bias: np.ndarray | None


@dataclass(frozen=True, slots=True)
class _AttentionPlan:
    """How a batch's attention is computed, worked out once per forward, not per layer.

    Requests with one new token (decodes) are attended together over their slots padded
    to the longest; requests with several (prefill chunks) one at a time, each with its
    own causal mask.
    """

    decode_rows: np.ndarray  # [S]: the token index of each decode
    decode_slots: np.ndarray  # [S, L]: its slots, padded by repeating its last slot
    decode_hidden: np.ndarray  # [S, L]: True where a slot must not be attended
    chunks: list[tuple[int, int, np.ndarray]]  # (first token, end token, slots) per prefill

    @classmethod
    def of(cls, batch: Batch, sliding_window: int | None) -> _AttentionPlan:
        qo, kvo = batch.qo_offsets, batch.kv_offsets
        new_lengths = np.diff(qo)
        decodes = np.flatnonzero(new_lengths == 1)
        if decodes.size < 2:  # padding pays off only when it saves a loop
            decodes = decodes[:0]
        lengths = (kvo[1:] - kvo[:-1])[decodes]
        width = int(lengths.max()) if decodes.size else 0
        index = np.arange(width)[None, :]
        last = lengths[:, None] - 1
        # padding repeats a written slot, so it holds finite values that the mask zeroes
        slots = batch.kv_slots[kvo[decodes][:, None] + np.minimum(index, last)]
        hidden = index > last
        if sliding_window is not None:
            hidden |= index <= last - sliding_window
        chunks = [
            (int(qo[b]), int(qo[b + 1]), batch.kv_slots[kvo[b] : kvo[b + 1]])
            for b in np.setdiff1d(np.arange(batch.batch_size), decodes)
        ]
        return cls(qo[decodes], slots, hidden, chunks)


def _gather(pool: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Rows of a KV pool as float32 (a copy: fancy indexing)."""
    rows = pool[slots]
    return rows if rows.dtype == np.float32 else rows.astype(np.float32)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The core's RMSNorm: one call where the same in numpy is five ops (about 5 µs of
    dispatch at a decode row, nine times a step)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _core.rms_norm(x, np.ascontiguousarray(weight, dtype=np.float32), out, eps=eps)
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    # sigmoid through tanh: exp(-x) would overflow (and warn) for very negative x
    return x * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * x))


def _concat_bias(weights: Weights, names: list[str]) -> np.ndarray | None:
    if names[0] not in weights:
        return None
    return np.concatenate([weights[n] for n in names])


class NumpyRunner(ModelRunner):
    """The Llama-family forward in float32 numpy, for CPUs and tests.

    Attention runs in the Rust core's paged-attention kernel (``attention="kernel"``,
    reading the pool in place) or in the pure-numpy code below it (``"reference"``: the
    gather-and-matmul path the kernel is tested against). ``kv_cache_dtype`` is the
    pool's element type: ``float32`` (exact), ``float16`` or ``bfloat16`` (half the
    memory; attention is computed in float32 either way). Unset, they come from
    ``FERROLM_ATTENTION`` and ``FERROLM_KV_CACHE_DTYPE``, else ``kernel`` and ``float32``.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        num_slots: int,
        *,
        kv_cache_dtype: str | None = None,
        attention: str | None = None,
    ) -> None:
        if num_slots < 1:
            raise InvalidInputError(f"num_slots must be positive, got {num_slots}")
        attention = attention or os.environ.get("FERROLM_ATTENTION") or "kernel"
        if attention not in _ATTENTION_BACKENDS:
            raise InvalidInputError(f"attention must be one of {_ATTENTION_BACKENDS}, got {attention!r}")
        self.attention = attention
        self.kv_cache_dtype = _kv_dtype(kv_cache_dtype or os.environ.get("FERROLM_KV_CACHE_DTYPE") or "float32")
        check_weights(weights, config)
        self.config = config
        self.num_slots = num_slots
        c = config
        # the head as [hidden, vocab] for x @ head: OpenBLAS's product over the transposed
        # [vocab, hidden] layout took 1.3-1.5x as long here (the largest matmul of a step)
        self.head = np.ascontiguousarray(np.asarray(weights["lm_head.weight"], dtype=np.float32).T)
        tied = weights["model.embed_tokens.weight"] is weights["lm_head.weight"]
        # tied: the embedding's rows are the head's columns (no second copy)
        self.embed = None if tied else np.ascontiguousarray(weights["model.embed_tokens.weight"], dtype=np.float32)
        self.final_norm = np.ascontiguousarray(weights["model.norm.weight"], dtype=np.float32)
        self.layers = [self._layer(weights, i) for i in range(c.num_layers)]
        self.inv_freq = inverse_frequencies(c)
        pool_shape = (num_slots, c.num_kv_heads, c.head_dim)
        # the paged KV pool: slot s of layer l holds the key/value of one token
        self.k_pool = [np.zeros(pool_shape, self.kv_cache_dtype) for _ in range(c.num_layers)]
        self.v_pool = [np.zeros(pool_shape, self.kv_cache_dtype) for _ in range(c.num_layers)]
        self._lora_cache = AdapterCache()

    @classmethod
    def over(
        cls,
        config: ModelConfig,
        layers: list[_Layer],
        *,
        head: np.ndarray,
        embed: np.ndarray | None,
        final_norm: np.ndarray,
        k_pool: list[np.ndarray],
        v_pool: list[np.ndarray],
    ) -> NumpyRunner:
        """A runner over arrays already laid out as this class keeps them (float32 and
        C-contiguous; ``head`` ``[hidden, vocab]``, ``embed`` None when tied; pools in any
        KV dtype), used in place with no copy: how the torch runner computes its float32
        forward on the CPU, over numpy views of its own tensors. Attention: the kernel."""
        runner = cls.__new__(cls)
        runner.attention = "kernel"
        runner.config = config
        runner.num_slots = int(k_pool[0].shape[0])
        runner.kv_cache_dtype = k_pool[0].dtype
        runner.head, runner.embed, runner.final_norm = head, embed, final_norm
        runner.layers = layers
        runner.inv_freq = inverse_frequencies(config)
        runner.k_pool, runner.v_pool = k_pool, v_pool
        runner._lora_cache = AdapterCache()
        return runner

    @staticmethod
    def _layer(weights: Weights, index: int) -> _Layer:
        p = layer_prefix(index)
        attn, mlp = p + "self_attn.", p + "mlp."

        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[name].T, dtype=np.float32)

        def norm(name: str) -> np.ndarray:  # float32 and contiguous, as the core's RMSNorm reads it
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        return _Layer(
            input_norm=norm(p + "input_layernorm.weight"),
            qkv=np.concatenate([t(attn + f"{x}_proj.weight") for x in "qkv"], axis=1),
            qkv_bias=_concat_bias(weights, [attn + f"{x}_proj.bias" for x in "qkv"]),
            q_norm=norm(attn + "q_norm.weight") if attn + "q_norm.weight" in weights else None,
            k_norm=norm(attn + "k_norm.weight") if attn + "k_norm.weight" in weights else None,
            o=t(attn + "o_proj.weight"),
            o_bias=weights.get(attn + "o_proj.bias"),
            post_norm=norm(p + "post_attention_layernorm.weight"),
            gate_up=np.concatenate([t(mlp + "gate_proj.weight"), t(mlp + "up_proj.weight")], axis=1),
            gate_up_bias=_concat_bias(weights, [mlp + "gate_proj.bias", mlp + "up_proj.bias"]),
            down=t(mlp + "down_proj.weight"),
            down_bias=weights.get(mlp + "down_proj.bias"),
        )

    def forward(self, batch: Batch, *, all_logits: bool = False) -> np.ndarray:
        self._check(batch)
        return self.logits(batch, all_logits=all_logits)

    def logits(self, batch: Batch, *, all_logits: bool = False) -> np.ndarray:
        """``forward`` for a batch already checked against this runner (``_check``)."""
        c = self.config
        cos, sin = rotation(self.inv_freq, batch.positions, attention_factor(c))
        plan = _AttentionPlan.of(batch, c.sliding_window) if self.attention == "reference" else None
        x = self.head[:, batch.input_ids].T.copy() if self.embed is None else self.embed[batch.input_ids]
        adapters = StepAdapters.of(batch, self._lora_cache)
        for i, (layer, k_pool, v_pool) in enumerate(zip(self.layers, self.k_pool, self.v_pool, strict=True)):
            h = _rms_norm(x, layer.input_norm, c.rms_norm_eps)
            x = x + self._attention(layer, h, batch, plan, cos, sin, k_pool, v_pool, (i, adapters))
            x = x + self._mlp(layer, _rms_norm(x, layer.post_norm, c.rms_norm_eps), (i, adapters))
        if not all_logits:
            x = x[batch.logit_rows]  # each request's last new token (and its drafts' rows)
        return _rms_norm(x, self.final_norm, c.rms_norm_eps) @ self.head

    def _check(self, batch: Batch) -> None:
        if batch.num_tokens and int(batch.input_ids.max()) >= self.config.vocab_size:
            raise InvalidInputError(f"ForwardBatch.input_ids holds an id >= vocab size {self.config.vocab_size}")
        if batch.kv_slots.size and int(batch.kv_slots.max()) >= self.num_slots:
            raise InvalidInputError(f"ForwardBatch.kv_slots holds a slot >= num_slots {self.num_slots}")

    def _attention(
        self,
        layer: _Layer,
        h: np.ndarray,
        batch: Batch,
        plan: _AttentionPlan | None,
        cos: np.ndarray,
        sin: np.ndarray,
        k_pool: np.ndarray,
        v_pool: np.ndarray,
        lora: tuple[int, StepAdapters | None] = (0, None),
    ) -> np.ndarray:
        c = self.config
        num_new = h.shape[0]
        qkv = h @ layer.qkv
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        index, adapters = lora
        if adapters is not None:
            adapters.add(index, "q_proj", h, qkv[:, :q_width])
            adapters.add(index, "k_proj", h, qkv[:, q_width : q_width + kv_width])
            adapters.add(index, "v_proj", h, qkv[:, q_width + kv_width :])
        q = qkv[:, :q_width].reshape(num_new, c.num_heads, c.head_dim)
        k = qkv[:, q_width : q_width + kv_width].reshape(num_new, c.num_kv_heads, c.head_dim)
        v = qkv[:, q_width + kv_width :].reshape(num_new, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = _rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = _rms_norm(k, layer.k_norm, c.rms_norm_eps)
        q = apply_rotation(q, cos, sin)
        k = apply_rotation(k, cos, sin)
        if plan is None:
            out = self._attend_kernel(q, k, v, batch, k_pool, v_pool)
        else:
            out = self._attend_reference(q, k, v, batch, plan, k_pool, v_pool)
        o = out @ layer.o
        if layer.o_bias is not None:
            o += layer.o_bias
        if adapters is not None:
            adapters.add(index, "o_proj", out, o)
        return o

    def _attend_kernel(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, batch: Batch, k_pool: np.ndarray, v_pool: np.ndarray
    ) -> np.ndarray:
        """The core's kernel: writes the new keys and values into the pool, then attends
        over the pool in place. Returns ``[T, heads * d]``."""
        c = self.config
        _core.write_kv(k_pool, v_pool, batch.out_slots, np.ascontiguousarray(k), np.ascontiguousarray(v))
        out = np.empty((q.shape[0], c.num_heads, c.head_dim), np.float32)
        _core.paged_attention(
            np.ascontiguousarray(q),
            k_pool,
            v_pool,
            batch.positions,
            batch.qo_offsets,
            batch.kv_slots,
            batch.kv_offsets,
            out,
            scale=c.head_dim**-0.5,
            sliding_window=c.sliding_window,
        )
        return out.reshape(q.shape[0], c.num_heads * c.head_dim)

    def _attend_reference(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        batch: Batch,
        plan: _AttentionPlan,
        k_pool: np.ndarray,
        v_pool: np.ndarray,
    ) -> np.ndarray:
        """The pure-numpy path: gathers each request's keys and values out of the pool
        (decodes padded to the longest) and multiplies. Returns ``[T, heads * d]``."""
        c = self.config
        k_pool[batch.out_slots] = k
        v_pool[batch.out_slots] = v

        out = np.empty((q.shape[0], c.num_heads * c.head_dim), np.float32)
        q *= np.float32(c.head_dim**-0.5)
        if plan.decode_rows.size:
            rows = plan.decode_rows
            out[rows] = self._attend_decodes(
                q[rows], _gather(k_pool, plan.decode_slots), _gather(v_pool, plan.decode_slots), plan.decode_hidden
            )
        for q0, q1, slots in plan.chunks:
            out[q0:q1] = self._attend(q[q0:q1], _gather(k_pool, slots), _gather(v_pool, slots))
        return out

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """One request: ``q [n, heads, d]`` (pre-scaled) over ``k, v [m, kv_heads, d]``,
        whose last n entries are the queries' own tokens. Returns ``[n, heads * d]``."""
        c = self.config
        n, m = q.shape[0], k.shape[0]
        # query head h reads kv head h // group: group the query heads under their kv head
        qg = q.reshape(n, c.num_kv_heads, c.num_queries_per_kv, c.head_dim).transpose(1, 2, 0, 3)  # [kvh, g, n, d]
        keys = k.transpose(1, 2, 0)[:, None]  # [kvh, 1, d, m]
        values = v.transpose(1, 0, 2)[:, None]  # [kvh, 1, m, d]
        out = np.empty((c.num_kv_heads, c.num_queries_per_kv, n, c.head_dim), np.float32)
        kv_index = np.arange(m)[None, :]
        # queries in blocks, so a long prompt's scores never take more than a block's rows
        for start in range(0, n, _QUERY_BLOCK):
            end = min(start + _QUERY_BLOCK, n)
            scores = qg[:, :, start:end] @ keys  # [kvh, g, block, m]
            # query i sits at kv index m - n + i and sees kv indices up to it (and, with a
            # sliding window, only the last `window` of them)
            query_index = np.arange(m - n + start, m - n + end)[:, None]
            hidden = kv_index > query_index
            if c.sliding_window is not None:
                hidden |= kv_index <= query_index - c.sliding_window
            if hidden.any():
                scores = np.where(hidden, np.float32(-np.inf), scores)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, :, start:end] = probs @ values
        return out.transpose(2, 0, 1, 3).reshape(n, c.num_heads * c.head_dim)

    def _attend_decodes(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """Many requests with one new token each, at once: ``q [S, heads, d]`` (pre-scaled)
        over their padded slots' ``k, v [S, L, kv_heads, d]``; ``hidden [S, L]`` marks the
        padding (and what a sliding window excludes). Returns ``[S, heads * d]``."""
        c = self.config
        count = q.shape[0]
        qg = q.reshape(count, c.num_kv_heads, c.num_queries_per_kv, c.head_dim)  # [S, kvh, g, d]
        scores = qg @ k.transpose(0, 2, 3, 1)  # [S, kvh, g, L]
        scores = np.where(hidden[:, None, None, :], np.float32(-np.inf), scores)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = probs @ v.transpose(0, 2, 1, 3)  # [S, kvh, g, d]
        return out.reshape(count, c.num_heads * c.head_dim)

    def _mlp(self, layer: _Layer, h: np.ndarray, lora: tuple[int, StepAdapters | None] = (0, None)) -> np.ndarray:
        gate_up = h @ layer.gate_up
        if layer.gate_up_bias is not None:
            gate_up += layer.gate_up_bias
        width = self.config.intermediate_size
        index, adapters = lora
        if adapters is not None:
            adapters.add(index, "gate_proj", h, gate_up[:, :width])
            adapters.add(index, "up_proj", h, gate_up[:, width:])
        act = _silu(gate_up[:, :width]) * gate_up[:, width:]
        down = act @ layer.down
        if layer.down_bias is not None:
            down += layer.down_bias
        if adapters is not None:
            adapters.add(index, "down_proj", act, down)
        return down
