"""The radix tree's pure-Python twin: the readable reference for the Rust tree, the
fallback (``FERROLM_TREE_BACKEND=python``), and the baseline its benchmark measures.

It has the Rust tree's interface and follows the same bookkeeping to the letter, so the
two give identical results operation by operation (``tests/test_radix_parity.py``):

- a logical clock advances once per ``match_prefix`` and once per ``insert``;
- every node walked by ``match_prefix`` gets ``last_access = clock`` and ``hits += 1``;
  every node walked by ``insert`` gets ``last_access = clock`` and
  ``priority = max(priority, inserted priority)``;
- a split makes the upper part a new node that inherits the statistics of the node it was
  cut from, but takes the next sequence number; a leaf made by insert takes the next one;
- eviction takes unlocked leaves in order of the policy's key, whose last part is the
  sequence number, so ties never depend on memory layout;
- ``slru``: a node walked by ``match_prefix`` whose hits reach 2 enters the protected
  segment; at the end of every ``match_prefix``, while the protected segment holds more
  than ``slru_protected_share`` of the cached tokens, its node with the smallest
  ``(last_access, seq)`` goes back to the probationary segment with ``last_access = clock``;
- ``tlru``: ``match_prefix``, ``insert`` and ``evict`` read the clock once each; a node
  walked or made gets ``deadline = now + ttl``, where an insert raises the ttl of the nodes
  it walks to its own; ``evict`` takes the leaves with ``deadline <= now`` first, smallest
  ``(deadline, seq)`` first, then the others by LRU.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ferrolm._ids import I32_MAX, as_count, as_handle, as_ids, as_int_in_range, as_namespace
from ferrolm.errors import InvalidInputError, InvariantViolation, NotLockedError, StaleHandleError
from ferrolm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, chain_hashes, namespace_seed

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
ROOT_HANDLE = 0
# as the Rust tree's TreeConfig: Caffeine's 80% protected; prompt caches' five minutes
DEFAULT_SLRU_PROTECTED_SHARE = 0.8
DEFAULT_TTL_SECONDS = 300.0
MAX_SECONDS = 1e9
U64_MAX = 2**64 - 1  # the Rust tree's deadlines saturate there


def _number(obj: Any) -> bool:
    return isinstance(obj, (int, float)) and not isinstance(obj, bool)


def as_ttl_ns(obj: Any, what: str) -> int:
    """Seconds (> 0, at most 1e9) as whole nanoseconds, truncated as the binding does."""
    if not _number(obj):
        raise InvalidInputError(f"{what} must be a number of seconds, got {type(obj).__name__}", what)
    v = float(obj)
    if not (v > 0.0 and v <= MAX_SECONDS):
        raise InvalidInputError(f"{what} must be > 0 and at most {MAX_SECONDS:e}, got {v}", what)
    ns = int(v * 1e9)
    if ns == 0:
        raise InvalidInputError(f"{what} is under a nanosecond: {v}", what)
    return ns


def as_share(obj: Any, what: str) -> float:
    if not _number(obj):
        raise InvalidInputError(f"{what} must be a number between 0 and 1, got {type(obj).__name__}", what)
    v = float(obj)
    if not 0.0 <= v <= 1.0:
        raise InvalidInputError(f"{what} must be between 0 and 1, got {v}", what)
    return v


class MatchResult(NamedTuple):
    length: int
    kv_slots: np.ndarray
    node: int


class _Node:
    __slots__ = (
        "key", "value", "children", "parent", "start", "lock_ref", "own_locks", "handle",
        "last_access", "created", "hits", "priority", "seq", "block_hashes", "is_root",
        "hot", "ttl", "deadline",
    )  # fmt: skip

    def __init__(self, key: list[int], value: list[int], parent: _Node | None, start: int) -> None:
        self.key = key
        self.value = value
        # children by first page: the first token when pages are one token, else a tuple
        self.children: dict[object, _Node] = {}
        # a root is its own parent: walks up stop at is_root, and no node's parent is None
        self.parent: _Node = parent if parent is not None else self
        self.start = start
        self.lock_ref = 0
        self.own_locks = 0
        self.handle = ROOT_HANDLE
        self.last_access = 0
        self.created = 0
        self.hits = 0
        self.priority = 0
        self.seq = 0
        self.block_hashes: list[int] = []
        self.is_root = False
        self.hot = False  # slru: in the protected segment
        self.ttl = 0  # tlru: time-to-live and expiry, in ns of the tree's clock
        self.deadline = 0


class PyRadixCache:
    """Pure-Python radix prefix cache; see ``ferrolm._core.RadixTree`` for the contract."""

    def __init__(
        self,
        page_size: int = 1,
        eviction_policy: str = "lru",
        enable_kv_events: bool = False,
        kv_event_block_size: int | None = None,
        *,
        slru_protected_share: float | None = None,
        ttl_seconds: float | None = None,
        clock: Any = None,
    ) -> None:
        """``clock``: where ``tlru`` reads the time: a ``ferrolm._core.ManualClock`` (what
        tests pass, to drive both backends alike) or any callable giving nanoseconds;
        default ``time.monotonic_ns``."""
        page_size = as_int_in_range(page_size, "page_size", 1, 1 << 20)
        if not isinstance(eviction_policy, str):
            raise InvalidInputError(
                f"eviction_policy must be a str, got {type(eviction_policy).__name__}", "eviction_policy"
            )
        if eviction_policy not in POLICIES:
            raise InvalidInputError(
                f"eviction_policy: unknown eviction policy {eviction_policy!r}; expected one of {', '.join(POLICIES)}",
                "eviction_policy",
            )
        if kv_event_block_size is not None:
            kv_event_block_size = as_int_in_range(kv_event_block_size, "kv_event_block_size", 1, 1 << 20)
        share = DEFAULT_SLRU_PROTECTED_SHARE
        if slru_protected_share is not None:
            share = as_share(slru_protected_share, "slru_protected_share")
        ttl_ns = int(DEFAULT_TTL_SECONDS * 1e9) if ttl_seconds is None else as_ttl_ns(ttl_seconds, "ttl_seconds")
        time_ns = getattr(clock, "now_ns", clock)
        if clock is not None and not callable(time_ns):
            raise InvalidInputError(
                f"clock must be a ManualClock, a callable giving nanoseconds or None, got {type(clock).__name__}",
                "clock",
            )
        if kv_event_block_size is not None and kv_event_block_size % page_size:
            # see the Rust tree: a block must be whole pages, or two branches can share it
            raise InvalidInputError(
                f"kv_event_block_size ({kv_event_block_size}) must be a multiple of page_size ({page_size})"
            )
        self._page = page_size
        self._policy = eviction_policy
        self._events_on = bool(enable_kv_events)
        self._block = kv_event_block_size or page_size
        self._share = share
        self._ttl = ttl_ns
        self._time: Callable[[], int] = time_ns or time.monotonic_ns
        self._hot_tokens = 0
        self._root = self._new_root()
        self._ns_roots: dict[str, _Node] = {}
        self._nodes: dict[int, _Node] = {}  # live handle -> node
        self._next_handle = 1  # handles count up and are never reused
        self._clock = 0
        self._next_seq = 1
        self._evictable = 0
        self._protected = 0
        self._events: list[KvEvent] = []

    # ---- properties ----

    @property
    def page_size(self) -> int:
        return self._page

    @property
    def eviction_policy(self) -> str:
        return self._policy

    @property
    def slru_protected_share(self) -> float:
        return self._share

    @property
    def ttl_seconds(self) -> float:
        return self._ttl / 1e9

    @property
    def kv_events_enabled(self) -> bool:
        return self._events_on

    @property
    def kv_event_block_size(self) -> int:
        return self._block

    @property
    def root_node(self) -> int:
        return ROOT_HANDLE

    # ---- the API ----

    def match_prefix(self, tokens: object, namespace: str | None = None) -> MatchResult:
        tokens = as_ids(tokens, "tokens")
        as_namespace(namespace)
        self._clock += 1
        now = self._now()
        aligned = len(tokens) // self._page * self._page
        node = self._root if namespace is None else self._ns_roots.get(namespace)
        slots: list[int] = []
        pos = 0
        while node is not None and pos < aligned:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            common = self._common_pages(child.key, tokens, pos, aligned)
            self._touch(child)
            child.hits += 1
            if self._policy == "tlru":
                child.deadline = min(now + child.ttl, U64_MAX)
            elif self._policy == "slru" and not child.hot and child.hits >= 2:
                child.hot = True  # the second hit: promoted
                self._hot_tokens += len(child.key)
            if common < len(child.key):
                child = self._split(child, common)
                slots.extend(child.value)
                node, pos = child, pos + common
                break
            slots.extend(child.value)
            node, pos = child, pos + common
        if self._policy == "slru":
            self._demote_overflow()
        handle = node.handle if pos > 0 and node is not None else ROOT_HANDLE
        return MatchResult(pos, np.array(slots, dtype=np.int32), handle)

    def insert(
        self,
        tokens: object,
        kv_slots: object,
        namespace: str | None = None,
        priority: int = 0,
        *,
        ttl_seconds: float | None = None,
    ) -> int:
        tokens = as_ids(tokens, "tokens")
        kv_slots = as_ids(kv_slots, "kv_slots", I32_MAX)
        as_namespace(namespace)
        priority = as_int_in_range(priority, "priority", -(2**63), 2**63 - 1)
        ttl = self._ttl if ttl_seconds is None else as_ttl_ns(ttl_seconds, "ttl_seconds")
        if ttl_seconds is not None and self._policy != "tlru":
            raise InvalidInputError(
                f"ttl: only the tlru eviction policy gives nodes a time-to-live (this tree's is {self._policy})"
            )
        if len(tokens) != len(kv_slots):
            raise InvalidInputError(
                f"kv_slots has {len(kv_slots)} entries but tokens has {len(tokens)}; they must be the same length"
            )
        self._clock += 1
        now = self._now()
        aligned = len(tokens) // self._page * self._page
        if aligned == 0:
            return 0
        node = self._root_or_create(namespace)
        parent_block: int | None = None
        pos = 0
        while pos < aligned:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                leaf = self._add_leaf(node, tokens, kv_slots, pos, aligned, priority, parent_block, namespace)
                leaf.ttl, leaf.deadline = ttl, min(now + ttl, U64_MAX)
                return pos
            common = self._common_pages(child.key, tokens, pos, aligned)
            self._touch(child)
            child.priority = max(child.priority, priority)
            if self._policy == "tlru":
                child.ttl = max(child.ttl, ttl)
                child.deadline = min(now + child.ttl, U64_MAX)
            if common < len(child.key):
                child = self._split(child, common)
            if child.block_hashes:
                parent_block = child.block_hashes[-1]
            node, pos = child, pos + common
        return aligned

    def lock(self, node: object) -> int:
        n = self._resolve(node)
        if n.is_root:
            return 0
        n.own_locks += 1
        moved = 0
        while not n.is_root:
            if n.lock_ref == 0:
                moved += len(n.key)
            n.lock_ref += 1
            n = n.parent
        self._evictable -= moved
        self._protected += moved
        return moved

    def unlock(self, node: object) -> int:
        handle = node
        n = self._resolve(node)
        if n.is_root:
            return 0
        if n.own_locks == 0:
            raise NotLockedError(
                f"unlock of node {handle:#x}, which holds no lock of its own "
                "(more unlocks than locks, or a handle other than the one locked)"
            )
        n.own_locks -= 1
        moved = 0
        while not n.is_root:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                moved += len(n.key)
            n = n.parent
        self._protected -= moved
        self._evictable += moved
        return moved

    def evict(self, num_tokens: object) -> np.ndarray:
        want = as_count(num_tokens, "num_tokens")
        now = self._now()
        # like SGLang's tree: gather the evictable leaves, then pop them in policy order
        heap = [(self._evict_key(n, now), n.seq, n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed: list[int] = []
        removed: list[int] = []
        while len(freed) < want and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[self._first_page(leaf.key)]
            del self._nodes[leaf.handle]
            self._evictable -= len(leaf.key)
            if leaf.hot:
                self._hot_tokens -= len(leaf.key)
            freed.extend(leaf.value)
            removed.extend(leaf.block_hashes)
            if not parent.children:
                if not parent.is_root and parent.lock_ref == 0:
                    heapq.heappush(heap, (self._evict_key(parent, now), parent.seq, parent))
                elif parent.is_root and parent is not self._root:
                    self._drop_namespace_root(parent)
        if removed:
            self._events.append(BlockRemoved(tuple(removed)))
        return np.array(freed, dtype=np.int32)

    def reset(self) -> None:
        self._root.children = {}
        self._ns_roots = {}
        self._nodes = {}
        self._evictable = 0
        self._protected = 0
        self._hot_tokens = 0
        if self._events_on:
            self._events.append(AllBlocksCleared())

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def num_nodes(self) -> int:
        return len(self._nodes)

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def all_kv_slots(self) -> np.ndarray:
        slots = [s for n in self._nodes.values() for s in n.value]
        return np.array(slots, dtype=np.int32)

    def memory_bytes(self) -> int:
        """Deep size of the nodes and their lists and dicts (an estimate: shared ints are
        counted once per reference)."""
        total = sys.getsizeof(self._nodes)
        for n in self._nodes.values():
            total += sys.getsizeof(n) + sys.getsizeof(n.children) + sys.getsizeof(n.block_hashes)
            total += sys.getsizeof(n.key) + sys.getsizeof(n.value)
            total += sum(sys.getsizeof(t) for t in n.key) + sum(sys.getsizeof(s) for s in n.value)
        return total

    def check_invariants(self) -> None:
        problem = self._find_violation()
        if problem:
            raise InvariantViolation(problem)

    # ---- helpers ----

    def _new_root(self) -> _Node:
        root = _Node([], [], None, 0)
        root.is_root = True
        return root

    def _root_or_create(self, namespace: str | None) -> _Node:
        if namespace is None:
            return self._root
        root = self._ns_roots.get(namespace)
        if root is None:
            root = self._ns_roots[namespace] = self._new_root()
        return root

    def _drop_namespace_root(self, root: _Node) -> None:
        for name, r in list(self._ns_roots.items()):
            if r is root:
                del self._ns_roots[name]

    def _resolve(self, handle: object) -> _Node:
        h = as_handle(handle)
        if h == ROOT_HANDLE:
            return self._root
        node = self._nodes.get(h)
        if node is None:
            raise StaleHandleError(f"node handle {h:#x} is stale: its node was evicted or the tree was reset")
        return node

    def _child_key(self, tokens: list[int], pos: int) -> object:
        return tokens[pos] if self._page == 1 else tuple(tokens[pos : pos + self._page])

    def _first_page(self, key: list[int]) -> object:
        return self._child_key(key, 0)

    def _common_pages(self, key: list[int], tokens: list[int], pos: int, end: int) -> int:
        n = min(len(key), end - pos)
        if key[:n] == tokens[pos : pos + n]:  # the common case, compared in C
            return n // self._page * self._page
        i = 0
        while key[i] == tokens[pos + i]:
            i += 1
        return i // self._page * self._page

    def _touch(self, node: _Node) -> None:
        node.last_access = self._clock

    def _now(self) -> int:
        """The time for ``tlru``; other policies never read the clock."""
        return int(self._time()) if self._policy == "tlru" else 0

    def _demote_overflow(self) -> None:
        """``slru``: while the protected segment holds more than its share of the cached
        tokens, its least recently used node goes back to the probationary segment, as
        just used there."""
        limit = self._share * (self._evictable + self._protected)
        while self._hot_tokens > limit:
            victim = min((n for n in self._nodes.values() if n.hot), key=lambda n: (n.last_access, n.seq))
            victim.hot = False
            victim.last_access = self._clock
            self._hot_tokens -= len(victim.key)

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _register(self, node: _Node) -> None:
        node.handle = self._next_handle
        self._next_handle += 1
        self._nodes[node.handle] = node

    def _split(self, node: _Node, at: int) -> _Node:
        """Cuts ``node`` after ``at`` tokens; the upper part becomes a new node, returned."""
        upper = _Node(node.key[:at], node.value[:at], node.parent, node.start)
        upper.lock_ref = node.lock_ref
        upper.last_access, upper.created = node.last_access, node.created
        upper.hits, upper.priority = node.hits, node.priority
        upper.hot, upper.ttl, upper.deadline = node.hot, node.ttl, node.deadline
        upper.seq = self._take_seq()
        n_upper_blocks = (node.start + at) // self._block - node.start // self._block
        upper.block_hashes = node.block_hashes[:n_upper_blocks]
        node.block_hashes = node.block_hashes[n_upper_blocks:]
        node.key, node.value = node.key[at:], node.value[at:]
        node.start += at
        node.parent.children[self._first_page(upper.key)] = upper
        node.parent = upper
        upper.children[self._first_page(node.key)] = node
        self._register(upper)
        return upper

    def _add_leaf(
        self,
        parent: _Node,
        tokens: list[int],
        kv_slots: list[int],
        start: int,
        end: int,
        priority: int,
        parent_block: int | None,
        namespace: str | None,
    ) -> _Node:
        leaf = _Node(tokens[start:end], kv_slots[start:end], parent, start)
        leaf.last_access = leaf.created = self._clock
        leaf.priority = priority
        leaf.seq = self._take_seq()
        if self._events_on:
            b = self._block
            first, last = start // b, end // b
            if first < last:
                seed = parent_block if parent_block is not None else namespace_seed(namespace)
                block_tokens = tokens[first * b : last * b]
                leaf.block_hashes = chain_hashes(seed, block_tokens, b)
                self._events.append(
                    BlockStored(tuple(leaf.block_hashes), parent_block, tuple(block_tokens), b, namespace)
                )
        parent.children[self._first_page(leaf.key)] = leaf
        self._register(leaf)
        self._evictable += end - start
        return leaf

    def _evictable_leaves(self) -> list[_Node]:
        return [n for n in self._nodes.values() if not n.children and n.lock_ref == 0]

    def _evict_key(self, n: _Node, now: int) -> tuple[int, int]:
        policy = self._policy
        if policy == "lru":
            return (n.last_access, 0)
        if policy == "lfu":
            return (n.hits, n.last_access)
        if policy == "fifo":
            return (n.created, 0)
        if policy == "mru":
            return (-n.last_access, 0)
        if policy == "filo":
            return (-n.created, 0)
        if policy == "slru":
            return (int(n.hot), n.last_access)
        if policy == "tlru":
            return (0, n.deadline) if n.deadline <= now else (1, n.last_access)
        return (n.priority, n.last_access)

    def _find_violation(self) -> str | None:
        evictable = protected = 0
        seen: set[int] = set()
        reachable = 0
        for name, root in self._ns_roots.items():
            if not root.children:
                return f"namespace root {name!r} has no children"
        roots = [(self._root, None)] + [(r, ns) for ns, r in self._ns_roots.items()]
        for root, ns in roots:
            stack: list[tuple[_Node, list[int], int]] = [(root, [], namespace_seed(ns))]
            while stack:
                node, path, last_hash = stack.pop()
                if not node.is_root:
                    reachable += 1
                    if self._nodes.get(node.handle) is not node:
                        return f"node {node.handle} is reachable but not registered"
                    if not node.key or len(node.key) % self._page:
                        return f"node {node.handle} has {len(node.key)} tokens, not whole pages"
                    if len(node.key) != len(node.value):
                        return f"node {node.handle}: key and value lengths differ"
                    if node.start != len(path):
                        return f"node {node.handle}: start {node.start} but depth {len(path)}"
                    below = sum(c.lock_ref for c in node.children.values())
                    if node.lock_ref != node.own_locks + below:
                        return f"node {node.handle}: lock_ref is not own locks + children's"
                    if node.lock_ref:
                        protected += len(node.key)
                    else:
                        evictable += len(node.key)
                    for s in node.value:
                        if s in seen:
                            return f"kv slot {s} is held twice"
                        seen.add(s)
                    path = path + node.key
                    if self._events_on:
                        b = self._block
                        want = chain_hashes(last_hash, path[node.start // b * b : len(path) // b * b], b)
                        if want != node.block_hashes:
                            return f"node {node.handle}: block hashes are wrong"
                        if want:
                            last_hash = want[-1]
                for key, child in node.children.items():
                    if child.parent is not node or self._first_page(child.key) != key:
                        return f"node {child.handle} hangs under the wrong parent or key"
                    stack.append((child, path, last_hash))
        if reachable != len(self._nodes):
            return f"{len(self._nodes)} nodes registered but {reachable} reachable"
        hot = sum(len(n.key) for n in self._nodes.values() if n.hot)
        if hot != self._hot_tokens or (hot and self._policy != "slru"):
            return f"protected segment: counted {hot} tokens, recorded {self._hot_tokens}"
        if (evictable, protected) != (self._evictable, self._protected):
            return (
                f"sizes drifted: counted evictable {evictable}, protected {protected}; "
                f"recorded {self._evictable}, {self._protected}"
            )
        return None
