"""``ferrolm bench tree``'s peer, SGLang's Rust tree core: where it is installed
(``make tree-peer``), the adapter replays the trace to the same match lengths as
ferrolm's tree and conserves KV slots; where it is not, the bench says why and goes on
with ferrolm's own figures (tested here either way)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import types
from typing import Any

import numpy as np
import pytest
from ferrolm.bench import tree as bench_tree
from ferrolm.bench import tree_peer
from ferrolm.bench.workload import WorkloadConfig, make_workload

PEER_MODULE, PEER_WHY = tree_peer.load()
needs_peer = pytest.mark.skipif(PEER_MODULE is None, reason=f"SGLang's tree core: {PEER_WHY}")


def args(**kw: object) -> argparse.Namespace:
    base = dict(no_peer=False, capacity=10**7, page_size=1, policy="lru")
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_missing_sglang_is_named_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    module, why = tree_peer.load()
    assert module is None
    assert "sglang is not installed" in why and "make tree-peer" in why


def test_the_bench_skips_an_absent_peer_with_its_reason(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(tree_peer, "load", lambda: (None, "sglang is not installed (make tree-peer)"))
    requests = make_workload(WorkloadConfig(conversations=2, seed=1))
    assert bench_tree.peer_result(args(), requests, []) is None
    assert "peer skipped: sglang is not installed (make tree-peer)" in capsys.readouterr().out
    # --no-peer: not even looked for
    monkeypatch.setattr(tree_peer, "load", lambda: pytest.fail("the peer was loaded under --no-peer"))
    assert bench_tree.peer_result(args(no_peer=True), requests, []) is None


def test_make_tree_names_why_the_peer_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tree_peer, "load", lambda: (None, "sglang is not installed (make tree-peer)"))
    with pytest.raises(RuntimeError, match="make tree-peer"):
        bench_tree.make_tree(tree_peer.PEER, 1, "lru")


@needs_peer
def test_the_peer_matches_as_ferrolm_does_on_the_trace() -> None:
    requests = make_workload(WorkloadConfig(conversations=30, seed=5))
    ours = bench_tree.replay("rust", requests, 10**7, 1, "lru")
    peer = bench_tree.replay(tree_peer.PEER, requests, 10**7, 1, "lru")
    assert len(peer["match_lengths"]) == len(requests)
    assert peer["match_lengths"] == ours["match_lengths"]
    assert any(n > 0 for n in peer["match_lengths"])
    assert peer["cached_tokens"] == ours["cached_tokens"]
    # its KV indices were read for every admitted request
    assert len(peer["kv_indices_ns"]) == len(requests)


@needs_peer
def test_the_peer_evicts_and_conserves_kv_slots_under_pressure() -> None:
    requests = make_workload(WorkloadConfig(conversations=30, seed=5))
    # replay raises if free + cached slots ever stop adding up to the capacity
    peer = bench_tree.replay(tree_peer.PEER, requests, 30_000, 1, "lru")
    assert len(peer["times"]["evict"]) > 0
    assert peer["cached_tokens"] <= 30_000


@needs_peer
def test_the_peer_returns_the_indices_it_was_given() -> None:
    assert PEER_MODULE is not None
    tree = tree_peer.SGLangTree(PEER_MODULE)
    tokens = np.arange(10, dtype=np.int32)
    slots = np.arange(100, 110, dtype=np.int32)
    assert tree.insert(tree.key_of(tokens), tree.value_of(slots, 0)) == 0
    m = tree.match_prefix(tree.key_of(np.array([0, 1, 2, 3, 99], dtype=np.int32)))
    assert m.length == 4
    assert m.kv_slots.tolist() == [100, 101, 102, 103]
    tree.lock(m.node)
    # the match split the node: only the unlocked tail can go
    assert sorted(tree.evict(10).tolist()) == list(range(104, 110))
    tree.unlock(m.node)
    assert sorted(tree.evict(10).tolist()) == [100, 101, 102, 103]
    assert tree.total_size() == 0


def test_the_by_length_table_puts_the_peer_beside_ferrolm(capsys) -> None:
    def fake(us: float) -> dict:
        ns = np.full(3, us * 1e3, dtype=np.int64)
        return {
            "times": {op: ns for op in bench_tree.TARGETS_US},
            "lengths": {op: np.array([1600, 1700, 1800]) for op in bench_tree.TARGETS_US},
        }

    rows, missed = bench_tree.by_prompt_length({"rust": fake(1.0), "python": fake(100.0), tree_peer.PEER: fake(2.5)})
    assert rows[2][f"match_prefix {tree_peer.PEER} p50_us"] == 2.5
    assert missed == []  # the targets are ferrolm's own
    bench_tree.print_by_prompt_length(rows, peer=True)
    out = capsys.readouterr().out
    header, target_row = out.splitlines()[0], out.splitlines()[3]
    assert header.count(tree_peer.PEER) == 2  # a match and an insert column
    assert target_row.startswith("1500-2000") and target_row.count("2.5x") == 2 and target_row.count("100.0x") == 2


class _FakeCore:
    """The calls ``SGLangTree`` makes of SGLang's ``RustUnifiedTreeCoreBinding``, kept by
    ferrolm's Python twin: the adapter and the bench's peer path run without SGLang."""

    def __init__(self, init: argparse.Namespace, components: list[int]) -> None:
        import torch
        from ferrolm.radix_cache import RadixCache

        assert components == [tree_peer.FULL] and init.device == "cpu"
        self._torch = torch
        self._tree = RadixCache(page_size=init.page_size, eviction_policy=init.eviction_policy, backend="python")
        self._nodes: dict[int, Any] = {}  # id -> the twin's node
        self._slots: dict[int, np.ndarray] = {}  # id -> the slots of the path to it
        self._insert: argparse.Namespace | None = None
        self._evict: int | None = None
        self.locks = 0

    def root_node_handle(self) -> int:
        return 0

    def match_prefix(self, params: argparse.Namespace) -> argparse.Namespace:
        m = self._tree.match_prefix(np.frombuffer(params.key, dtype=np.int64).astype(np.int32))
        node = id(m.node) if m.length else 0
        self._nodes[node], self._slots[node] = m.node, m.kv_slots
        return argparse.Namespace(device_prefix_len=m.length, last_device_node_id=node)

    def collect_full_device_indices(self, node: int, root: int) -> object:
        assert root == 0
        return self._torch.from_numpy(self._slots[node].astype(np.int64))

    def begin_insert(self, params: argparse.Namespace) -> argparse.Namespace:
        assert self._insert is None
        self._insert = params
        return argparse.Namespace(result=None)  # one resume, as a long insert takes

    def resume_insert(self) -> argparse.Namespace:
        p = self._insert
        assert p is not None
        tokens = np.frombuffer(p.key, dtype=np.int64).astype(np.int32)
        prefix = self._tree.insert(tokens, p.value.numpy().astype(np.int32))
        return argparse.Namespace(result=argparse.Namespace(prefix_len=prefix))

    def end_insert(self) -> None:
        self._insert = None

    def inc_lock_ref(self, node: int) -> argparse.Namespace:
        self._tree.lock(self._nodes[node])
        self.locks += 1
        return argparse.Namespace(skipped_lock_components=[], component_lock_uuids={tree_peer.FULL: node})

    def dec_lock_ref(self, node: int, params: argparse.Namespace, _: bool) -> None:
        assert params.node_id == node and params.component_lock_uuids == {tree_peer.FULL: node}
        self._tree.unlock(self._nodes[node])
        self.locks -= 1

    def evict_device_start(self, component: int, num_tokens: int) -> None:
        self._evict = num_tokens

    def evict_device_next_node(self, component: int, tracker: dict[int, int]) -> argparse.Namespace:
        # the first step frees what is asked for; the next makes no progress
        want, self._evict = self._evict, 0
        freed = self._tree.evict(want) if want else np.empty(0, dtype=np.int32)
        frees = {component: [self._torch.from_numpy(freed.astype(np.int64))]} if len(freed) else {}
        return argparse.Namespace(
            node_id=None, made_progress=bool(len(freed)), new_device_frees=frees, tracker={component: len(freed)}
        )

    def evict_device_leaf(self, node: int) -> argparse.Namespace:
        raise AssertionError("the fake names no node to evict")

    def evict_device_end(self, component: int) -> None:
        self._evict = None

    def total_size(self) -> list[int]:
        return [self._tree.total_size()]


def fake_sglang() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        TreeCoreInitParamsBinding=argparse.Namespace,
        RustUnifiedTreeCoreBinding=_FakeCore,
        MatchParamsBinding=argparse.Namespace,
        InsertParamsBinding=argparse.Namespace,
        DecLockRefParamsBinding=argparse.Namespace,
    )


def test_the_bench_drives_a_peer_with_sglangs_interface(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # the adapter and the bench's peer rows, run on a fake of SGLang's binding (ferrolm's
    # Python twin behind SGLang's calls), so they are tested where SGLang is not installed
    pytest.importorskip("torch", reason="the adapter hands SGLang's binding torch tensors")
    monkeypatch.setattr(tree_peer, "load", lambda: (fake_sglang(), "0.0-fake"))
    requests = make_workload(WorkloadConfig(conversations=30, seed=5))
    ours = bench_tree.replay("rust", requests, 30_000, 1, "lru")
    peer = bench_tree.peer_result(args(capacity=30_000), requests, ours["match_lengths"])
    assert peer is not None
    out = capsys.readouterr().out
    n = len(requests) - peer["skipped"]
    assert f"the same match length as ferrolm's on {n} of {n} requests" in out
    assert peer["match_lengths"] == ours["match_lengths"] and peer["cached_tokens"] == ours["cached_tokens"]
    assert len(peer["times"]["evict"]) > 0 and len(peer["kv_indices_ns"]) == n
    rows, _ = bench_tree.by_prompt_length({"rust": ours, tree_peer.PEER: peer})
    assert any(r[f"match_prefix {tree_peer.PEER} p50_us"] is not None for r in rows)


def test_the_adapter_hands_back_receipts_and_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="the adapter hands SGLang's binding torch tensors")
    tree = tree_peer.SGLangTree(fake_sglang())  # type: ignore[arg-type]
    tokens = np.arange(10, dtype=np.int32)
    assert tree.insert(tree.key_of(tokens), tree.value_of(np.arange(100, 110, dtype=np.int32), 0)) == 0
    m = tree.match_prefix(tree.key_of(tokens[:4]))
    assert m.length == 4 and m.kv_slots.tolist() == [100, 101, 102, 103]
    tree.lock(m.node)
    assert tree._core.locks == 1
    tree.unlock(m.node)
    assert tree._core.locks == 0
    assert sorted(tree.evict(100).tolist()) == list(range(100, 110))
    assert tree.total_size() == 0
    with pytest.raises(ValueError, match="no eviction policy"):
        tree_peer.SGLangTree(fake_sglang(), eviction_policy="random")  # type: ignore[arg-type]


def test_the_whole_bench_prints_and_records_the_peer(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path) -> None:
    pytest.importorskip("torch", reason="the adapter hands SGLang's binding torch tensors")
    monkeypatch.setattr(tree_peer, "load", lambda: (fake_sglang(), "0.0-fake"))
    parser = argparse.ArgumentParser()
    bench_tree.add_parser(parser.add_subparsers())
    out_json = tmp_path / "tree.json"
    a = parser.parse_args(
        ["tree", "--conversations", "30", "--seed", "5", "--capacity", "30000", "--json", str(out_json)]
    )
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert "peer: sglang 0.0-fake's Rust tree core" in out
    for op in ("match_prefix", "insert", "evict", "lock+unlock", "request cycle"):
        assert any(line.startswith(op) and "(sglang / rust)" in line for line in out.splitlines()), op
    # match and indices side by side in each way of making the arguments
    for mode in ("cold", "fresh"):
        assert any(
            line.startswith("sglang's match returns no KV indices") and f"arguments {mode}: sglang " in line
            for line in out.splitlines()
        ), mode
    report = json.loads(out_json.read_text())
    assert report["ops"]["match_prefix"]["sglang"]["n"] > 0
    assert report["peer_match_and_indices_p50_us"] > 0
    assert report["peer_match_and_indices_p50_us_fresh"] > 0
    assert any(row.get("match_prefix sglang p50_us") for row in report["by_prompt_length"])
    # a by-length table for each way of making the arguments, the peer's in both
    assert "by prompt length, arguments cold" in out and "by prompt length, arguments fresh" in out
    assert (
        "sglang 0.0-fake's Rust tree core (its rust_tree_core extension, called as its scheduler's cache "
        "calls it), arguments fresh" in out
    )
    assert any(row.get("match_prefix sglang p50_us") for row in report["by_prompt_length_fresh"])
