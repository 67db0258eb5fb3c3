"""A failed forward (the runner raises) ends its step's requests with an error and leaves
the engine as if the step never ran: nothing unwritten reaches the prefix cache, the next
request with the same prompt gets the output of a clean engine, and every delta reaches
whoever waits for it (``generate``, ``stream``, ``step()``; the server runs the same step
loop, ``ferrolm.step_loop``, whose failures over HTTP are in ``test_server_step_loop.py``).
Errors carry a kind (``Delta.error_kind``) besides their message. ``n > 1`` samples are
the core's: they share the first sample's prefill and end on their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from ferrolm import SamplingParams
from ferrolm.engine import Delta, Engine
from ferrolm.model import ForwardBatch, LoadedModel, NumpyRunner

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
PROMPT = "a failed step must not poison the cache"
KV = 512


class FailingRunner(NumpyRunner):
    """Raises ``exc`` on the listed forward calls (1-based), before writing any KV."""

    def __init__(self, tiny: LoadedModel, fail_on: set[int], exc: type[BaseException] = RuntimeError) -> None:
        super().__init__(tiny.config, tiny.weights, KV)
        self.calls = 0
        self.fail_on = fail_on
        self.exc = exc

    def forward(self, batch: ForwardBatch, *, all_logits: bool = False) -> np.ndarray:
        self.calls += 1
        if self.calls in self.fail_on:
            raise self.exc(f"injected failure on call {self.calls}")
        return super().forward(batch, all_logits=all_logits)


def failing(tiny: LoadedModel, fail_on: set[int], exc: type[BaseException] = RuntimeError, **kw: Any) -> Engine:
    return Engine(tiny, kv_capacity=KV, runner=FailingRunner(tiny, fail_on, exc), **kw)


@pytest.fixture(scope="module")
def clean(tiny: LoadedModel) -> list[int]:
    [r] = Engine(tiny, kv_capacity=KV).generate(PROMPT, GREEDY)
    return r.token_ids


def drain(engine: Engine) -> list[Delta]:
    out = []
    while engine.has_work():
        out += engine.step()
    return out


@pytest.mark.parametrize("fail_on", [1, 3], ids=["prefill", "decode"])
def test_generate_sees_the_error_and_the_next_request_gets_clean_output(
    tiny: LoadedModel, clean: list[int], fail_on: int
) -> None:
    engine = failing(tiny, {fail_on})
    [r] = engine.generate(PROMPT, GREEDY)
    assert (r.finish_reason, r.error_kind) == ("error", "step_failed")
    assert r.error is not None and f"injected failure on call {fail_on}" in r.error
    assert r.token_ids == clean[: fail_on - 1], "the tokens before the failed step were delivered"
    engine.core.check_invariants()
    assert engine.core.stats()["failed_steps"] == 1
    prompt_len = len(engine.tokenizer.encode(PROMPT))
    # the same prompt again: cache hits only on KV that was written, the clean output
    [again] = engine.generate(PROMPT, GREEDY)
    assert again.finish_reason == "length" and again.error_kind is None
    assert again.token_ids == clean
    assert again.cached_tokens == (0 if fail_on == 1 else prompt_len - 1)
    stats = engine.core.stats()
    assert stats["kv_used"] == stats["cached_tokens"], stats


def test_stream_and_step_deliver_the_failed_step(tiny: LoadedModel, clean: list[int]) -> None:
    engine = failing(tiny, {2})
    queued = engine.submit(PROMPT, GREEDY)
    deltas = list(engine.stream("another prompt", GREEDY))
    assert deltas[-1].finish_reason == "error" and deltas[-1].error_kind == "step_failed"
    # the submitted request was in the same step: its error comes out of step()
    mine = [d for d in drain(engine) if d.rid == queued]
    assert [d.finish_reason for d in mine][-1] == "error"
    assert mine[-1].error_kind == "step_failed"
    [again] = engine.generate(PROMPT, GREEDY)
    assert again.token_ids == clean
    engine.core.check_invariants()


def test_an_interrupt_in_the_forward_leaves_the_engine_consistent(tiny: LoadedModel, clean: list[int]) -> None:
    engine = failing(tiny, {2}, KeyboardInterrupt)
    queued = engine.submit("queued", GREEDY)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPT, GREEDY)
    engine.core.check_invariants()
    # the queued request's error delta waits for step(); nothing else is left running
    mine = [d for d in drain(engine) if d.rid == queued]
    assert mine[-1].finish_reason == "error"
    assert engine.core.stats()["running"] == 0
    [again] = engine.generate(PROMPT, GREEDY)
    assert again.token_ids == clean


def test_samples_share_the_prompt_and_run_on_when_the_first_fails(tiny: LoadedModel) -> None:
    params = SamplingParams(temperature=1.0, seed=11, max_new_tokens=5, ignore_eos=True, n=3)
    alone = Engine(tiny, kv_capacity=KV)
    expected = [
        alone.generate(PROMPT, SamplingParams(temperature=1.0, seed=11 + j, max_new_tokens=5, ignore_eos=True))[
            0
        ].token_ids
        for j in range(3)
    ]
    # the first sample's prefill fails: the second leads, the third shares its prefill
    results = failing(tiny, {1}).generate(PROMPT, params)
    assert [r.finish_reason for r in results] == ["error", "length", "length"]
    assert results[0].error_kind == "step_failed"
    assert [r.token_ids for r in results[1:]] == expected[1:]
    prompt_len = len(alone.tokenizer.encode(PROMPT))
    assert [r.cached_tokens for r in results[1:]] == [0, prompt_len - 1]


def test_one_sample_can_be_aborted(tiny: LoadedModel) -> None:
    engine = Engine(tiny, kv_capacity=KV)
    ids = engine.encode(PROMPT)
    engine.core.submit([10, 11, 12], ids, max_new_tokens=4, temperature=0.0)
    assert engine.core.stats()["waiting"] == 1  # the others wait for the first, not in the queue
    assert engine.core.abort(11)
    deltas = drain(engine)
    finishes = {d.rid: d.finish_reason for d in deltas if d.finish_reason is not None}
    assert finishes == {10: "length", 11: "abort", 12: "length"}
    engine.core.check_invariants()


def test_error_kinds_cross_the_boundary(tiny: LoadedModel) -> None:
    engine = Engine(tiny, kv_capacity=KV)
    core = engine.core
    core.submit(1, engine.encode(PROMPT), allowed_token_ids=[5])
    core.schedule()
    [fin] = core.commit_tokens(np.array([7], np.int32)).finished
    assert fin is not None
    assert (fin[0], fin[6]) == ("error", "grammar")
    assert "not allowed" in (fin[2] or "")
    core.submit(2, [5, 6, 7], max_new_tokens=1)
    core.schedule()
    [fin] = core.commit_tokens(np.array([3], np.int32)).finished
    assert fin is not None and (fin[0], fin[6]) == ("length", None)
