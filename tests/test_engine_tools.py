"""``Engine.chat`` with tools on the tiny model (random weights, a Hermes-style chat
template): calls generated under the functions' schemas always parse and validate, over
many seeds; ``auto`` stays free until the trigger; thinking comes apart."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import LoadedModel
from ferrolm.sampling_params import SamplingParams

from tests.conftest import make_engine

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER_PARAMETERS},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                # bounded values and no other members (JSON Schema allows any by default): a random
                # model writes digits and strings without end, and the test needs calls that finish
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999}, "b": {"type": "boolean"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]
SCHEMAS = {
    t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
    for t in TOOLS
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL, THINK_END, IM_END = 32004, 32007, 32003  # the tiny model's <tool_call>, </think>, <|im_end|>


@pytest.fixture(scope="module")
def engine(tiny: LoadedModel) -> Any:
    return make_engine(tiny)


def assert_valid_calls(calls: list[Any]) -> None:
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def sampled(seed: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=kw.pop("max_new_tokens", 96), temperature=1.0, seed=seed, **kw)


def test_required_calls_always_parse_and_validate(engine: Any) -> None:
    names = set()
    for seed in range(24):
        [answer] = engine.chat(USER, sampled(seed), tools=TOOLS, tool_choice="required")
        assert answer.finish_reason == "tool_calls", answer
        assert answer.content is None and answer.prompt.endswith("<|im_start|>assistant\n<tool_call>\n")
        assert_valid_calls(answer.tool_calls)
        names |= {c.name for c in answer.tool_calls}
    assert len(names) > 1  # the model chooses among the tools


def test_a_named_function_is_the_one_called(engine: Any) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answers = engine.chat(USER, sampled(3, n=12), tools=TOOLS, tool_choice=choice)
    assert len(answers) == 12
    for answer in answers:
        assert [c.name for c in answer.tool_calls] == ["get_weather"]
        assert_valid_calls(answer.tool_calls)


def test_auto_with_the_trigger_forced_returns_a_valid_call(engine: Any) -> None:
    for seed in range(8):
        params = sampled(seed, logit_bias={TOOL_CALL: 100.0})
        [answer] = engine.chat(USER, params, tools=TOOLS, tool_choice="auto")
        assert answer.text.startswith("<tool_call>"), answer.text
        assert answer.finish_reason == "tool_calls"
        assert_valid_calls(answer.tool_calls)


def test_auto_without_the_trigger_is_free_text_that_may_end(engine: Any) -> None:
    # the trigger never written (its token banned) and EOS made likely: the answer is text
    # that ends by itself (under a mandatory trigger EOS would stay masked until a call)
    for seed in range(4):
        params = sampled(seed, logit_bias={TOOL_CALL: -100.0, IM_END: 12.0}, max_new_tokens=200)
        [answer] = engine.chat(USER, params, tools=TOOLS)
        assert answer.tool_calls == [] and answer.content == (answer.text.strip() or None)
        assert answer.finish_reason == "stop", answer.text


def test_parallel_tool_calls_off_returns_one_call(engine: Any) -> None:
    # unconstrained, a model may write several calls; OpenAI's switch promises one at most
    [answer] = engine.chat(USER, sampled(0), tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(answer.tool_calls) == 1


def test_thinking_comes_apart_and_the_answer_follows_the_schema(engine: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for seed in range(4):
        params = sampled(seed, json_schema=schema, logit_bias={THINK_END: 12.0}, max_new_tokens=200)
        [answer] = engine.chat(USER, params, reasoning_parser="deepseek_r1")
        head, _, tail = answer.text.partition("</think>")
        assert answer.reasoning_content == (head.strip() or None)
        jsonschema.validate(json.loads(answer.content), schema)
        assert answer.content == tail.strip()


def test_thinking_then_a_required_call(engine: Any) -> None:
    # The tiny model's weights are random: how many tokens it writes before its first call
    # (text may come after </think>, more </think> among it under the bias) depends on the
    # CPU's float rounding (BLAS kernels differ by host). 400 tokens leave room for the
    # calls to be finished on any of them (200 ran out on one host, mid-call).
    for seed in range(4):
        params = sampled(seed, logit_bias={THINK_END: 12.0, TOOL_CALL: 12.0}, max_new_tokens=400)
        [answer] = engine.chat(USER, params, tools=TOOLS, tool_choice="required", reasoning_parser="deepseek_r1")
        assert "</think>" in answer.text and answer.finish_reason == "tool_calls", answer.text
        assert_valid_calls(answer.tool_calls)


def test_unconstrained_calls_are_parsed_only(engine: Any) -> None:
    # the flag off: no grammar, so the random model's "call" is whatever it writes
    [answer] = engine.chat(
        USER, sampled(0, max_new_tokens=8), tools=TOOLS, tool_choice="required", constrain_tool_calls=False
    )
    assert answer.finish_reason == "length" and answer.prompt.endswith("<tool_call>\n")


def test_history_with_calls_and_results_renders(engine: Any) -> None:
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    [answer] = engine.chat(history, sampled(0, max_new_tokens=4), tools=TOOLS, tool_choice="none")
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>' in answer.prompt
    )
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in answer.prompt
    assert answer.tool_calls == []


def test_a_schema_that_does_not_compile_names_its_tool(engine: Any) -> None:
    bad = {
        "type": "function",
        "function": {
            "name": "bad",
            "parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}},
        },
    }
    with pytest.raises(InvalidInputError) as e:
        engine.chat(USER, sampled(0), tools=[TOOLS[0], bad], tool_choice="required")
    assert e.value.field == "tools.1.function.parameters"
    with pytest.raises(InvalidInputError) as e:
        engine.chat(USER, sampled(0), tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.field == "tool_choice"
    with pytest.raises(InvalidInputError) as e:
        engine.chat(USER, sampled(0), tool_choice="auto")
    assert e.value.field == "tool_choice"
    assert not engine.has_work()


def test_an_optional_trigger_lets_the_free_text_end(engine: Any) -> None:
    v = engine.vocabulary
    call = v.json_schema(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    eos = engine.config.eos_token_ids[0]
    mask = np.zeros(v.bitmask_words, dtype=np.int32)
    optional = v.after_trigger("<tool_call>", call, optional=True).matcher()
    assert optional.can_end() and optional.accept_string("plain text")
    optional.fill_next_token_bitmask(mask)
    assert mask[eos // 32] >> (eos % 32) & 1, "EOS allowed in the free text"
    assert optional.accept_token(TOOL_CALL) and not optional.can_end(), "once triggered, the call must complete"
    assert optional.accept_string('{"a":1}') and optional.can_end()
    mandatory = v.after_trigger("<tool_call>", call).matcher()
    assert mandatory.accept_string("plain text") and not mandatory.can_end()


def test_several_calls_in_one_answer_always_parse_and_validate(engine: Any) -> None:
    # parallel_tool_calls (the default): the calls are <tool_call> tags repeated, each
    # closed, so each one parses wherever the answer ends
    counts = []
    for seed in range(24):
        [answer] = engine.chat(USER, sampled(seed, max_new_tokens=400), tools=TOOLS, tool_choice="required")
        assert answer.finish_reason == "tool_calls", answer.text
        assert_valid_calls(answer.tool_calls)
        text = "<tool_call>\n" + answer.text
        assert text.count("<tool_call>\n") == text.count("\n</tool_call>") == len(answer.tool_calls), text
        counts.append(len(answer.tool_calls))
    assert max(counts) > 1 and min(counts) == 1, counts


def test_several_calls_after_the_trigger_in_auto(engine: Any) -> None:
    counts = []
    for seed in range(12):
        params = sampled(seed, logit_bias={TOOL_CALL: 100.0}, max_new_tokens=400)
        [answer] = engine.chat(USER, params, tools=TOOLS, tool_choice="auto")
        assert answer.finish_reason == "tool_calls" and answer.content is None, answer.text
        assert_valid_calls(answer.tool_calls)
        counts.append(len(answer.tool_calls))
    assert max(counts) > 1, counts


def test_auto_with_response_format_answers_in_it_or_calls(engine: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    # the trigger banned: always an answer, in the format
    for seed in range(6):
        params = sampled(seed, json_schema=schema, logit_bias={TOOL_CALL: -100.0}, max_new_tokens=200)
        [answer] = engine.chat(USER, params, tools=TOOLS)
        assert answer.tool_calls == [] and answer.finish_reason == "stop", answer.text
        jsonschema.validate(json.loads(answer.content), schema)
    # the trigger forced: calls
    for seed in range(6):
        params = sampled(seed, json_schema=schema, logit_bias={TOOL_CALL: 100.0}, max_new_tokens=400)
        [answer] = engine.chat(USER, params, tools=TOOLS)
        assert answer.finish_reason == "tool_calls" and answer.content is None, answer.text
        assert_valid_calls(answer.tool_calls)
    # forced calls: response_format has no content to shape (as OpenAI), the calls come
    [answer] = engine.chat(
        USER, sampled(0, json_schema=schema, max_new_tokens=400), tools=TOOLS, tool_choice="required"
    )
    assert_valid_calls(answer.tool_calls)
    assert not engine.has_work()


def test_a_special_token_trigger_is_generated_as_the_token(engine: Any) -> None:
    # <|im_start|> is one of the tiny tokenizer's special tokens, which free text never
    # writes, but as a trigger (Mistral's [TOOL_CALLS], Llama's <|python_tag|>) it is allowed
    im_start = engine.tokenizer.hf.token_to_id("<|im_start|>")
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a"],
        "additionalProperties": False,
    }
    for seed in range(4):
        params = sampled(
            seed,
            json_schema=schema,
            structured_after="<|im_start|>",
            logit_bias={im_start: 100.0},
            skip_special_tokens=False,
            max_new_tokens=60,
        )
        [result] = engine.generate("Hello", params)
        assert result.token_ids[0] == im_start
        head, _, tail = result.text.partition("<|im_start|>")
        assert head == ""
        jsonschema.validate(json.loads(tail), schema)
    # not a trigger: special tokens stay out of the output
    params = sampled(0, json_schema=schema, structured_after="<x>", logit_bias={im_start: 100.0}, max_new_tokens=8)
    [result] = engine.generate("Hello", params)
    assert im_start not in result.token_ids


def test_combinators_refuse_what_they_cannot_run(engine: Any) -> None:
    v = engine.vocabulary
    call = v.json_schema(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    with pytest.raises(InvalidInputError) as e:
        v.structural_tags(call, begin="<a>", end="</a>", begun="<b")
    assert e.value.field == "begun"
    with pytest.raises(InvalidInputError) as e:  # the closing could be more of the body
        v.structural_tags(v.regex("[0-9]+"), begin="<", end="1")
    assert e.value.field == "json_schema"
    tags = v.structural_tags(call, begin="<tool_call>\n", end="\n</tool_call>")
    with pytest.raises(InvalidInputError):  # both may begin with "<"
        v.either(v.regex("<[a-z]+>"), tags)
    either = v.either(v.regex("[a-z]+"), tags).matcher()
    assert either.accept_string("abc") and either.can_end()
    # through chat: an answer format that could begin as a call names the caller's field
    with pytest.raises(InvalidInputError) as e:
        engine.chat(USER, sampled(0, regex="<[a-z]+>"), tools=TOOLS)
    assert e.value.field == "regex"
    assert not engine.has_work()


def test_a_thinking_budget_forces_the_end_of_thinking_and_the_answer_follows(engine: Any) -> None:
    free = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True, n=2)
    plain = engine.chat(USER, free, reasoning_parser="deepseek_r1")
    assert all(THINK_END not in a.token_ids for a in plain)
    for budget in (0, 4):
        params = dataclasses.replace(free, thinking_token_budget=budget)
        answers = engine.chat(USER, params, reasoning_parser="deepseek_r1")
        for a, p in zip(answers, plain, strict=True):  # each of the n samples
            assert a.token_ids[:budget] == p.token_ids[:budget] and a.token_ids[budget] == THINK_END
            assert a.content and len(a.token_ids) == 12
    # no reasoning format (the tiny template shows none): nothing to cap
    [same] = engine.chat(USER, dataclasses.replace(free, n=1, thinking_token_budget=2))
    assert same.token_ids == plain[0].token_ids
    # a raw prompt: the request core's budget for a format, given to the submit
    ids = engine.encode("Think")
    thinking = engine.chat_core.thinking(ids, 3, reasoning_parser="deepseek_r1")
    assert (thinking.budget, thinking.end_ids, thinking.open) == (3, [THINK_END], True)
    assert engine.chat_core.thinking(engine.encode("Think</think>"), 3, reasoning_parser="deepseek_r1") is None
    [g] = engine.generate(ids, SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True), thinking=thinking)
    assert g.token_ids[3] == THINK_END and THINK_END not in g.token_ids[:3]
    with pytest.raises(InvalidInputError) as e:
        SamplingParams(thinking_token_budget=-1)
    assert e.value.field == "thinking_token_budget"
