"""What only the Rust backend promises: panics poison the object, the GIL is released
during calls, the backend switch, and memory per cached token."""

from __future__ import annotations

import threading
import time

import ferrolm
import numpy as np
import pytest
from conftest import make_tree
from ferrolm.errors import CorePanicError, FerrolmError


def big_tree(num_convs: int = 6000, prompt_len: int = 2000, tail_len: int = 200):
    """A Rust tree of a few long shared prompts with many distinct continuations
    (about 1.2M cached tokens with the defaults)."""
    t = make_tree("rust")
    rng = np.random.default_rng(1234)
    prompts = [rng.integers(0, 100_000, size=prompt_len, dtype=np.int64) for _ in range(4)]
    next_slot = 0
    for i in range(num_convs):
        seq = np.concatenate([prompts[i % 4], rng.integers(0, 100_000, size=tail_len)])
        t.insert(seq.astype(np.int32), np.arange(next_slot, next_slot + len(seq), dtype=np.int32))
        next_slot += len(seq)
    return t


# ---------------------------------------------------------------------------------------
# panics
# ---------------------------------------------------------------------------------------


def panicked_tree():
    t = make_tree("rust", enable_kv_events=True)
    t.insert([1, 2, 3], [1, 2, 3])
    node = t.match_prefix([1, 2, 3]).node
    t.lock(node)
    with pytest.raises(CorePanicError) as info:
        t._inject_panic()
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, FerrolmError)
    assert "injected" in str(info.value)
    return t, node


