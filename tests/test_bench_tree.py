"""``ferrolm bench tree``'s table by prompt length: which calls land in which row, and
that a target the 1,500-2,000 row misses is reported. (What the figures are is the
benchmark's business, never a test's.)"""

from __future__ import annotations

import numpy as np
import pytest
from ferrolm.bench.tree import LENGTH_BUCKETS, TARGETS_US, by_prompt_length, replay
from ferrolm.bench.workload import WorkloadConfig, make_workload


def fake(lengths: list[int], us: list[float]) -> dict:
    ns = np.array([u * 1e3 for u in us], dtype=np.int64)
    return {"times": {op: ns for op in TARGETS_US}, "lengths": {op: np.array(lengths) for op in TARGETS_US}}


def test_rows_split_calls_by_prompt_length_and_flag_missed_targets():
    rust = fake([900, 1600, 1700, 1800, 5000], [0.5, 1.0, 1.2, 9.0, 2.0])
    python = fake([900, 1600, 1700, 1800, 5000], [50, 100, 120, 900, 200])
    rows, missed = by_prompt_length({"rust": rust, "python": python})
    assert [tuple(r["prompt_tokens"]) for r in rows] == list(LENGTH_BUCKETS)
    assert [r["n"] for r in rows] == [1, 0, 3, 0, 1]
    target_row = rows[2]
    assert target_row["match_prefix rust p50_us"] == 1.2
    assert target_row["match_prefix python p50_us"] == 120
    assert rows[1]["insert rust p50_us"] is None
    assert missed == []  # match 1.2 < 1.5 and insert 1.2 < 3
    slow = fake([1600, 1700, 1800], [2.0, 4.0, 4.0])
    _, missed = by_prompt_length({"rust": slow, "python": slow})
    assert len(missed) == 2 and "match_prefix" in missed[0] and "insert" in missed[1]


def test_replay_records_a_prompt_length_per_timed_call():
    requests = make_workload(WorkloadConfig(conversations=4, seed=3))
    result = replay("rust", requests, capacity=20_000, page_size=1, policy="slru")
    for op in TARGETS_US:
        assert len(result["lengths"][op]) == len(result["times"][op]) == len(requests)
        assert sorted(result["lengths"][op].tolist()) == sorted(len(r.prompt) for r in requests)


def test_read_floor_replay_times_one_prompt_read_per_request():
    requests = make_workload(WorkloadConfig(conversations=4, seed=3))
    result = replay("rust", requests, capacity=20_000, page_size=1, policy="lru", read_floor=True)
    assert len(result["times"]["prompt read"]) == len(result["times"]["match_prefix"]) == len(requests)
    assert sorted(result["lengths"]["prompt read"].tolist()) == sorted(len(r.prompt) for r in requests)


def test_fresh_arguments_replay_the_same_workload_to_the_same_outcome():
    # arguments made just before each call: the same matches and the same tree as with
    # arguments made before the replay, and a timed call per request
    requests = make_workload(WorkloadConfig(conversations=4, seed=3))
    cold = replay("rust", requests, capacity=20_000, page_size=1, policy="lru", arguments="cold")
    fresh = replay("rust", requests, capacity=20_000, page_size=1, policy="lru", arguments="fresh")
    assert fresh["match_lengths"] == cold["match_lengths"]
    assert fresh["cached_tokens"] == cold["cached_tokens"]
    for op in TARGETS_US:
        assert len(fresh["times"][op]) == len(fresh["lengths"][op]) == len(requests)
    twin = replay("python", requests, capacity=20_000, page_size=1, policy="lru", arguments="fresh")
    assert twin["match_lengths"] == cold["match_lengths"]


def test_an_unknown_arguments_mode_is_refused():
    requests = make_workload(WorkloadConfig(conversations=1, seed=3))
    with pytest.raises(ValueError, match="arguments must be one of"):
        replay("rust", requests, capacity=20_000, page_size=1, policy="lru", arguments="lukewarm")


def test_the_missed_targets_name_the_arguments_mode():
    slow = fake([1600, 1700, 1800], [2.0, 4.0, 4.0])
    _, missed = by_prompt_length({"rust": slow, "python": slow}, label="arguments fresh")
    assert len(missed) == 2 and all(m.endswith("(arguments fresh)") for m in missed)
