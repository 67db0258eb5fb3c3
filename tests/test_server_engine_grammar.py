"""The engine loop compiles structured-output grammars on worker threads: a request
waiting for its grammar does not stall the others. Driven in-process: a real
``ferrolm.Engine("tiny")`` behind an ``EngineLoop`` on a thread, talked to over a real
``multiprocessing.Pipe``, with the compile made slow on purpose (a sleep, which, like
the Rust compile, releases the GIL)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import ferrolm
from ferrolm.engine import Delta
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.engine_process import EngineLoop

COMPILE_DELAY_S = 1.5
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


class Driver:
    """The API side of the pipe, by hand: sends messages, records what comes back with
    the time it arrived."""

    def __init__(self, loop: EngineLoop, conn: Any) -> None:
        self.loop = loop
        self.conn = conn
        self.received: list[tuple[float, tuple[Any, ...]]] = []

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def read_until(self, done: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the engine loop did not answer in time"
            if self.conn.poll(0.1):
                self.received.append((time.monotonic(), self.conn.recv()))

    def deltas(self, rid: int) -> list[tuple[float, Delta]]:
        return [(t, d) for t, m in self.received if m[0] == "deltas" for d in m[1] if d.rid == rid]

    def finished(self, rid: int) -> Delta | None:
        return next((d for _, d in self.deltas(rid) if d.finish_reason is not None), None)

    def answers(self) -> list[tuple[Any, ...]]:
        return [m for _, m in self.received if m[0] in ("submitted", "rejected")]

    def index_of(self, pred: Any) -> int:
        return next(i for i, (_, m) in enumerate(self.received) if pred(m))


@pytest.fixture(scope="module")
def engine() -> ferrolm.Engine:
    return ferrolm.Engine("tiny")


@pytest.fixture
def driver(engine: ferrolm.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    compile_grammar = engine.grammar

    def slow_grammar(params: SamplingParams) -> Any:
        if params.json_schema is not None:
            time.sleep(COMPILE_DELAY_S)
        return compile_grammar(params)

    monkeypatch.setattr(engine, "grammar", slow_grammar)
    ours, theirs = multiprocessing.Pipe(duplex=True)
    loop = EngineLoop(engine, theirs)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    d = Driver(loop, ours)
    try:
        yield d
    finally:
        d.send("call", -1, "abort_all")
        d.send("shutdown")
        thread.join(timeout=30)
        assert not thread.is_alive()
        # nothing leaked into the core for the next test
        engine.step()
        assert not engine.has_work()


def encode(engine: ferrolm.Engine, text: str) -> Any:
    return engine.tokenizer.encode(text)


def test_a_stream_keeps_decoding_while_heavy_grammars_compile(engine: ferrolm.Engine, driver: Driver) -> None:
    long = SamplingParams(max_new_tokens=3000, ignore_eos=True, temperature=0)
    driver.send("submit", [0], encode(engine, "a long story"), long, {})
    driver.read_until(lambda: len(driver.deltas(0)) >= 3)
    sent_at = time.monotonic()
    structured = SamplingParams(max_new_tokens=32, temperature=0, json_schema=SCHEMA)
    for rid in (1, 2, 3, 4):
        driver.send("submit", [rid], encode(engine, f"answer {rid}"), structured, {})
    driver.read_until(lambda: all(driver.finished(rid) for rid in (1, 2, 3, 4)))
    compiles_done = max(t for t, m in driver.received if m[0] == "submitted" and m[1] != 0)
    # four compiles on two workers: at least two rounds of the delay
    assert compiles_done - sent_at >= 2 * COMPILE_DELAY_S
    # meanwhile the stream kept receiving tokens, without a gap anywhere near a compile
    times = [sent_at] + [t for t, d in driver.deltas(0) if sent_at <= t <= compiles_done] + [compiles_done]
    assert len(times) > 10, "the stream stalled while grammars compiled"
    assert max(b - a for a, b in zip(times, times[1:])) < COMPILE_DELAY_S / 3
    assert driver.finished(0) is None
    # every structured request was answered once, before its first delta, and ran to a
    # valid document
    for rid in (1, 2, 3, 4):
        assert [m for m in driver.answers() if m[1] == rid] == [("submitted", rid)]
        answered = driver.index_of(lambda m, rid=rid: m == ("submitted", rid))
        first = driver.index_of(lambda m, rid=rid: m[0] == "deltas" and any(d.rid == rid for d in m[1]))
        assert answered < first
        text = "".join(d.text for _, d in driver.deltas(rid))
        assert driver.finished(rid).finish_reason == "stop", text  # type: ignore[union-attr]
        assert isinstance(json.loads(text)["ok"], bool)
    # each one's wait for its grammar is in the metrics (the loop measures it)
    driver.send("call", 7, "metrics")
    driver.read_until(lambda: any(m[0] == "reply" for _, m in driver.received))
    [(_, reply)] = [(t, m) for t, m in driver.received if m[0] == "reply"]
    assert reply[2] is True
    waits = reply[3]["latencies"]["grammar_s"]
    assert len(waits) == 4 and min(waits) >= COMPILE_DELAY_S * 0.9


def test_an_abort_while_compiling_finishes_the_request_cleanly(engine: ferrolm.Engine, driver: Driver) -> None:
    structured = SamplingParams(max_new_tokens=32, temperature=0, json_schema=SCHEMA, n=3)
    driver.send("submit", [10, 11, 12], encode(engine, "aborted early"), structured, {})
    driver.send("submit", [20, 21], encode(engine, "one sample aborted"), dataclass_n(structured, 2), {})
    driver.send("abort", [10, 11, 12])
    driver.send("abort", [21])  # a later sample only: the first still runs
    driver.read_until(lambda: all(driver.finished(rid) for rid in (10, 11, 12, 20, 21)))
    for rid in (10, 11, 12, 21):
        d = driver.finished(rid)
        assert d is not None and d.finish_reason == "abort" and not d.token_ids
    assert driver.answers().count(("submitted", 10)) == 1
    assert driver.index_of(lambda m: m == ("submitted", 10)) < driver.index_of(
        lambda m: m[0] == "deltas" and any(d.rid == 10 for d in m[1]))
    assert driver.finished(20).finish_reason == "stop"  # type: ignore[union-attr]
    # the aborted compile ends later: nothing more comes for it, nothing is left behind
    time.sleep(COMPILE_DELAY_S * 1.5)
    driver.read_until(lambda: not driver.conn.poll(0.5))
    assert driver.answers().count(("submitted", 10)) == 1
    assert [d for _, d in driver.deltas(10)] == [driver.finished(10)]
    assert not driver.loop.compiling
    # asked through the loop: the core belongs to the loop's thread while it runs (a call
    # from here could meet one of the loop's and fail with "Already borrowed")
    driver.send("call", 7, "stats")
    driver.read_until(lambda: any(m[:2] == ("reply", 7) for _, m in driver.received))
    [reply] = [m for _, m in driver.received if m[:2] == ("reply", 7)]
    assert reply[2] is True and reply[3]["running"] == 0 and reply[3]["waiting"] == 0


def test_a_schema_that_does_not_compile_is_rejected_after_the_compile(engine: ferrolm.Engine, driver: Driver) -> None:
    bad = SamplingParams(max_new_tokens=8, json_schema={"type": "no-such-type"})
    driver.send("submit", [30], encode(engine, "bad"), bad, {})
    driver.send("submit", [31], encode(engine, "plain"), SamplingParams(max_new_tokens=2), {})
    driver.read_until(lambda: len(driver.answers()) == 2 and driver.finished(31) is not None)
    # the plain request did not wait for the compile
    assert driver.answers()[0] == ("submitted", 31)
    rejected = driver.answers()[1]
    assert rejected[:2] == ("rejected", 30) and "no-such-type" in rejected[2]
    assert rejected[3] == "json_schema" and rejected[4] is True  # the client's fault: a 400


def test_the_loop_sleeps_while_only_compiles_are_pending(engine: ferrolm.Engine, driver: Driver,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    turns = 0
    submit_compiled = driver.loop._submit_compiled

    def counted() -> None:
        nonlocal turns
        turns += 1
        submit_compiled()

    monkeypatch.setattr(driver.loop, "_submit_compiled", counted)
    structured = SamplingParams(max_new_tokens=4, temperature=0, json_schema=SCHEMA)
    driver.send("submit", [40], encode(engine, "wait"), structured, {})
    driver.read_until(lambda: ("submitted", 40) in driver.answers())
    # woken by the pipe, the heartbeat (every 0.5 s) and the compile's end: a handful of
    # turns, not a spin
    assert turns < 5 * COMPILE_DELAY_S / 0.5 + 10, turns
    # and it said it is alive while it waited
    alive = [t for t, m in driver.received if m == ("alive",)]
    assert len(alive) >= 2


def dataclass_n(params: SamplingParams, n: int) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(params, n=n)
