"""The ``slru`` and ``tlru`` eviction policies, on both tree backends (``make`` fixture):
segments, promotion, demotion, time-to-live, and their settings. Time never passes by
itself here: a ``ManualClock`` drives the ``tlru`` trees, so nothing sleeps. The parity
suite (``test_radix_parity.py``) runs both policies against the twin op by op."""

from __future__ import annotations

import pytest
from conftest import make_tree
from ferrolm._core import ManualClock
from ferrolm.errors import InvalidInputError


def drain(t) -> list[list[int]]:
    """Evicts one node at a time (asking for one token) and returns each node's slots."""
    out = []
    while t.evictable_size():
        freed = t.evict(1).tolist()
        assert freed
        out.append(freed)
        t.check_invariants()
    return out


def leaves(t, tokens=(1, 2, 3, 4)) -> None:
    """One-token leaves, slot = token * 100, inserted in order."""
    for tok in tokens:
        assert t.insert([tok], [tok * 100]) == 0


# ---- slru ----


def test_slru_defaults_and_settings(make):
    t = make(eviction_policy="slru")
    assert (t.eviction_policy, t.slru_protected_share) == ("slru", 0.8)
    assert make(eviction_policy="slru", slru_protected_share=0.25).slru_protected_share == 0.25


def test_slru_promotes_on_the_second_hit_and_evicts_probationary_first(make):
    t = make(eviction_policy="slru", slru_protected_share=1.0)
    leaves(t)
    t.match_prefix([1])
    t.match_prefix([1])  # second hit: protected
    t.match_prefix([2])  # one hit: still probationary, used last
    assert drain(t) == [[300], [400], [200], [100]]


def test_slru_keeps_a_twice_used_entry_through_a_burst_that_lru_would_keep(make):
    def first_evicted(policy: str) -> list[int]:
        t = make(eviction_policy=policy)
        leaves(t, range(1, 6))
        t.match_prefix([1])
        t.match_prefix([1])
        for tok in range(2, 6):  # a burst of single uses after it
            t.match_prefix([tok])
        return t.evict(1).tolist()

    assert first_evicted("lru") == [100]
    assert first_evicted("slru") == [200]


def test_slru_overflow_demotes_the_least_recently_used_protected_node(make):
    t = make(eviction_policy="slru", slru_protected_share=0.5)
    leaves(t)
    for tok in (1, 2, 3):
        t.match_prefix([tok])
        t.match_prefix([tok])
        t.check_invariants()
    # 3's promotion overflowed the half share: 1 went back to the probationary segment as
    # just used there, after 4 (never hit); 2 and 3 stay protected
    assert drain(t) == [[400], [100], [200], [300]]


def test_slru_demoted_node_is_promoted_again_by_its_next_hit(make):
    t = make(eviction_policy="slru", slru_protected_share=0.5)
    leaves(t)
    for tok in (1, 2, 3):
        t.match_prefix([tok])
        t.match_prefix([tok])
    t.match_prefix([1])  # 1 comes back; 2, now the protected LRU, is demoted
    assert drain(t) == [[400], [200], [300], [100]]


def test_slru_share_zero_is_lru(make):
    def order(policy: str, **kw) -> list[list[int]]:
        t = make(eviction_policy=policy, **kw)
        leaves(t)
        for tok in (1, 1, 3, 1, 2):
            t.match_prefix([tok])
        return drain(t)

    assert order("slru", slru_protected_share=0.0) == order("lru")


def test_slru_split_of_a_protected_node_keeps_both_parts_protected(make):
    t = make(eviction_policy="slru", slru_protected_share=1.0)
    t.insert([1, 2, 3, 4], [10, 11, 12, 13])
    t.match_prefix([1, 2, 3, 4])
    t.match_prefix([1, 2, 3, 4])
    t.match_prefix([1, 2])  # splits the protected node
    t.check_invariants()
    t.insert([7], [70])
    assert t.evict(1).tolist() == [70]


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), float("inf"), "0.5", True, None])
def test_bad_slru_share_names_its_field(backend, share):
    if share is None:  # None means the default
        assert make_tree(backend, slru_protected_share=None).slru_protected_share == 0.8
        return
    with pytest.raises(InvalidInputError) as e:
        make_tree(backend, eviction_policy="slru", slru_protected_share=share)
    assert e.value.field == "slru_protected_share"


# ---- tlru ----


def tlru(make, ttl: float = 10.0):
    clock = ManualClock(1_000)
    return make(eviction_policy="tlru", ttl_seconds=ttl, clock=clock), clock


def test_tlru_defaults_and_settings(make):
    t = make(eviction_policy="tlru")
    assert (t.eviction_policy, t.ttl_seconds) == ("tlru", 300.0)
    assert make(eviction_policy="tlru", ttl_seconds=2.5).ttl_seconds == 2.5


def test_tlru_is_lru_while_nothing_has_expired(make):
    t, clock = tlru(make)
    leaves(t, (1, 2, 3))
    t.match_prefix([1])
    clock.advance(9.9)
    assert drain(t) == [[200], [300], [100]]


