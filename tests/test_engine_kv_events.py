"""KV events from the engine (``Engine(enable_kv_events=True)``): the core records them
over blocks of ``kv_event_block_size`` tokens, hashed as the Python twin hashes; the
server's loop hands each step's events to the publisher before it sends the step's
deltas, and sends them only once the earlier steps' events are out; aborts and flushes
outside a step are published too. The wire format is in ``test_kv_events_wire.py``."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import make_engine
from ferrolm import SamplingParams
from ferrolm.errors import InvalidInputError
from ferrolm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, chain_hashes, namespace_seed
from ferrolm.kv_publisher import KvEventPublisher
from ferrolm.server.engine_process import EngineLoop

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=5, ignore_eos=True)
BLOCK = 4


def test_events_cover_whole_blocks_hashed_as_the_twin_does(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=256, enable_kv_events=True, kv_event_block_size=BLOCK)
    assert engine.core.kv_events_enabled and engine.core.kv_event_block_size == BLOCK
    prompt = list(range(500, 513))  # 13 tokens: 3 whole blocks
    [r] = engine.generate([prompt], GREEDY)
    events = engine.take_kv_events()
    assert all(isinstance(e, BlockStored) for e in events)
    tokens = [t for e in events for t in e.token_ids]
    kv_len = len(prompt) + len(r.token_ids) - 1
    assert tokens == (prompt + r.token_ids)[:kv_len // BLOCK * BLOCK]
    assert [h for e in events for h in e.block_hashes] == chain_hashes(namespace_seed(None), tokens, BLOCK)
    # a salted request: its own chain
    rid = engine.submit(prompt, GREEDY, namespace="tenant-a")
    while engine.has_work():
        engine.step()
    salted = engine.take_kv_events()
    assert salted[0].namespace == "tenant-a" and salted[0].parent_block_hash is None
    assert list(salted[0].block_hashes[:3]) == chain_hashes(namespace_seed("tenant-a"), prompt[:12], BLOCK)
    assert rid >= 0
    # a flush is one clear
    assert engine.core.flush_cache()
    assert engine.take_kv_events() == [AllBlocksCleared()]


def test_events_are_off_unless_asked_and_a_bad_block_size_names_its_field(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=256)
    engine.generate([list(range(500, 513))], GREEDY)
    assert not engine.core.kv_events_enabled and engine.take_kv_events() == []
    for bad in (0, 1 << 21):
        with pytest.raises(InvalidInputError) as e:
            make_engine(tiny, kv_capacity=256, enable_kv_events=True, kv_event_block_size=bad)
        assert e.value.field == "kv_event_block_size"


class RecordingPublisher(KvEventPublisher):
    """Stands in for ``KvEventPublisher`` (its loop-side calls, ``publish_from`` and
    ``wait_earlier``, as they are; no thread, no socket): records the calls in order, with
    the deltas the loop sends, in one log."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:  # no super().__init__: no thread
        self.log, self.on_change = log, None
        self.queued = self.handled = self.sent = self.dropped = self.replays = self.late = 0

    def publish(self, raw: list[Any], ts: float | None = None) -> bool:
        self.queued += 1
        self.log.append(("publish", self.queued, raw))
        return True

    def wait_handled(self, count: int, timeout: float) -> bool:
        self.log.append(("wait", count))
        return True


class LoggingConn:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def send(self, msg: tuple[Any, ...]) -> None:
        self.log.append(("send", msg[0], msg))


def test_the_loop_publishes_a_steps_events_before_its_deltas_and_waits_for_the_earlier_ones(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=64, enable_kv_events=True, kv_event_block_size=BLOCK)
    log: list[tuple[Any, ...]] = []
    loop = EngineLoop(engine, LoggingConn(log), kv_publisher=RecordingPublisher(log))
    try:
        for i, rid in enumerate((1, 2, 3)):  # 3 x 25 tokens through a 64-slot pool: eviction
            loop._handle(("submit", [rid], list(range(600 + 40 * i, 625 + 40 * i)), GREEDY, {}))
            while loop._busy():
                loop._step()
                loop._publish_kv_events()
        published = [e for e in log if e[0] == "publish"]
        assert published, "the prefills and finishes store blocks"
        assert [ev for e in published for ev in e[2] if ev[0] == "removed"], "the small pool evicts"
        sends = [i for i, e in enumerate(log) if e[0] == "send" and e[1] == "deltas"]
        assert sends
        for i in sends:
            # right before a step's deltas: a wait for every batch queued before the step;
            # the step's own batch, if any, is queued just before that wait
            assert log[i - 1][0] == "wait", log[i - 3:i + 1]
            waited_for = log[i - 1][1]
            queued_so_far = sum(1 for e in log[:i] if e[0] == "publish")
            own = 1 if log[i - 2][0] == "publish" else 0
            assert waited_for == queued_so_far - own
        # a flush outside a step: its clear is queued before the caller hears back
        loop._call(9, "flush_cache")
        assert log[-2][0] == "publish" and log[-2][2] == [("cleared",)]
        assert log[-1][0] == "send" and log[-1][2] == ("reply", 9, True, True)
        loop._call(10, "stats")
        stats = log[-1][2][3]
        assert stats["kv_events_queued"] == len([e for e in log if e[0] == "publish"]) and "kv_events_late" in stats
    finally:
        loop.close()


def test_an_abort_outside_a_step_is_published_with_the_next_loop_pass(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=256, enable_kv_events=True, kv_event_block_size=BLOCK)
    log: list[tuple[Any, ...]] = []
    publisher = RecordingPublisher(log)
    loop = EngineLoop(engine, LoggingConn(log), kv_publisher=publisher)
    try:
        long = SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True)
        loop._handle(("submit", [1], list(range(700, 720)), long, {}))
        for _ in range(7):  # the prefill stores 5 blocks; the decode fills the 6th (no insert yet)
            loop._step()
        n = publisher.queued
        loop._handle(("abort", [1]))  # the core caches what the request computed
        loop._publish_kv_events()
        assert publisher.queued == n + 1
        [(kind, hashes, parent, tokens, *_)] = log[-1][2]
        assert kind == "stored" and len(hashes) == 1 and len(tokens) == BLOCK, "the block the decode filled"
        assert parent == chain_hashes(namespace_seed(None), list(range(700, 720)), BLOCK)[-1]
    finally:
        loop.close()


def test_event_objects_round_trip_from_the_raw_tuples(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=32, enable_kv_events=True, kv_event_block_size=BLOCK)
    engine.generate([list(range(800, 820))], GREEDY)
    engine.generate([list(range(900, 920))], GREEDY)  # evicts the first in a 32-slot pool
    events = engine.take_kv_events()
    assert any(isinstance(e, BlockRemoved) for e in events)
