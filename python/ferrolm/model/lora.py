"""LoRA adapters on the Python runners (numpy, torch): a step's token rows grouped by
adapter, and each group's low-rank update added to a projection's output, as the quant
runner does in the Rust core (``ferrolm_core::lora``).

An adapter's matrices come from the core (``_core.LoraAdapter.matrices``: read, checked
and scaled once, when the adapter was loaded); a runner keeps them converted to its own
arrays for the adapters of recent steps (``AdapterCache``), so a step converts nothing
once its adapters have run before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm.model.config import ModelConfig

# adapters whose converted matrices a runner keeps (ids are never reused: a stale entry
# is only memory, never wrong weights)
CACHED_ADAPTERS = 16


def registry_for(config: ModelConfig, max_resident: int) -> _core.LoraRegistry:
    """A registry of adapters for a model of ``config``, keeping ``max_resident`` in memory."""
    return _core.LoraRegistry(
        num_layers=config.num_layers,
        hidden=config.hidden_size,
        q_dim=config.num_heads * config.head_dim,
        kv_dim=config.num_kv_heads * config.head_dim,
        intermediate=config.intermediate_size,
        max_resident=max_resident,
    )


def parse_lora_module(spec: str) -> tuple[str, str]:
    """``name=path`` (vLLM's and SGLang's ``--lora-modules`` form), or the JSON object
    ``{"name": ..., "path": ...}`` vLLM also takes; ``(name, path)``."""
    import json

    from ferrolm.errors import InvalidInputError

    if spec.lstrip().startswith("{"):
        try:
            obj = json.loads(spec)
            return str(obj["name"]), str(obj["path"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidInputError(
                f'lora_modules: {spec!r} is not {{"name": ..., "path": ...}} ({e})', "lora_modules"
            ) from None
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise InvalidInputError(f"lora_modules: {spec!r} is not name=path", "lora_modules")
    return name, path


class AdapterCache:
    """Adapters' matrices as ``(a.T [in, rank], b_t [rank, out])`` in a runner's array
    type (``convert`` takes a float32 numpy array), for the ``CACHED_ADAPTERS`` used last."""

    def __init__(self, convert: Callable[[np.ndarray], Any] = np.ascontiguousarray) -> None:
        self._convert = convert
        self._adapters: OrderedDict[int, dict[tuple[int, str], Any]] = OrderedDict()

    def matrices(self, adapter: _core.LoraAdapter, layer: int, target: str) -> tuple[Any, Any] | None:
        per_adapter = self._adapters.get(adapter.id)
        if per_adapter is None:
            per_adapter = self._adapters[adapter.id] = {}
            while len(self._adapters) > CACHED_ADAPTERS:
                self._adapters.popitem(last=False)
        else:
            self._adapters.move_to_end(adapter.id)
        key = (layer, target)
        if key not in per_adapter:
            pair = adapter.matrices(layer, target)
            per_adapter[key] = None if pair is None else (self._convert(pair[0].T), self._convert(pair[1]))
        return per_adapter[key]


class StepAdapters:
    """One step's token rows by adapter, and the updates they add."""

    def __init__(self, groups: list[tuple[Any, _core.LoraAdapter]], cache: AdapterCache) -> None:
        self.groups = groups
        self.cache = cache

    @classmethod
    def of(
        cls, batch: Any, cache: AdapterCache, index: Callable[[np.ndarray], Any] = lambda rows: rows
    ) -> StepAdapters | None:
        """The adapters of ``batch`` (its ``loras``: a ``_core.StepLoras``, or None when no
        request has one); ``index`` turns a row array into the runner's index type."""
        loras = getattr(batch, "loras", None)
        if loras is None:
            return None
        qo = batch.qo_offsets
        rows: dict[int, list[np.ndarray]] = {}
        adapters: dict[int, _core.LoraAdapter] = {}
        for b, adapter in enumerate(loras.adapters()):
            if adapter is not None:
                rows.setdefault(adapter.id, []).append(np.arange(qo[b], qo[b + 1]))
                adapters[adapter.id] = adapter
        if not rows:
            return None
        return cls([(index(np.concatenate(r)), adapters[i]) for i, r in rows.items()], cache)

    def add(self, layer: int, target: str, x: Any, out: Any) -> None:
        """``out[rows] += x[rows] @ a.T @ b_t`` for each group whose adapter adapts
        ``target`` of ``layer`` (``out`` may be a column slice of a wider output)."""
        for rows, adapter in self.groups:
            pair = self.cache.matrices(adapter, layer, target)
            if pair is not None:
                a_t, b_t = pair
                out[rows] += (x[rows] @ a_t) @ b_t
