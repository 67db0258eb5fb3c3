"""ferrolm's Rust core (``crates/ferrolm-py`` over ``crates/ferrolm-core``).

Every method releases the GIL while it works on core data. Errors are the classes of
``ferrolm.errors``. If the core ever panics, the object it happened in raises
``CorePanicError`` from then on: state left half-changed is never reused.

Integer sequences (``tokens``, ``kv_slots``) may be numpy arrays (``int32``/``uint32`` are
read in place when contiguous; other integer dtypes are converted once) or sequences of
ints. Anything else, a value out of range, or an array that is not 1-D raises
``InvalidInputError`` naming the argument.
"""

from typing import Iterator, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

__all__ = ["__version__", "RadixTree", "MatchResult"]
__version__: str

@final
class MatchResult:
    """What ``RadixTree.match_prefix`` found. Unpacks as ``length, kv_slots, node``."""

    @property
    def length(self) -> int:
        """Cached tokens at the start of the query, a whole number of pages."""
    @property
    def kv_slots(self) -> npt.NDArray[np.int32]:
        """The KV slot of each of those tokens."""
    @property
    def node(self) -> int:
        """Handle of the node where the match ends (``RadixTree.root_node`` when nothing
        matched). Lock it to keep the prefix cached while a request uses it."""
    def __iter__(self) -> Iterator[object]: ...

@disjoint_base
class RadixTree:
    """Radix prefix cache: token sequences whose KV is cached, with the KV slot of every
    token, found by longest-prefix match.

    Matching and inserting work on whole pages of ``page_size`` tokens. A ``namespace``
    (a LoRA id, a ``cache_salt``) keeps sequences apart: different namespaces never share
    a prefix; ``None`` is the default namespace.

    Node handles are plain ints that are never recycled: once a node is evicted (or the
    tree reset) every call with its handle raises ``StaleHandleError``.
    """

    def __new__(
        cls,
        page_size: int = 1,
        eviction_policy: str = "lru",
        enable_kv_events: bool = False,
        kv_event_block_size: int | None = None,
    ) -> Self:
        """``eviction_policy`` is one of ``lru``, ``lfu``, ``fifo``, ``mru``, ``filo``,
        ``priority``. With ``enable_kv_events`` inserts and evictions queue events for
        ``take_raw_events``, over blocks of ``kv_event_block_size`` tokens (default: one
        page).

        Raises ``InvalidInputError`` for a page size or block size outside 1..=2**20 or
        an unknown policy (the message lists the known ones)."""
    def match_prefix(self, tokens: object, namespace: str | None = None) -> MatchResult:
        """The longest cached prefix of ``tokens`` in ``namespace``.

        Mutates: the matched nodes' use statistics (last access, hit count), and splits
        the last matched node when the match ends inside it, so that the returned node
        covers exactly the matched prefix. Sizes do not change.

        Raises ``InvalidInputError`` for bad ``tokens``."""
    def insert(
        self,
        tokens: object,
        kv_slots: object,
        namespace: str | None = None,
        priority: int = 0,
    ) -> int:
        """Caches ``tokens`` (truncated to whole pages) with the KV slot of each token.

        Returns how many leading tokens were already cached. The tree keeps its own slots
        for those: the caller frees its copies among ``kv_slots[:returned]`` that it did
        not get from ``match_prefix``, and the slots past the last whole page.

        Mutates: adds a leaf for the uncached rest (splitting a node where the sequence
        diverges inside it), marks the walked nodes used and raises their priority to at
        least ``priority``; queues a ``stored`` event when events are on.

        Raises ``InvalidInputError``, changing nothing, when the lengths differ, a token
        is outside 0..=2**32-1 or a slot outside 0..=2**31-1."""
    def lock(self, node: int) -> int:
        """Protects the path from ``node`` to the root from eviction. Locks nest. Locking
        the root does nothing. Returns how many tokens became protected.

        Raises ``StaleHandleError`` if the node is gone."""
    def unlock(self, node: int) -> int:
        """Gives back one ``lock`` taken on this same node. Returns how many tokens became
        evictable again.

        Raises ``StaleHandleError`` if the node is gone, ``NotLockedError`` (changing
        nothing) if the node holds no lock taken on it."""
    def evict(self, num_tokens: int) -> npt.NDArray[np.int32]:
        """Frees unlocked leaves in policy order, and parents that become unlocked leaves,
        until at least ``num_tokens`` tokens are freed or nothing evictable is left.
        Returns the freed KV slots (whole nodes go, so possibly more than asked); they are
        the caller's again. Queues a ``removed`` event when events are on.

        Raises ``InvalidInputError`` for a negative count."""
    def reset(self) -> None:
        """Drops everything cached; every handle but the root's goes stale. Queues a
        ``cleared`` event when events are on. The caller owns all slots again."""
    def evictable_size(self) -> int:
        """Cached tokens on no locked path: what ``evict`` can free."""
    def protected_size(self) -> int:
        """Cached tokens on a locked path."""
    def total_size(self) -> int:
        """All cached tokens (``evictable_size() + protected_size()``)."""
    def num_nodes(self) -> int:
        """Nodes, roots excluded."""
    def memory_bytes(self) -> int:
        """Bytes the tree holds (nodes, token and slot arrays, indexes), by capacity."""
    def all_kv_slots(self) -> npt.NDArray[np.int32]:
        """Every KV slot the tree holds, in no particular order (integrity checks)."""
    def check_invariants(self) -> None:
        """Checks the tree's structure and accounting: O(cached tokens).

        Raises ``InvariantViolation`` naming the first problem found."""
    def take_raw_events(self) -> list[tuple[object, ...]]:
        """Queued KV events, oldest first, as tuples, and clears the queue:
        ``("stored", block_hashes, parent_block_hash, token_ids, block_size, namespace)``,
        ``("removed", block_hashes)``, ``("cleared",)``. ``ferrolm.RadixCache`` objects
        offer ``take_events()``, which returns ``ferrolm.kv_events`` objects."""
    @property
    def page_size(self) -> int: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def kv_events_enabled(self) -> bool: ...
    @property
    def kv_event_block_size(self) -> int: ...
    @property
    def root_node(self) -> int:
        """The root's handle: what ``match_prefix`` returns when nothing matched."""
    def _inject_panic(self) -> None:
        """Test hook: panics inside the core. Raises ``CorePanicError``, after which this
        object refuses every call."""
