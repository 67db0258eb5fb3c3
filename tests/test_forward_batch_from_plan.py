"""``ForwardBatch.from_plan``: a plan the engine core built (``_core.BatchPlan``) is taken
without re-checking its columns (they are read-only, so they stay as the core made them);
any other plan-like object is still checked column by column."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import make_engine
from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model import ForwardBatch, LoadedModel
from ferrolm.model.runner import _COLUMNS


def checked(plan: Any) -> ForwardBatch:
    """The batch through the full checks, whatever the plan's type."""
    return ForwardBatch(*(getattr(plan, name) for name in _COLUMNS))


@pytest.fixture(scope="module")
def core_plans(tiny: LoadedModel) -> list[Any]:
    """Every plan of a run with chunked prefills, a cached shared prefix, mixed
    prefill/decode steps and requests of different lengths."""
    engine = make_engine(tiny, kv_capacity=2048, max_prefill_tokens=24)
    core = engine.core
    shared = list(range(300, 340))
    prompts = [shared + [7, 8, 9], shared + [11], list(range(500, 530)), [42]]
    for rid, prompt in enumerate(prompts, start=1):
        core.submit(rid, prompt, max_new_tokens=3 + rid, temperature=0.0)
    plans = []
    while core.has_work():
        plan = core.schedule()
        if len(plan) == 0:
            core.take_outputs()
            continue
        plans.append(plan)
        core.commit(engine.runner.forward(ForwardBatch.from_plan(plan)))
    return plans


def test_a_core_plan_gives_the_batch_the_checks_give(core_plans: list[Any]) -> None:
    plans = core_plans
    # the run covered the shapes the fast path must get right
    assert any(p.num_tokens > len(p) for p in plans)  # a prefill chunk
    assert any(p.num_tokens == len(p) > 1 for p in plans)  # a batch of decodes
    assert any(p.is_prefill.any() and not p.is_prefill.all() for p in plans)  # mixed
    for plan in plans:
        assert type(plan) is _core.BatchPlan
        fast, slow = ForwardBatch.from_plan(plan), checked(plan)
        assert (fast.batch_size, fast.num_tokens) == (slow.batch_size, slow.num_tokens) == (len(plan), plan.num_tokens)
        for name in _COLUMNS:
            column = getattr(fast, name)
            assert column.dtype == np.int32 and column.ndim == 1 and column.flags.c_contiguous
            np.testing.assert_array_equal(column, getattr(slow, name))


def test_a_core_plan_skips_the_checks_and_a_user_plan_does_not(
    core_plans: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = core_plans[0]
    calls = []
    original = ForwardBatch.__post_init__

    def counted(self: ForwardBatch) -> None:
        calls.append(1)
        original(self)

    monkeypatch.setattr(ForwardBatch, "__post_init__", counted)
    ForwardBatch.from_plan(plan)
    assert calls == []
    user_plan = SimpleNamespace(**{name: getattr(plan, name) for name in _COLUMNS})
    ForwardBatch.from_plan(user_plan)
    assert calls == [1]


@pytest.mark.parametrize(
    ("column", "edit", "message"),
    [
        ("out_slots", lambda a: a[::-1], "must end, for each request, with its out_slots"),
        ("positions", lambda a: a + 1, "must number each request's kv_slots from 0"),
        ("qo_offsets", lambda a: a[:-1], "qo_offsets must start at 0 and end"),
        ("input_ids", lambda a: a.astype(np.float32), "must hold integers"),
        ("kv_slots", lambda a: a - 10_000, "outside"),
    ],
)
def test_a_bad_user_plan_is_still_refused(core_plans: list[Any], column: str, edit: Any, message: str) -> None:
    # a plan-like object built from a real plan with one column broken
    plan = next(p for p in core_plans if len(p) > 1)
    columns = {name: np.array(getattr(plan, name)) for name in _COLUMNS}
    columns[column] = edit(columns[column])
    with pytest.raises(InvalidInputError, match=message):
        ForwardBatch.from_plan(SimpleNamespace(**columns))


def test_a_core_plan_cannot_be_made_or_edited_from_python(core_plans: list[Any]) -> None:
    with pytest.raises(TypeError):
        _core.BatchPlan()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        type("Plan", (_core.BatchPlan,), {})
    plan = core_plans[0]
    for name in (*_COLUMNS, "rids", "samples", "is_prefill"):
        column = getattr(plan, name)
        assert not column.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            column[0] = column[0]
        with pytest.raises(ValueError):
            column.setflags(write=True)


def test_the_loop_columns_are_made_once_when_first_read(core_plans: list[Any]) -> None:
    # rids, samples and is_prefill are made on first read (the Rust front end's loop
    # never reads them); every read after gives the same array
    for plan in core_plans:
        assert plan.rids is plan.rids and plan.samples is plan.samples and plan.is_prefill is plan.is_prefill
        assert plan.rids.dtype == np.uint64 and plan.samples.dtype == plan.is_prefill.dtype == np.bool_
        assert len(plan.rids) == len(plan.samples) == len(plan.is_prefill) == len(plan)
        assert set(plan.rids.tolist()) <= {1, 2, 3, 4}


@pytest.mark.parametrize("order", ["C", "F"])
def test_logits_of_any_memory_order_commit_by_their_values(tiny: LoadedModel, order: str) -> None:
    # a Fortran-ordered array is copied to C order, never read as if it were one
    engine = make_engine(tiny, kv_capacity=512)
    core = engine.core
    core.submit(1, [5, 6, 7], max_new_tokens=2, temperature=0.0)
    core.submit(2, [9, 10, 11, 12], max_new_tokens=2, temperature=0.0)
    plan = core.schedule()
    assert len(plan) == 2
    logits = np.array(engine.runner.forward(ForwardBatch.from_plan(plan)), dtype=np.float32)
    logits[0, 100] = logits[1, 200] = 1e6
    out = core.commit(np.asfortranarray(logits) if order == "F" else logits)
    assert out.rids.tolist() == [1, 2]
    assert out.token_ids.tolist() == [100, 200]


def test_a_runner_takes_a_core_plan_as_its_batch(tiny: LoadedModel) -> None:
    # the Rust front end's loop gives the plan to the runner as it is: two engines in
    # lockstep, one forwarding ForwardBatch.from_plan(plan), the other the plan itself,
    # give the same logits at every step (prefill chunks, a cached prefix, decodes)
    engines = [make_engine(tiny, kv_capacity=2048, max_prefill_tokens=24) for _ in range(2)]
    shared = list(range(300, 340))
    prompts = [shared + [7, 8, 9], shared + [11], list(range(500, 530))]
    for engine in engines:
        for rid, prompt in enumerate(prompts, start=1):
            engine.core.submit(rid, prompt, max_new_tokens=3 + rid, temperature=0.0)
    steps = 0
    while engines[0].core.has_work():
        plans = [e.core.schedule() for e in engines]
        if len(plans[0]) == 0:
            for e in engines:
                e.core.take_outputs()
            continue
        assert plans[1].batch_size == len(plans[1]) and plans[1].num_tokens == plans[0].num_tokens
        batched = engines[0].runner.forward(ForwardBatch.from_plan(plans[0]))
        direct = engines[1].runner.forward(plans[1])
        np.testing.assert_array_equal(batched, direct)
        outs = [e.core.commit(logits) for e, logits in zip(engines, (batched, direct), strict=True)]
        assert outs[0].token_ids.tolist() == outs[1].token_ids.tolist()
        steps += 1
    assert steps > 5 and not engines[1].core.has_work()
