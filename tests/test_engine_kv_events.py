"""KV events from the engine (``Engine(enable_kv_events=True)``): the core records them
over blocks of ``kv_event_block_size`` tokens, hashed as the Python twin hashes; the
step loop (``ferrolm.step_loop``) publishes each step's events after its commit, and lets
a step's outputs go out only once the earlier steps' events are out; aborts and flushes
outside a step are published in the pass that ran them. The wire format is in ``test_kv_events_wire.py``."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_engine
from ferrolm import SamplingParams
from ferrolm.errors import InvalidInputError
from ferrolm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, chain_hashes, namespace_seed
from ferrolm.kv_publisher import KvEventPublisher
from ferrolm.step_loop import StepLoop

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
    assert tokens == (prompt + r.token_ids)[: kv_len // BLOCK * BLOCK]
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


class LoggingFrontend:
    """Stands in for ``_core.Frontend`` on the step loop's side: ``drain`` runs the calls
    queued by the test on the core (as the front end's ingress does at the start of a pass),
    the commits commit on the core and log that the step's outputs went out, in the same
    log as the publisher's calls."""

    def __init__(self, log: list[tuple[Any, ...]], loop_stops: Any) -> None:
        self.log, self.loop_stops = log, loop_stops
        self.inbox: list[tuple[str, Any]] = []

    def drain(self, core: Any) -> int:
        calls, self.inbox = self.inbox, []
        for name, action in calls:
            self.log.append(("call", name, action(core)))
        return len(calls)

    def wait(self, timeout: float) -> bool:  # idle: the test has no more work for the loop
        self.loop_stops()
        return False

    def _out(self, out: Any) -> Any:
        self.log.append(("send", len(out.rids)))
        return out.rids

    def commit(self, core: Any, logits: Any, forward_s: float = 0.0, forward_cpu_s: float = 0.0) -> Any:
        return self._out(core.commit(logits))

    def commit_tokens(
        self, core: Any, tokens: Any, forward_s: float = 0.0, forward_cpu_s: float = 0.0, **draws: Any
    ) -> Any:
        return self._out(core.commit_tokens(tokens, **draws))

    def fail_step(self, core: Any, message: str) -> Any:
        return self._out(core.fail_step(message))

    def take_outputs(self, core: Any) -> Any:
        return self._out(core.take_outputs())

    def note_kv_events(self, *counts: int) -> None:
        pass


def kv_loop(engine: Any, log: list[tuple[Any, ...]], publisher: Any) -> tuple[StepLoop, LoggingFrontend]:
    loop: StepLoop
    frontend = LoggingFrontend(log, lambda: loop.stopping.set())
    loop = StepLoop(engine.core, engine.runner, frontend=frontend, kv_publisher=publisher)  # type: ignore[arg-type]
    return loop, frontend


def run_until_idle(loop: StepLoop) -> None:
    loop.stopping.clear()
    loop.run()


def test_the_loop_publishes_a_steps_events_before_its_outputs_and_waits_for_the_earlier_ones(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=64, enable_kv_events=True, kv_event_block_size=BLOCK)
    log: list[tuple[Any, ...]] = []
    loop, frontend = kv_loop(engine, log, RecordingPublisher(log))
    for i, rid in enumerate((1, 2, 3)):  # 3 x 25 tokens through a 64-slot pool: eviction
        prompt = list(range(600 + 40 * i, 625 + 40 * i))
        frontend.inbox.append(("submit", lambda core, rid=rid, p=prompt: core.submit([rid], p, **GREEDY.core_kwargs())))
        run_until_idle(loop)
    published = [e for e in log if e[0] == "publish"]
    assert published, "the prefills and finishes store blocks"
    assert [ev for e in published for ev in e[2] if ev[0] == "removed"], "the small pool evicts"
    sends = [i for i, e in enumerate(log) if e[0] == "send"]
    assert sends
    for i in sends:
        # right before a step's outputs: a wait for every batch queued before the step;
        # the step's own batch is queued after its outputs
        assert log[i - 1][0] == "wait", log[i - 3 : i + 1]
        assert log[i - 1][1] == sum(1 for e in log[:i] if e[0] == "publish")
    # a flush outside a step: its clear is queued in the same pass, before the loop waits
    frontend.inbox.append(("flush", lambda core: core.flush_cache()))
    run_until_idle(loop)
    assert log[-2] == ("call", "flush", True)
    assert log[-1][0] == "publish" and log[-1][2] == [("cleared",)]


def test_an_abort_outside_a_step_is_published_with_the_next_loop_pass(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=256, enable_kv_events=True, kv_event_block_size=BLOCK)
    log: list[tuple[Any, ...]] = []
    publisher = RecordingPublisher(log)
    loop, frontend = kv_loop(engine, log, publisher)
    long = SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True)
    engine.core.submit([1], list(range(700, 720)), **long.core_kwargs())
    for _ in range(7):  # the prefill stores 5 blocks; the decode fills the 6th (no insert yet)
        loop.step(engine.core.schedule())
        loop._publish_kv_events()
    n = publisher.queued
    frontend.inbox.append(("abort", lambda core: core.abort(1)))  # the core caches what it computed
    run_until_idle(loop)
    assert publisher.queued == n + 1
    [(kind, hashes, parent, tokens, *_)] = [e for e in log if e[0] == "publish"][-1][2]
    assert kind == "stored" and len(hashes) == 1 and len(tokens) == BLOCK, "the block the decode filled"
    assert parent == chain_hashes(namespace_seed(None), list(range(700, 720)), BLOCK)[-1]


def test_event_objects_round_trip_from_the_raw_tuples(tiny: Any) -> None:
    engine = make_engine(tiny, kv_capacity=32, enable_kv_events=True, kv_event_block_size=BLOCK)
    engine.generate([list(range(800, 820))], GREEDY)
    engine.generate([list(range(900, 920))], GREEDY)  # evicts the first in a 32-slot pool
    events = engine.take_kv_events()
    assert any(isinstance(e, BlockRemoved) for e in events)