CALLS = {
    "match_prefix": lambda t, node: t.match_prefix([1, 2, 3]),
    "insert": lambda t, node: t.insert([4, 5], [4, 5]),
    "lock": lambda t, node: t.lock(node),
    "unlock": lambda t, node: t.unlock(node),
    "evict": lambda t, node: t.evict(10),
    "reset": lambda t, node: t.reset(),
    "memory_bytes": lambda t, node: t.memory_bytes(),
    "all_kv_slots": lambda t, node: t.all_kv_slots(),
    "check_invariants": lambda t, node: t.check_invariants(),
    "take_raw_events": lambda t, node: t.take_raw_events(),
    "take_events": lambda t, node: t.take_events(),
    "_inject_panic": lambda t, node: t._inject_panic(),
    "_read_tokens": lambda t, node: t._read_tokens(np.array([1, 2], dtype=np.int32)),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_panic_poisons_the_tree(call):
    t, node = panicked_tree()
    with pytest.raises(CorePanicError) as info:
        CALLS[call](t, node)
    assert "unusable" in str(info.value) or "refuses" in str(info.value)
    # and again: it stays poisoned
    with pytest.raises(CorePanicError):
        CALLS[call](t, node)


SIZE_CALLS = ["evictable_size", "protected_size", "total_size", "num_nodes"]


@pytest.mark.parametrize("call", SIZE_CALLS)
def test_panic_poisons_the_size_getters_too(call):
    """_core.pyi: after a panic "this object refuses every call"; sizes read from a
    half-changed structure are as untrustworthy as anything else in it."""
    t, _ = panicked_tree()
    with pytest.raises(CorePanicError):
        getattr(t, call)()


def test_panic_poisons_every_public_method():
    """Guards the list above: a method added to the class is not left out of it."""
    public = {
        name
        for name in dir(ferrolm._core.RadixTree)
        if callable(getattr(ferrolm._core.RadixTree, name)) and not name.startswith("__")
    }
    assert public == set(CALLS) - {"take_events"} | set(SIZE_CALLS)


def test_panic_in_one_tree_leaves_others_working():
    t, _ = panicked_tree()
    other = make_tree("rust")
    other.insert([1, 2, 3], [1, 2, 3])
    assert other.match_prefix([1, 2, 3]).length == 3
    other.check_invariants()
    with pytest.raises(CorePanicError):
        t.match_prefix([1])


def test_panic_message_tells_what_to_do():
    t, _ = panicked_tree()
    with pytest.raises(CorePanicError, match="create a new one"):
        t.insert([1], [1])


# ---------------------------------------------------------------------------------------
# the GIL
# ---------------------------------------------------------------------------------------


class Heartbeat:
    """A Python thread that calls ``beat`` and counts, sleeping a little between beats.
    While another thread holds the GIL without a break it cannot count; and because it
    sleeps after every beat, it cannot pile up beats in the moment a call returns."""

    def __init__(self, beat=None) -> None:
        self.beats = 0
        self._beat = beat
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._beat is not None:
                    self._beat()
                self.beats += 1
                time.sleep(0.0005)
        except BaseException as e:  # reported by __exit__
            self.error = e

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        while self.beats == 0 and self.error is None:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error


def most_beats_during(call, hb: Heartbeat, attempts: int = 20, enough: int = 10) -> int:
    """The most heartbeats seen during one ``call()``. With the GIL held throughout a
    call this stays at a beat or two whatever the call's length (the heartbeat can run
    only at the call's edges)."""
    best = 0
    for _ in range(attempts):
        before = hb.beats
        call()
        best = max(best, hb.beats - before)
        if best >= enough:
            break
    return best


@pytest.fixture(scope="module")
def large_tree():
    t = big_tree()
    assert t.total_size() > 1_000_000
    return t


def test_gil_is_released_during_check_invariants(large_tree):
    with Heartbeat() as hb:
        assert most_beats_during(large_tree.check_invariants, hb) >= 10


def test_gil_is_released_during_large_insert_and_match():
    # long enough that a released GIL shows many beats however fast the allocator is:
    # 8M tokens took 30 ms in a fresh process but 9 ms after other tests had warmed it
    n = 32_000_000
    seq = np.random.default_rng(3).integers(0, 100_000, size=n).astype(np.int32)
    kv = np.arange(n, dtype=np.int32)
    t = make_tree("rust")
    results = []

    def insert() -> None:
        t.reset()
        results.append(t.insert(seq, kv))

    def match() -> None:
        m = t.match_prefix(seq)
        results.append(m.length)

    with Heartbeat() as hb:
        assert most_beats_during(insert, hb) >= 10
        assert most_beats_during(match, hb) >= 10
    assert set(results) <= {0, n} and n in results


def test_two_trees_make_progress_concurrently(large_tree):
    """While one thread works on a big tree, another thread's calls on its own tree
    keep completing (and give the right answers)."""
    small = make_tree("rust", page_size=2)
    state = {"k": 0}

    def small_tree_op() -> None:
        k = state["k"]
        seq = [k % 3, k % 5, k % 7, k]
        small.insert(seq, [4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3])
        m = small.match_prefix(seq)
        assert m.length == 4
        if k % 64 == 63:
            small.evict(100)
        state["k"] = k + 1

    with Heartbeat(beat=small_tree_op) as hb:
        assert most_beats_during(large_tree.check_invariants, hb) >= 10
    small.check_invariants()
    assert state["k"] >= 10


def test_results_are_right_under_concurrent_use_of_separate_trees():
    results: dict[int, list[int]] = {}

    def work(i: int) -> None:
        t = make_tree("rust", page_size=2)
        out = []
        for k in range(300):
            seq = [i, k % 7, k % 5, k % 3, k]
            out.append(t.insert(seq, list(range(5 * k, 5 * k + 5))))
            out.append(t.match_prefix(seq).length)
            if k % 50 == 49:
                out.append(len(t.evict(40)))
        t.check_invariants()
        results[i] = out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    expected = make_tree("python", page_size=2)
    for i in range(4):
        ref = []
        expected.reset()
        for k in range(300):
            seq = [i, k % 7, k % 5, k % 3, k]
            ref.append(expected.insert(seq, list(range(5 * k, 5 * k + 5))))
            ref.append(expected.match_prefix(seq).length)
            if k % 50 == 49:
                ref.append(len(expected.evict(40)))
        assert results[i] == ref


# ---------------------------------------------------------------------------------------
# backend selection
# ---------------------------------------------------------------------------------------


def test_backend_default_is_rust(monkeypatch):
    monkeypatch.delenv("FERROLM_TREE_BACKEND", raising=False)
    assert type(ferrolm.RadixCache()) is ferrolm.RustRadixCache
    assert isinstance(ferrolm.RadixCache(), ferrolm._core.RadixTree)


@pytest.mark.parametrize(
    ("env", "cls"), [("rust", ferrolm.RustRadixCache), ("python", ferrolm.PyRadixCache), ("", ferrolm.RustRadixCache)]
)
def test_backend_env_picks_the_class(monkeypatch, env, cls):
    monkeypatch.setenv("FERROLM_TREE_BACKEND", env)
    t = ferrolm.RadixCache(page_size=2, eviction_policy="fifo")
    assert type(t) is cls
    assert (t.page_size, t.eviction_policy) == (2, "fifo")


@pytest.mark.parametrize(("env", "arg"), [("python", "rust"), ("rust", "python")])
def test_backend_argument_overrides_env(monkeypatch, env, arg):
    monkeypatch.setenv("FERROLM_TREE_BACKEND", env)
    t = ferrolm.RadixCache(backend=arg)
    assert type(t) is (ferrolm.RustRadixCache if arg == "rust" else ferrolm.PyRadixCache)


def test_backend_env_unknown_name_is_an_error(monkeypatch):
    monkeypatch.setenv("FERROLM_TREE_BACKEND", "gpu")
    with pytest.raises(ferrolm.errors.InvalidInputError, match="FERROLM_TREE_BACKEND") as info:
        ferrolm.RadixCache()
    assert "'gpu'" in str(info.value)


def test_rust_cache_has_event_objects():
    t = ferrolm.RadixCache(backend="rust", enable_kv_events=True)
    t.insert([1], [1])
    [ev] = t.take_events()
    assert isinstance(ev, ferrolm.kv_events.BlockStored)


# ---------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------


def conversations(seed: int = 0):
    """Chat traffic: a few long system prompts, many conversations, each growing over
    several turns; every turn caches the whole conversation so far."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 128_000, size=int(rng.integers(800, 2500))) for _ in range(6)]
    for c in range(600):
        convo = prompts[c % len(prompts)]
        for _turn in range(int(rng.integers(1, 6))):
            user = rng.integers(0, 128_000, size=int(rng.integers(20, 200)))
            reply = rng.integers(0, 128_000, size=int(rng.integers(50, 400)))
            convo = np.concatenate([convo, user, reply])
            yield convo.astype(np.int32)


def test_memory_per_cached_token_at_page_size_1():
    t = make_tree("rust")
    inserted = 0
    next_slot = 0
    for seq in conversations():
        kv = np.arange(next_slot, next_slot + len(seq), dtype=np.int32)
        next_slot += len(seq)
        t.insert(seq, kv)
        inserted += len(seq)
    cached = t.total_size()
    t.check_invariants()
    assert cached > 300_000
    assert inserted > 3 * cached, "the workload should share most of what it inserts"
    per_token = t.memory_bytes() / cached
    # a token and its slot are 8 bytes; at most 32 bytes per token in all
    assert 8 <= per_token <= 32, f"{per_token:.1f} bytes per cached token"


def test_memory_shrinks_back_after_eviction():
    t = make_tree("rust")
    empty = t.memory_bytes()
    for i, seq in enumerate(conversations(seed=1)):
        t.insert(seq, np.arange(len(seq), dtype=np.int32) + 10_000 * i)
        if i == 20:
            break
    full = t.memory_bytes()
    assert full >= empty + 8 * t.total_size()
    t.evict(10**9)
    assert t.total_size() == 0
    assert t.memory_bytes() < full


# ---------------------------------------------------------------------------------------
# the bench hook behind the cold-read floor
# ---------------------------------------------------------------------------------------


def test_read_tokens_reads_like_match_prefix_and_leaves_the_tree_alone():
    t = make_tree("rust")
    t.insert([5, 6, 7], [1, 2, 3])
    before = (t.total_size(), t.num_nodes(), t.evictable_size())
    for tokens in (np.array([5, 6, 7, 8], dtype=np.int32), np.array([5, 6], dtype=np.uint32), [5, 6, 7], []):
        assert t._read_tokens(tokens) == len(tokens)
    assert (t.total_size(), t.num_nodes(), t.evictable_size()) == before
    for bad in (np.array([1, -2], dtype=np.int32), [1, -2], "abc", np.zeros((2, 2), dtype=np.int32)):
        with pytest.raises(ferrolm.errors.InvalidInputError):
            t._read_tokens(bad)
        with pytest.raises(ferrolm.errors.InvalidInputError):
            t.match_prefix(bad)
