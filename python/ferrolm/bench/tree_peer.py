"""SGLang's Rust tree core as a peer in ``ferrolm bench tree``.

SGLang's wheel bundles its radix tree as a compiled extension,
``sglang/srt/mem_cache/rust_tree_core/mem_cache*.so`` (a PyO3 module linked against
libtorch). It is loaded here from its file, with torch imported first as SGLang does, and
without importing the rest of SGLang (whose cache framework pulls in its whole
dependency set). Install it for the bench with ``make tree-peer``
(``pip install --no-deps sglang==0.5.23`` plus torch).

The peer is driven the way SGLang's ``UnifiedRadixCache`` drives it through its adapter:
a ``MatchParamsBinding`` around the key's ``array('q')`` token ids (what SGLang's
``RadixKey`` holds), the resumable insert (``begin_insert``, ``resume_insert`` while a
step has no result, ``end_insert``) with the KV indices as an int64 tensor, lock receipts
from ``inc_lock_ref`` handed back to ``dec_lock_ref``, and the step-wise device eviction
walk. The argument objects SGLang's scheduler already holds (the key array, the value
tensor) are made outside the timed calls, as ferrolm's are. The Python between the
scheduler and the binding in SGLang (its adapter's result dataclasses, the cache's
action handling) is left out: the peer's figures are a lower bound of what SGLang's
scheduler pays.

A match here returns the match length and the node, as SGLang's does; SGLang gathers a
request's KV indices later with ``collect_full_device_indices`` (timed on its own,
``kv_indices_ns``), where ferrolm's match returns them in the same call.
"""

from __future__ import annotations

import importlib.util
import time
from array import array
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

PEER = "sglang"
PEER_VERSION = "0.5.23"
EXTENSION = "sglang.srt.mem_cache.rust_tree_core.mem_cache"
INSTALL_HINT = "make tree-peer (pip install --no-deps sglang==0.5.23, and torch)"
FULL = 0  # sglang.srt.mem_cache.unified_cache.component_type.ComponentType.FULL
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


def extension_path() -> Path | None:
    """The tree extension's file in the installed ``sglang`` package, found without
    importing the package."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "srt" / "mem_cache" / "rust_tree_core"
    found = sorted(folder.glob("mem_cache.*.so"))
    return found[0] if found else None


def load() -> tuple[ModuleType | None, str]:
    """SGLang's tree extension and its version, or None and why it is not available."""
    path = extension_path()
    if path is None:
        return None, f"sglang is not installed ({INSTALL_HINT})"
    try:
        # the extension links libtorch: importing torch first makes its libraries resident
        import torch  # noqa: F401
    except ImportError:
        return None, f"sglang's tree extension needs torch, which is not installed ({INSTALL_HINT})"
    try:
        spec = importlib.util.spec_from_file_location(EXTENSION, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as e:
        return None, f"sglang's tree extension at {path.name} does not load: {e}"
    version = "unknown"
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("sglang")
    except Exception:  # a copy without metadata: the extension still runs
        pass
    return module, version


class PeerMatch:
    """A match from the peer: its length and node; the KV indices on request."""

    __slots__ = ("length", "node", "_tree")

    def __init__(self, length: int, node: int, tree: SGLangTree) -> None:
        self.length = length
        self.node = node
        self._tree = tree

    @property
    def kv_slots(self) -> np.ndarray:
        return self._tree.kv_indices(self.node, self.length)


class SGLangTree:
    """SGLang's ``RustUnifiedTreeCoreBinding`` (the FULL component only, on the CPU)
    behind the calls ``ferrolm bench tree`` makes of a tree."""

    def __init__(self, module: ModuleType, page_size: int = 1, eviction_policy: str = "lru") -> None:
        import torch

        if eviction_policy not in POLICIES:
            raise ValueError(f"sglang has no eviction policy {eviction_policy!r}")
        self._torch = torch
        self._m = module
        init = module.TreeCoreInitParamsBinding(eviction_policy=eviction_policy, page_size=page_size, device="cpu")
        self._core = module.RustUnifiedTreeCoreBinding(init, [FULL])
        self._root = self._core.root_node_handle()
        self._receipts: dict[int, list[Any]] = {}
        self.kv_indices_ns: list[int] = []

    # the arguments SGLang's scheduler holds before it calls the tree
    @staticmethod
    def key_of(tokens: np.ndarray) -> array:
        return array("q", tokens.astype(np.int64).tobytes())

    def value_of(self, slots: np.ndarray, matched: int) -> tuple[Any, int]:
        """The insert's value tensor, and how much of it the request's match took from
        the tree (SGLang's ``prev_prefix_len``: those slots are the tree's own)."""
        return self._torch.from_numpy(np.asarray(slots, dtype=np.int64)), matched

    def match_prefix(self, key: array) -> PeerMatch:
        r = self._core.match_prefix(self._m.MatchParamsBinding(key=key))
        return PeerMatch(r.device_prefix_len, r.last_device_node_id, self)

    def kv_indices(self, node: int, length: int) -> np.ndarray:
        t0 = time.perf_counter_ns()
        indices = self._core.collect_full_device_indices(node, self._root)
        self.kv_indices_ns.append(time.perf_counter_ns() - t0)
        return indices[:length].numpy().astype(np.int32)

    def insert(self, key: array, value: tuple[Any, int]) -> int:
        core = self._core
        tensor, matched = value
        step = core.begin_insert(self._m.InsertParamsBinding(key=key, value=tensor, prev_prefix_len=matched))
        try:
            while step.result is None:
                step = core.resume_insert()
        finally:
            core.end_insert()
        # the step's free_device_kv actions name the duplicates past prev_prefix_len
        # that the tree already held: the bench frees those itself from this length
        return int(step.result.prefix_len)

    def lock(self, node: int) -> None:
        self._receipts.setdefault(node, []).append(self._core.inc_lock_ref(node))

    def unlock(self, node: int) -> None:
        r = self._receipts[node].pop()
        params = self._m.DecLockRefParamsBinding(
            node_id=node,
            skipped_lock_components=list(r.skipped_lock_components),
            component_lock_uuids=dict(r.component_lock_uuids),
        )
        self._core.dec_lock_ref(node, params, False)

    def evict(self, num_tokens: int) -> np.ndarray:
        core = self._core
        frees: list[Any] = []
        tracker = {FULL: 0}
        core.evict_device_start(FULL, num_tokens)
        try:
            while True:
                # as UnifiedRadixCache._evict_components: the walk ends itself once
                # the running tracker reaches the request
                step = core.evict_device_next_node(FULL, tracker)
                self._take(step, frees, tracker)
                if step.node_id is None:
                    if not step.made_progress:
                        break
                    continue
                self._take(core.evict_device_leaf(step.node_id), frees, tracker)
        finally:
            core.evict_device_end(FULL)
        if not frees:
            return np.empty(0, dtype=np.int32)
        return self._torch.cat(frees).numpy().astype(np.int32)

    @staticmethod
    def _take(step: Any, frees: list[Any], tracker: dict[int, int]) -> None:
        frees.extend(step.new_device_frees.get(FULL, ()))
        for component, n in step.tracker.items():
            tracker[component] = tracker.get(component, 0) + n

    def total_size(self) -> int:
        return int(self._core.total_size()[0])

    def check_invariants(self) -> None:
        pass  # the bench's KV conservation check covers the peer

    def num_nodes(self) -> int | None:
        return None

    def memory_bytes(self) -> int | None:
        return None