def test_tlru_evicts_expired_nodes_first_earliest_first_then_lru(make):
    t, clock = tlru(make)
    assert t.insert([1], [100], ttl_seconds=3600) == 0  # least recently used, lives an hour
    assert t.insert([2], [200]) == 0
    clock.advance(1)
    assert t.insert([3], [300]) == 0
    assert t.insert([4], [400], ttl_seconds=1000) == 0
    clock.advance(20)
    # 2 and 3 expired (2 earlier); then 1 and 4 by LRU
    assert drain(t) == [[200], [300], [100], [400]]


def test_tlru_use_renews_the_deadline(make):
    t, clock = tlru(make)
    leaves(t, (1, 2))  # at 0 s: both expire at 10 s
    clock.advance(8)
    t.match_prefix([1])  # 1 now expires at 18 s
    clock.advance(4)
    assert drain(t) == [[200], [100]]  # at 12 s: 2 has expired, 1 has not


def test_tlru_a_shorter_ttl_never_lowers_a_walked_nodes(make):
    t, clock = tlru(make)
    leaves(t, (1, 2))  # at 0 s
    clock.advance(8)
    t.match_prefix([2])
    t.insert([1], [999], ttl_seconds=0.5)  # 1 keeps its 10 s: expires at 18 s, not 8.5 s
    clock.advance(1)
    # at 9 s nothing has expired: LRU, and 2 was used before the insert walked 1
    assert drain(t) == [[200], [100]]


def test_tlru_insert_raises_the_ttl_of_walked_nodes(make):
    t, clock = tlru(make)
    leaves(t, (1, 2))  # at 0 s, 10 s each
    t.insert([1], [999], ttl_seconds=100)  # 1 now lives 100 s from its last use
    clock.advance(50)
    t.match_prefix([2])  # 2 is the most recently used, until 60 s
    clock.advance(11)
    # at 61 s 2 has expired and 1 (until 100 s) has not
    assert drain(t) == [[200], [100]]


def test_expired_but_locked_nodes_stay(make):
    t, clock = tlru(make)
    leaves(t, (1, 2))
    node = t.match_prefix([1]).node
    t.lock(node)
    clock.advance(60)
    assert t.evict(100).tolist() == [200]
    t.unlock(node)
    assert t.evict(100).tolist() == [100]


@pytest.mark.parametrize("ttl", [0, -1, 2e9, float("nan"), float("inf"), "5", True, 1e-12])
def test_bad_ttl_names_its_field_in_the_constructor_and_insert(backend, ttl):
    with pytest.raises(InvalidInputError) as e:
        make_tree(backend, eviction_policy="tlru", ttl_seconds=ttl)
    assert e.value.field == "ttl_seconds"
    t = make_tree(backend, eviction_policy="tlru")
    with pytest.raises(InvalidInputError) as e:
        t.insert([1, 2], [3, 4], ttl_seconds=ttl)
    assert e.value.field == "ttl_seconds"
    assert t.total_size() == 0


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"])
def test_a_ttl_is_refused_under_other_policies_changing_nothing(backend, policy):
    t = make_tree(backend, eviction_policy=policy)
    with pytest.raises(InvalidInputError, match="tlru"):
        t.insert([1, 2], [3, 4], ttl_seconds=5)
    assert t.total_size() == 0


def test_rust_tree_takes_only_a_manual_clock(backend):
    bad = (lambda: 5) if backend == "rust" else 5  # the twin takes any callable
    with pytest.raises(InvalidInputError) as e:
        make_tree(backend, eviction_policy="tlru", clock=bad)
    assert e.value.field == "clock"


def test_manual_clock_moves_only_when_told():
    clock = ManualClock(7)
    assert clock.now_ns() == 7
    clock.advance(1.5)
    assert clock.now_ns() == 7 + 1_500_000_000
    clock.advance(0)
    assert clock.now_ns() == 7 + 1_500_000_000
    for bad in (-1, float("nan"), "1", None):
        with pytest.raises(InvalidInputError):
            clock.advance(bad)
    assert clock.now_ns() == 7 + 1_500_000_000


def test_the_twin_reads_any_nanosecond_callable():
    now = [0]
    t = make_tree("python", eviction_policy="tlru", ttl_seconds=1, clock=lambda: now[0])
    t.insert([1], [100], ttl_seconds=100)
    t.insert([2], [200])
    t.match_prefix([2])  # the most recently used, but it expires at 1 s
    now[0] = 2_000_000_000
    assert drain(t) == [[200], [100]]


def test_one_manual_clock_drives_both_backends_alike():
    clock = ManualClock()
    trees = [make_tree(b, eviction_policy="tlru", ttl_seconds=5, clock=clock) for b in ("rust", "python")]
    for t in trees:
        leaves(t, (1, 2, 3))
        t.match_prefix([1])
    clock.advance(3)
    for t in trees:
        t.match_prefix([3])
    clock.advance(3)
    # at 6 s 1 and 2 have expired (at 5 s; 1 was made first), 3 (used at 3 s) has not:
    # by LRU alone 2 would go before 1
    orders = [drain(t) for t in trees]
    assert orders[0] == orders[1] == [[100], [200], [300]]
