"""Outputs reach whoever asked: ``generate`` and ``stream`` take their own requests'
deltas, those of ``submit``-ed requests come out of ``step()``, and a refused call leaves
nothing queued."""

from __future__ import annotations

import numpy as np
import pytest
from ferrolm import SamplingParams
from ferrolm.engine import Delta, Engine
from ferrolm.errors import InvalidInputError
from ferrolm.model import LoadedModel, NumpyRunner, load_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)


@pytest.fixture
def engine(tiny: LoadedModel) -> Engine:
    return Engine(tiny, kv_capacity=256)


def drain(engine: Engine) -> list[Delta]:
    out = []
    while engine.has_work():
        out += engine.step()
    return out


def test_generate_and_stream_leave_submitted_requests_their_outputs(engine: Engine) -> None:
    alone = Engine(load_model("tiny"), kv_capacity=256)
    [expected] = alone.generate("queued elsewhere", GREEDY)
    other = engine.submit("queued elsewhere", GREEDY)
    [mine] = engine.generate("hello", GREEDY)
    assert mine.finish_reason == "length"
    streamed = list(engine.stream("mine", GREEDY))
    assert streamed[-1].finish_reason == "length"
    deltas = [d for d in drain(engine) if d.rid == other]
    assert sum((d.token_ids for d in deltas), []) == expected.token_ids
    assert deltas[-1].finish_reason == "length"
    engine.core.check_invariants()


def test_a_refused_prompt_in_generate_queues_nothing(engine: Engine) -> None:
    with pytest.raises(InvalidInputError) as e:
        engine.generate(["fine", ""], GREEDY)
    assert e.value.field == "prompt"
    assert not engine.has_work()
    with pytest.raises(InvalidInputError) as e:
        engine.generate([[1, 2], [5, -1]], GREEDY)
    assert e.value.field == "input_ids"
    assert not engine.has_work()
    assert engine.generate("next", GREEDY)[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], GREEDY, "input_ids"),
        ([5, -1], GREEDY, "input_ids"),
        ("x", SamplingParams(allowed_token_ids=[]), "allowed_token_ids"),
    ],
)
def test_refusals_name_the_field(engine: Engine, prompt: object, params: SamplingParams, field: str) -> None:
    with pytest.raises(InvalidInputError) as e:
        engine.submit(prompt, params)  # type: ignore[arg-type]
    assert e.value.field == field
    assert not engine.has_work()


def test_a_list_of_numpy_ints_is_one_prompt(engine: Engine) -> None:
    results = engine.generate(list(np.array([1, 2, 3], np.int32)), GREEDY)
    assert len(results) == 1 and results[0].prompt_ids == [1, 2, 3]


def test_stream_refuses_bad_input_when_called(engine: Engine) -> None:
    with pytest.raises(InvalidInputError):
        engine.stream("")


def test_unknown_model_and_small_runner_are_refused(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidInputError) as e:
        Engine("no-such-model")
    assert e.value.field == "model"
    with pytest.raises(InvalidInputError) as e:
        Engine(tiny, kv_capacity=512, runner=NumpyRunner(tiny.config, tiny.weights, 8))
    assert e.value.field == "kv_capacity"
