"""``RadixCache``: the radix prefix cache, from the Rust core or its Python twin.

``FERROLM_TREE_BACKEND=rust|python`` picks the backend (default ``rust``); ``backend=``
overrides it per call. Both have the interface documented in ``ferrolm/_core.pyi``, plus
``take_events()``.
"""

from __future__ import annotations

import os
from typing import Any, Union

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.kv_events import KvEvent, event_from_raw
from ferrolm.radix_py import PyRadixCache

BACKENDS = ("rust", "python")


class RustRadixCache(_core.RadixTree):
    """The Rust tree, with events as ``ferrolm.kv_events`` objects."""

    def take_events(self) -> list[KvEvent]:
        return [event_from_raw(raw) for raw in self.take_raw_events()]


AnyRadixCache = Union[RustRadixCache, PyRadixCache]


def RadixCache(
    page_size: int = 1,
    eviction_policy: str = "lru",
    enable_kv_events: bool = False,
    kv_event_block_size: int | None = None,
    *,
    backend: str | None = None,
    **policy_options: Any,
) -> AnyRadixCache:
    """A radix prefix cache from the chosen backend (see the module doc).
    ``policy_options``: ``slru_protected_share``, ``ttl_seconds``, ``clock`` (see
    ``ferrolm._core.RadixTree``)."""
    name = backend or os.environ.get("FERROLM_TREE_BACKEND") or "rust"
    if name not in BACKENDS:
        raise InvalidInputError(
            f"tree backend {name!r} is unknown; expected one of {', '.join(BACKENDS)} "
            "(FERROLM_TREE_BACKEND or backend=)"
        )
    cls = RustRadixCache if name == "rust" else PyRadixCache
    return cls(page_size, eviction_policy, enable_kv_events, kv_event_block_size, **policy_options)
