"""The tool-call and reasoning parsers on outputs in each family's documented format
(``tests/data/tool_call_outputs.json``): whole, and streamed in pieces of every size,
which must always put together to the same message."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrolm.errors import InvalidInputError
from ferrolm.tools import FORMATS, ChatOutputParser, MessageBuilder, detect_format, reasoning_format, tool_call_format
from ferrolm.tools.call_scanner import match_header
from ferrolm.tools.formats import held_back
from ferrolm.tools.reasoning import detect_reasoning
from ferrolm.tools.pieces import CALL

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "tool_call_outputs.json").read_text(encoding="utf-8"))["cases"]


def parser_for(case: dict[str, Any], **kw: Any) -> ChatOutputParser:
    fmt = FORMATS[case["format"]] if case["format"] else None
    return ChatOutputParser(tool_format=fmt, reasoning=reasoning_format(case.get("reasoning")),
                            prompt=case.get("prompt", ""), **kw)


def parse(case: dict[str, Any], chunks: list[str], **kw: Any) -> MessageBuilder:
    parser = parser_for(case, **kw)
    built = MessageBuilder()
    for chunk in chunks:
        built.add(parser.feed(chunk))
    built.add(parser.finish())
    return built


def split(text: str, rng: random.Random, longest: int) -> list[str]:
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, longest)
        out.append(text[i:i + k])
        i += k
    return out


def summary(built: MessageBuilder) -> tuple[Any, ...]:
    return built.reasoning, built.content, [(c.name, c.arguments) for c in built.calls]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recorded_output_parses_to_the_expected_message(case: dict[str, Any]) -> None:
    built = parse(case, [case["output"]])
    assert (built.content or None) == case["content"]
    assert [[c.name, json.loads(c.arguments)] for c in built.calls] == case["calls"]
    assert (built.reasoning or None) == case.get("reasoning_content")
    assert len({c.id for c in built.calls}) == len(built.calls) and all(c.id.startswith("call_") for c in built.calls)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_streamed_in_any_pieces_it_says_the_same(case: dict[str, Any]) -> None:
    whole = summary(parse(case, [case["output"]]))
    assert summary(parse(case, list(case["output"]))) == whole  # a character at a time
    rng = random.Random(case["name"])
    for _ in range(25):
        assert summary(parse(case, split(case["output"], rng, 7))) == whole


def test_a_call_is_announced_with_its_name_before_its_arguments_stream() -> None:
    parser = ChatOutputParser(tool_format=FORMATS["hermes"])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    head = text.index('"city"')
    pieces = parser.feed(text[:head])
    assert [(p.kind, p.text) for p in pieces] == [(CALL, "get_weather"), ("arguments", "{")]
    rest = parser.feed(text[head:]) + parser.finish()
    assert "".join(p.text for p in rest) == '"city": "Paris", "days": 3}'
    assert all(p.kind == "arguments" and p.index == 0 for p in rest)


def test_partial_tags_are_held_back_until_they_resolve() -> None:
    parser = ChatOutputParser(tool_format=FORMATS["hermes"])
    assert [p.text for p in parser.feed("a <tool")] == ["a"]  # " <tool" may open a call
    assert [p.text for p in parser.feed("box> b")] == [" <toolbox> b"]
    assert held_back("x </thi", "</think>") == 5 and held_back("abc", "</think>") == 0


def test_primed_outputs_start_inside_the_call() -> None:
    # required / named tool_choice: the prompt ended with the format's opening
    for name, output in [("hermes", '{"name":"f","arguments":{"a":1}}'),
                         ("mistral", '[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{}}]'),
                         ("llama3_json", '{"name":"f","parameters":{"a":1}}')]:
        parser = ChatOutputParser(tool_format=FORMATS[name], primed=True)
        built = MessageBuilder()
        built.add(parser.feed(output))
        built.add(parser.finish())
        assert built.calls[0].name == "f" and json.loads(built.calls[0].arguments) == {"a": 1}, name
        assert built.content == ""


def test_without_parallel_calls_only_the_first_is_kept() -> None:
    case = next(c for c in CASES if c["name"] == "hermes-parallel-calls")
    built = parse(case, [case["output"]], parallel=False)
    assert [c.name for c in built.calls] == ["get_current_temperature"] and not built.content


def test_an_unconstrained_call_cut_short_keeps_what_came() -> None:
    # what a constrained call can never be: the name came, the arguments did not finish
    parser = ChatOutputParser(tool_format=FORMATS["hermes"])
    built = MessageBuilder()
    built.add(parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": '))
    built.add(parser.finish())
    assert [(c.name, c.arguments) for c in built.calls] == [("f", '{"a": ')]


@pytest.mark.parametrize(("raw", "found"), [
    ('{"name": "f", "arguments": {', ("f", 27)),
    (' {\n "name" : "f\\"g" ,\t"arguments":\n[', ('f"g', 35)),
    ('{"name": "f", "arguments": ', "more"),
    ('{"na', "more"),
    ('{"name": "f", "argu', "more"),
    ('{"name": "f", "parameters": {', "no"),
    ('{"arguments": {}, "name": "f"}', "no"),
    ('[{"name"', "no"),
])
def test_the_call_header_is_recognized_as_it_streams(raw: str, found: Any) -> None:
    assert match_header(raw, ("arguments",)) == found


@given(st.text(alphabet='{}[]",:\\ nameargs<>/tool_cl\n', max_size=60))
def test_any_text_streams_as_it_parses_whole(text: str) -> None:
    # malformed outputs included: the pieces always put together to the whole parse
    for name in FORMATS:
        case = {"format": name, "reasoning": "qwen3"}
        whole = summary(parse(case, [text]))
        assert summary(parse(case, list(text))) == whole


def test_formats_are_found_by_name_and_from_the_chat_template() -> None:
    assert tool_call_format("qwen25", None) is FORMATS["hermes"]
    assert tool_call_format("llama3", None) is FORMATS["llama3_json"]
    assert tool_call_format("none", "<tool_call>") is None
    assert detect_format("{{ '<tool_call>' }}") is FORMATS["hermes"]
    assert detect_format("{{ '[TOOL_CALLS]' }}") is FORMATS["mistral"]
    assert detect_format("<|python_tag|>") is FORMATS["llama3_json"]
    assert detect_format("{{ '<tool_call>' }}{{ '[TOOL_CALLS]' }}") is None  # ambiguous
    assert detect_format("{{ messages }}") is None and detect_format(None) is None
    with pytest.raises(InvalidInputError) as e:
        tool_call_format("nonesuch", None)
    assert e.value.field == "tool_call_parser"
    with pytest.raises(InvalidInputError) as e:
        reasoning_format("nonesuch")
    assert e.value.field == "reasoning_parser"
    assert reasoning_format("deepseek-r1") is reasoning_format("deepseek_r1")


def test_the_reasoning_format_is_found_from_the_chat_template() -> None:
    qwen3 = "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}<|im_start|>"
    deepseek = "{% set content = content.split('</think>')[-1] %}{{'<\uff5cAssistant\uff5c>' + content}}"
    assert detect_reasoning(qwen3) is reasoning_format("qwen3")
    assert detect_reasoning(deepseek) is reasoning_format("deepseek_r1")
    assert detect_reasoning("{{ messages }}<tool_call>") is None and detect_reasoning(None) is None
    assert reasoning_format("auto", deepseek) is reasoning_format("deepseek_r1")
    assert reasoning_format("auto", "{{ messages }}") is None
    assert reasoning_format("none", qwen3) is None  # off whatever the template shows
