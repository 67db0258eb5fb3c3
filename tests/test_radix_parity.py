"""Parity of the two tree backends, and DESIGN.md's invariants, under long random
sequences of operations (hypothesis stateful testing).

Both trees (Rust and the Python twin, same page size, policy and event block size, events
on) get the same calls in lockstep and must give the same answers: matched lengths and
slots, the handles' identity (a consistent one-to-one pairing of Rust and Python
handles), insert results, evicted slots in the same order, sizes, events, and errors of
the same class. An independent oracle (a map from every cached token position, by
namespace and prefix, to its KV slot) says what the answers must be, and a simulated slot
pool checks KV conservation: free + cached == capacity, no slot held twice, and every
slot inserted is still cached, returned by evict, or handed back by the caller as a
duplicate per the insert contract.

``FERROLM_HYPOTHESIS_EXAMPLES`` / ``FERROLM_HYPOTHESIS_STEPS`` run it longer (conftest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash
from conftest import make_tree
from ferrolm._core import ManualClock
from ferrolm.errors import FerrolmError, InvalidInputError, NotLockedError, StaleHandleError
from ferrolm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
SHARES = (0.0, 0.3, 0.8, 1.0)  # slru: the protected segment's share
TTL = 4.0  # tlru: seconds; the clock rule moves time by 0 to 6 s
NAMESPACES = (None, "a", "b")
FORMS = ("list", "int32", "uint32", "int64")
MAX_LEN = 16
CAPACITY = 40

Key = tuple  # (namespace, the prefix up to the end of a page)


def seed(namespace: str | None) -> int:
    tag = b"\x00" if namespace is None else b"\x01" + namespace.encode()
    return xxhash.xxh3_64_intdigest(b"ferrolm:kv:v1" + tag)


def block_hash(parent: int, block) -> int:
    data = parent.to_bytes(8, "little") + b"".join(int(t).to_bytes(4, "little") for t in block)
    return xxhash.xxh3_64_intdigest(data)


def conv(values: list[int], form: str):
    return list(values) if form == "list" else np.array(values, dtype=form)


@dataclass
class Handle:
    rust: int
    python: int
    namespace: str | None
    prefix: tuple[int, ...]
    alive: bool = True
    own_locks: int = 0


class Disagreement(AssertionError):
    pass


class TreeParity(RuleBasedStateMachine):
    @initialize(
        page=st.sampled_from([1, 2, 4]),
        policy=st.sampled_from(POLICIES),
        block_choice=st.sampled_from(["page", "double"]),
        share=st.sampled_from(SHARES),
    )
    def setup(self, page: int, policy: str, block_choice: str, share: float = 0.8) -> None:
        # event blocks of whole pages; a block size that is not a multiple of the page
        # size breaks the events (test_radix_unit.py::test_events_block_not_a_multiple_of_the_page)
        block = {"page": None, "double": 2 * page}[block_choice]
        # one clock drives both trees, so that time-to-live expires alike in both
        self.clock = ManualClock()
        kw = dict(
            page_size=page,
            eviction_policy=policy,
            enable_kv_events=True,
            kv_event_block_size=block,
            slru_protected_share=share,
            ttl_seconds=TTL,
            clock=self.clock,
        )
        self.rust = make_tree("rust", **kw)
        self.py = make_tree("python", **kw)
        self.policy = policy
        self.page = page
        self.block = block or page
        self.free: list[int] = list(range(CAPACITY))
        # every cached page, by namespace and the prefix it ends: its slots
        self.model: dict[Key, tuple[int, ...]] = {}
        self.slot_key: dict[int, Key] = {}
        self.history: list[list[int]] = [[0, 1, 2, 3, 0, 1, 2, 3]]
        root = Handle(self.rust.root_node, self.py.root_node, None, ())
        self.handles: list[Handle] = [root]
        self.by_rust = {root.rust: root}
        self.by_py = {root.python: root}
        self.live_blocks: set[int] = set()

    # ---- lockstep calls ----

    def both(self, fn):
        """Runs ``fn`` on both trees; they must both return or both raise the same
        ferrolm error class. Returns ``(error_class or None, rust_result, py_result)``."""
        out = []
        for t in (self.rust, self.py):
            try:
                out.append((None, fn(t)))
            except FerrolmError as e:
                out.append((type(e), e))
        (er, vr), (ep, vp) = out
        if er is not ep:
            raise Disagreement(f"backends disagree: rust gave {er or vr!r}, python gave {ep or vp!r}")
        return er, vr, vp

    def sequence(self, base: int, cut: int, suffix: list[int]) -> list[int]:
        """A sequence that often shares a prefix with earlier ones."""
        prev = self.history[base % len(self.history)]
        seq = (prev[: cut % (len(prev) + 1)] + suffix)[:MAX_LEN]
        self.history.append(seq)
        if len(self.history) > 24:
            del self.history[1]
        return seq

    # ---- the oracle ----

    def expected_match(self, ns, seq) -> tuple[int, list[int]]:
        aligned = len(seq) // self.page * self.page
        length, slots = 0, []
        for end in range(self.page, aligned + 1, self.page):
            page = self.model.get((ns, tuple(seq[:end])))
            if page is None:
                break
            length = end
            slots.extend(page)
        return length, slots

    def protected_keys(self) -> set[Key]:
        keys = set()
        for h in self.handles:
            if h.own_locks:
                ends = range(self.page, len(h.prefix) + 1, self.page)
                keys.update((h.namespace, h.prefix[:end]) for end in ends)
        return keys

    def handle_for(self, rust_handle: int, py_handle: int, ns, prefix) -> Handle:
        """The pairing of handles must stay one-to-one forever (handles are never
        recycled), and a handle always stands for the same prefix."""
        h = self.by_rust.get(rust_handle)
        if h is None:
            assert py_handle not in self.by_py, (
                f"python handle {py_handle} reused for a new node (rust handle {rust_handle:#x} is new)"
            )
            h = Handle(rust_handle, py_handle, ns, tuple(prefix))
            self.handles.append(h)
            self.by_rust[rust_handle] = h
            self.by_py[py_handle] = h
            return h
        assert h.python == py_handle, (
            f"rust handle {rust_handle:#x} is paired with python {h.python}, now with {py_handle}"
        )
        assert h.alive, f"handle {rust_handle:#x} came back after its node went away"
        if h.prefix:
            assert (h.namespace, h.prefix) == (ns, tuple(prefix)), "a handle changed its prefix"
        return h

    def forget_dead_handles(self) -> None:
        for h in self.handles:
            if h.alive and h.prefix and (h.namespace, h.prefix) not in self.model:
                assert h.own_locks == 0, f"locked prefix {h.prefix} of {h.namespace!r} was evicted"
                h.alive = False

    # ---- operations ----

    def do_match(self, seq, ns, form) -> tuple[int, list[int]]:
        nodes_before = self.rust.num_nodes()
        err, mr, mp = self.both(lambda t: t.match_prefix(conv(seq, form), namespace=ns))
        assert err is None, err
        if self.rust.num_nodes() > nodes_before:
            event("match: split")
        assert mr.length == mp.length, (mr.length, mp.length)
        assert mr.kv_slots.dtype == mp.kv_slots.dtype == np.int32
        assert np.array_equal(mr.kv_slots, mp.kv_slots), (mr.kv_slots, mp.kv_slots)
        length, slots = self.expected_match(ns, seq)
        assert (mr.length, mr.kv_slots.tolist()) == (length, slots)
        if length == 0:
            assert (mr.node, mp.node) == (self.rust.root_node, self.py.root_node)
        else:
            self.handle_for(mr.node, mp.node, ns, seq[:length])
        return length, slots

    def do_evict(self, n: int) -> list[int]:
        protected_before = len(self.protected_keys()) * self.page
        evictable_before = len(self.model) * self.page - protected_before
        err, fr, fp = self.both(lambda t: t.evict(n))
        assert err is None, err
        assert fr.dtype == fp.dtype == np.int32
        assert fr.tolist() == fp.tolist(), ("eviction order differs", fr.tolist(), fp.tolist())
        freed = fr.tolist()
        assert len(set(freed)) == len(freed), f"evict returned a slot twice: {freed}"
        assert not set(freed) & set(self.free), "evict returned a slot that was already free"
        locked = self.protected_keys()
        gone = set()
        for slot in freed:
            assert slot in self.slot_key, f"evict returned slot {slot}, which the tree did not hold"
            gone.add(self.slot_key.pop(slot))
        assert not gone & locked, f"evict freed locked pages {gone & locked}"
        for key in gone:
            assert set(self.model.pop(key)) <= set(freed), f"evict freed part of the page {key}"
        # whole leaves go: what is left is still closed under prefixes
        for ns, prefix in self.model:
            if len(prefix) > self.page:
                assert (ns, prefix[: -self.page]) in self.model, "evict left a hole in a cached prefix"
        # at least what was asked, or everything evictable
        assert len(freed) >= min(n, evictable_before)
        if len(freed) < n:
            assert len(self.model) * self.page == protected_before
        self.free.extend(freed)
        self.forget_dead_handles()
        event("evict: freed " + ("nothing" if not freed else "less than asked" if len(freed) < n else "enough"))
        return freed

    # ---- rules ----

    @rule(
        base=st.integers(0, 1000),
        cut=st.integers(0, MAX_LEN),
        suffix=st.lists(st.integers(0, 3), max_size=8),
        ns=st.sampled_from(NAMESPACES),
        form=st.sampled_from(FORMS),
    )
    def match(self, base, cut, suffix, ns, form):
        self.do_match(self.sequence(base, cut, suffix), ns, form)

    def do_lock(self, h: Handle) -> None:
        before = len(self.protected_keys())
        err, rr, rp = self.both(lambda t: t.lock(h.rust if t is self.rust else h.python))
        event("lock: " + ("stale" if not h.alive else "root" if not h.prefix else "live"))
        if not h.alive:
            assert err is StaleHandleError, f"lock of a dead handle gave {err or rr!r}"
            return
        assert err is None, f"lock of a live handle raised {err.__name__}"
        if h.prefix:
            h.own_locks += 1
        assert rr == rp == (len(self.protected_keys()) - before) * self.page, (rr, rp)

    def do_unlock(self, h: Handle) -> None:
        before = len(self.protected_keys())
        err, rr, rp = self.both(lambda t: t.unlock(h.rust if t is self.rust else h.python))
        event(f"unlock: {err.__name__ if err else 'ok'}")
        if not h.alive:
            assert err is StaleHandleError, f"unlock of a dead handle gave {err or rr!r}"
        elif not h.prefix:
            assert err is None and rr == rp == 0, "unlock of the root is a no-op"
        elif h.own_locks == 0:
            assert err is NotLockedError, f"unlock without a lock gave {err or rr!r}"
        else:
            assert err is None, f"unlock of a locked handle raised {err.__name__}"
            h.own_locks -= 1
            assert rr == rp == (before - len(self.protected_keys())) * self.page, (rr, rp)

    @rule(
        base=st.integers(0, 1000),
        cut=st.integers(0, MAX_LEN),
        suffix=st.lists(st.integers(0, 3), max_size=8),
        ns=st.sampled_from(NAMESPACES),
        priority=st.integers(-2, 2),
        form=st.sampled_from(FORMS),
        cycle=st.sampled_from(["plain", "match", "match_lock"]),
        ttl=st.sampled_from([None, None, 1.5, 9.0]),
    )
    def insert(self, base, cut, suffix, ns, priority, form, cycle, ttl):
        """``plain``: the caller has fresh slots for every token. ``match``: the request
        cycle, whose matched prefix's slots come from the tree; ``match_lock`` also locks
        the matched node around the insert."""
        seq = self.sequence(base, cut, suffix)
        # make room first (a real engine evicts before it allocates)
        if len(self.free) < len(seq):
            self.do_evict(len(seq) - len(self.free))
        matched, kv, node = 0, [], None
        if cycle != "plain":
            matched, kv = self.do_match(seq, ns, form)
            if cycle == "match_lock" and matched:
                node = self.by_rust[self.rust.match_prefix(seq[:matched], namespace=ns).node]
                self.py.match_prefix(seq[:matched], namespace=ns)
                self.do_lock(node)
        if len(self.free) < len(seq) - matched:  # everything left is locked: insert less
            seq = seq[: matched + len(self.free)]
        fresh = len(seq) - matched
        kv = kv + self.free[:fresh]
        del self.free[:fresh]
        expected, _ = self.expected_match(ns, seq)

        nodes_before = self.rust.num_nodes()
        # a time-to-live of its own only under tlru (elsewhere it is refused: bad_call)
        extra = {"ttl_seconds": ttl} if ttl is not None and self.policy == "tlru" else {}
        err, rr, rp = self.both(
            lambda t: t.insert(conv(seq, form), conv(kv, form), namespace=ns, priority=priority, **extra)
        )
        assert err is None, err
        grew = self.rust.num_nodes() - nodes_before
        event(f"insert: {'nothing new' if grew == 0 else 'new leaf' if grew == 1 else 'split and new leaf'}")
        assert rr == rp == expected, (rr, rp, expected)
        assert rr >= matched
        aligned = len(seq) // self.page * self.page
        # the tree keeps kv[rr:aligned]; the caller frees its own copies of the cached
        # part (the slots it did not get from the match) and the partial last page
        for start in range(rr, aligned, self.page):
            key = (ns, tuple(seq[: start + self.page]))
            assert key not in self.model
            self.model[key] = tuple(kv[start : start + self.page])
            for slot in self.model[key]:
                self.slot_key[slot] = key
        self.free.extend(kv[matched:rr] + kv[aligned:])
        if node is not None:
            self.do_unlock(node)

    @rule(pick=st.integers(0, 10_000))
    def lock(self, pick):
        self.do_lock(self.handles[pick % len(self.handles)])

    @rule(pick=st.integers(0, 10_000), locked_only=st.booleans())
    def unlock(self, pick, locked_only):
        candidates = [h for h in self.handles if h.own_locks] if locked_only else self.handles
        if candidates:
            self.do_unlock(candidates[pick % len(candidates)])

    @rule(n=st.integers(0, 24))
    def evict(self, n):
        self.do_evict(n)

    @rule(seconds=st.sampled_from([0, 0.5, 1, 3, 4, 6]))
    def advance_clock(self, seconds):
        """Time passes for both trees (only tlru reads it)."""
        self.clock.advance(seconds)

    @rule(dice=st.integers(0, 3))
    def reset(self, dice):
        if dice:  # resets are rarer than the other operations
            return
        err, _, _ = self.both(lambda t: t.reset())
        assert err is None
        self.model.clear()
        self.slot_key.clear()
        self.free = list(range(CAPACITY))  # the caller owns every slot again
        for h in self.handles:
            h.own_locks = 0
        self.forget_dead_handles()

    @rule(
        kind=st.sampled_from(
            [
                "mismatched_lengths",
                "negative_token",
                "big_slot",
                "float_tokens",
                "negative_evict",
                "unknown_handle",
                "bad_ttl",
            ]
        ),
        seq=st.lists(st.integers(0, 3), min_size=1, max_size=6),
        ns=st.sampled_from(NAMESPACES),
        n=st.integers(0, 2**20 - 1),
    )
    def bad_call(self, kind, seq, ns, n):
        """Bad input: the same error class from both, and nothing changes (the
        invariants after the step check the latter)."""
        kv = list(range(1000, 1000 + len(seq)))
        if kind == "mismatched_lengths":
            call = lambda t: t.insert(seq, kv + [7] if n % 2 else kv[:-1], namespace=ns)  # noqa: E731
            want = InvalidInputError
        elif kind == "negative_token":
            call = lambda t: t.insert(seq[:-1] + [-1], kv, namespace=ns)  # noqa: E731
            want = InvalidInputError
        elif kind == "big_slot":
            call = lambda t: t.insert(seq, kv[:-1] + [2**31], namespace=ns)  # noqa: E731
            want = InvalidInputError
        elif kind == "float_tokens":
            call = lambda t: t.match_prefix(np.array(seq, dtype=np.float64), namespace=ns)  # noqa: E731
            want = InvalidInputError
        elif kind == "negative_evict":
            call = lambda t: t.evict(-1 - n % 5)  # noqa: E731
            want = InvalidInputError
        elif kind == "bad_ttl":
            # a negative ttl anywhere; a good one where the policy is not tlru
            ttl = -1.0 if n % 2 or self.policy == "tlru" else 2.0
            call = lambda t: t.insert(seq, kv, namespace=ns, ttl_seconds=ttl)  # noqa: E731
            want = InvalidInputError
        else:
            # a number neither tree gave out: rust's index and generation are both far
            # beyond anything this test makes, python's counter likewise
            handle = ((2**20 + n) << 32) | (2**20 + n)
            call = lambda t: t.lock(handle)  # noqa: E731
            want = StaleHandleError
        err, _, _ = self.both(call)
        assert err is want, f"{kind}: expected {want.__name__}, got {err}"

    def teardown(self) -> None:
        steps = getattr(self, "steps", 0)
        event(f"steps: {'<10' if steps < 10 else '10-29' if steps < 30 else '30+'}")

    # ---- invariants after every step ----

    @invariant()
    def structure_is_sound(self):
        self.steps = getattr(self, "steps", 0) + 1
        self.rust.check_invariants()
        self.py.check_invariants()

    @invariant()
    def sizes_agree_with_each_other_and_the_oracle(self):
        r = (self.rust.evictable_size(), self.rust.protected_size(), self.rust.total_size(), self.rust.num_nodes())
        p = (self.py.evictable_size(), self.py.protected_size(), self.py.total_size(), self.py.num_nodes())
        assert r == p, f"sizes differ: rust {r}, python {p}"
        evictable, protected, total, nodes = r
        assert evictable + protected == total
        assert total == len(self.model) * self.page
        assert protected == len(self.protected_keys()) * self.page
        assert nodes <= total // self.page

    @invariant()
    def kv_is_conserved(self):
        held_r = sorted(self.rust.all_kv_slots().tolist())
        held_p = sorted(self.py.all_kv_slots().tolist())
        assert held_r == held_p
        assert held_r == sorted(s for page in self.model.values() for s in page)
        assert len(set(held_r)) == len(held_r), "a slot is held twice by the tree"
        assert len(set(self.free)) == len(self.free), "a slot was handed back twice"
        assert not set(self.free) & set(held_r), "a slot is both free and cached"
        assert len(self.free) + len(held_r) == CAPACITY

    @invariant()
    def events_agree_and_track_the_cache(self):
        er, pr = self.rust.take_events(), self.py.take_events()
        assert er == pr, f"events differ:\nrust   {er}\npython {pr}"
        for ev in er:
            if isinstance(ev, BlockStored):
                assert ev.block_size == self.block
                assert len(ev.token_ids) == len(ev.block_hashes) * self.block
                parent = ev.parent_block_hash if ev.parent_block_hash is not None else seed(ev.namespace)
                assert ev.parent_block_hash is None or ev.parent_block_hash in self.live_blocks
                for i, h in enumerate(ev.block_hashes):
                    parent = block_hash(parent, ev.token_ids[i * self.block : (i + 1) * self.block])
                    assert h == parent, "a stored block's hash does not chain"
                    assert h not in self.live_blocks, "a block was stored twice"
                    self.live_blocks.add(h)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    assert h in self.live_blocks, "a block was removed that was not stored"
                    self.live_blocks.remove(h)
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.live_blocks.clear()
        # the live blocks are exactly the full blocks of what is cached
        # (a block is stored by the page it ends in)
        want = set()
        for ns, prefix in self.model:
            for end in range(len(prefix) - self.page + 1, len(prefix) + 1):
                if end % self.block == 0:
                    h = seed(ns)
                    for i in range(0, end, self.block):
                        h = block_hash(h, prefix[i : i + self.block])
                    want.add(h)
        assert self.live_blocks == want

    @invariant()
    def locked_prefixes_stay_cached(self):
        for h in self.handles:
            if h.own_locks:
                assert h.alive
                assert (h.namespace, h.prefix) in self.model


TestTreeParity = TreeParity.TestCase


class PageOnePolicyParity(TreeParity):
    """The same machine with a single-token page and no event block choice, where splits
    are most frequent."""

    @initialize(policy=st.sampled_from(POLICIES), share=st.sampled_from(SHARES))
    def setup(self, policy: str, share: float) -> None:  # type: ignore[override]
        TreeParity.setup(self, 1, policy, "page", share)


TestPageOneParity = PageOnePolicyParity.TestCase
