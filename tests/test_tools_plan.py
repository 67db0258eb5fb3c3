"""Tools checked (the field at fault named), the JSON Schemas a constrained call is
generated under, and what a request's tools and reasoning change about its prompt and
its grammar (``plan_chat``)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.tools import FORMATS, ToolChoice, parse_tool_choice, parse_tools, plan_chat, reasoning_format
from ferrolm.tools.definitions import call_array_schema, call_object_schema
from ferrolm.tools.messages import template_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}}
# references to its own root, as generated schemas (pydantic's) write them
TREE = {"type": "function", "function": {"name": "make_tree", "strict": True, "parameters": {
    "$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["children"], "additionalProperties": False}},
    "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
    "additionalProperties": False}}}
NOTHING = {"type": "function", "function": {"name": "ping"}}


def test_tools_parse_with_their_defaults() -> None:
    tools = parse_tools([WEATHER, TREE, NOTHING])
    assert [t.name for t in tools] == ["get_weather", "make_tree", "ping"]
    assert tools[1].strict and not tools[0].strict
    assert tools[2].parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert tools[0].as_template_tool() == WEATHER
    assert parse_tools(None) == []


@pytest.mark.parametrize(("tools", "field"), [
    ([], "tools"),
    ([{"type": "retrieval"}], "tools.0.type"),
    ([{"type": "function"}], "tools.0.function"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools.0.function.name"),
    ([NOTHING, NOTHING], "tools.1.function.name"),
    ([WEATHER, {"type": "function", "function": {"name": "f", "parameters": "object"}}], "tools.1.function.parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "tools.0.function.description"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "tools.0.function.strict"),
])
def test_bad_tools_name_the_field(tools: Any, field: str) -> None:
    with pytest.raises(InvalidInputError) as e:
        parse_tools(tools)
    assert e.value.field == field and str(e.value).startswith(f"{field}:")


def test_tool_choice() -> None:
    tools = parse_tools([WEATHER, NOTHING])
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, []) == ToolChoice("none")
    assert parse_tool_choice("required", tools) == ToolChoice("required")
    assert parse_tool_choice({"type": "function", "function": {"name": "ping"}}, tools) == ToolChoice("required", "ping")
    for bad in ["sometimes", {"type": "function", "function": {"name": "nope"}}, {"type": "function"}, 3]:
        with pytest.raises(InvalidInputError) as e:
            parse_tool_choice(bad, tools)
        assert e.value.field == "tool_choice"
    with pytest.raises(InvalidInputError) as e:
        parse_tool_choice("auto", [])  # as OpenAI: only with tools
    assert e.value.field == "tool_choice"


def test_call_schemas_accept_exactly_the_calls() -> None:
    tools = parse_tools([WEATHER, TREE, NOTHING])
    one = call_object_schema(tools)
    jsonschema.Draft202012Validator.check_schema(one)
    valid = jsonschema.Draft202012Validator(one)
    assert valid.is_valid({"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert valid.is_valid({"name": "make_tree", "arguments": {"root": {"children": [{"children": []}]}}})
    assert valid.is_valid({"name": "ping", "arguments": {}})
    assert not valid.is_valid({"name": "get_weather", "arguments": {"unit": "c"}})  # city missing
    assert not valid.is_valid({"name": "make_tree", "arguments": {"root": {"children": [{}]}}})  # the $ref holds
    assert not valid.is_valid({"name": "nope", "arguments": {}})
    assert not valid.is_valid({"name": "ping", "arguments": {}, "extra": 1})
    assert list(one["anyOf"][0]["properties"]) == ["name", "arguments"]  # the name is written first
    many = jsonschema.Draft202012Validator(call_array_schema(tools))
    assert many.is_valid([{"name": "ping", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "x"}}])
    assert not many.is_valid([])
    single = jsonschema.Draft202012Validator(call_array_schema(tools[1:2], parallel=False))
    assert single.is_valid([{"name": "make_tree", "arguments": {"root": {"children": []}}}])
    assert not single.is_valid([{"name": "make_tree", "arguments": {"root": {"children": []}}}] * 2)


def test_references_inside_data_and_property_names_are_left_alone() -> None:
    odd = {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"$ref": {"const": {"$ref": "#/keep"}}, "enum": {"$ref": "#/$defs/x"}},
        "$defs": {"x": {"type": "integer"}}}}}
    schema = call_object_schema(parse_tools([odd]))
    arguments = schema["properties"]["arguments"]
    assert arguments["properties"]["$ref"] == {"const": {"$ref": "#/keep"}}
    assert arguments["properties"]["enum"] == {"$ref": "#/properties/arguments/$defs/x"}
    valid = jsonschema.Draft202012Validator(schema)
    assert valid.is_valid({"name": "odd", "arguments": {"enum": 3, "$ref": {"$ref": "#/keep"}}})
    assert not valid.is_valid({"name": "odd", "arguments": {"enum": "3"}})


def test_a_declared_draft_moves_to_the_root() -> None:
    old = {"type": "function", "function": {"name": "old", "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"n": {"type": "number", "exclusiveMinimum": 0}}}}}
    schema = call_object_schema(parse_tools([old]))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "$schema" not in schema["properties"]["arguments"]


# ---- plan_chat ----

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def plan(choice: Any = "auto", *, tools: list[Any] | None = None, fmt: str = "hermes", prompt: str = PROMPT,
         **kw: Any) -> Any:
    parsed = parse_tools(tools if tools is not None else [WEATHER, NOTHING])
    return plan_chat(prompt, tools=parsed, choice=parse_tool_choice(choice, parsed), tool_format=FORMATS[fmt], **kw)


def params_of(p: Any) -> SamplingParams:
    return SamplingParams(**p.constraint)  # what the engine gets: a valid SamplingParams


def test_required_and_named_prime_the_call_and_constrain_the_whole_output() -> None:
    p = plan("required")
    assert p.primed and p.prompt == PROMPT + "<tool_call>\n"
    assert params_of(p).structured_after is None and params_of(p).json_schema is not None
    assert set(p.constraint["json_schema_parts"]) == {"tools.0.function.parameters", "tools.1.function.parameters"}
    named = plan({"type": "function", "function": {"name": "ping"}})
    assert named.constraint["json_schema"]["properties"]["name"] == {"const": "ping"}
    assert list(named.constraint["json_schema_parts"]) == ["tools.1.function.parameters"]
    assert named.field_names["json_schema"] == "tools"


def test_auto_is_free_text_until_the_trigger_and_may_end_without_it() -> None:
    p = plan("auto")
    assert not p.primed and p.prompt == PROMPT
    assert p.constraint["structured_after"] == "<tool_call>" and p.constraint["structured_optional"]
    params_of(p)


def test_thinking_comes_first() -> None:
    qwen3 = reasoning_format("qwen3")
    p = plan("required", reasoning=qwen3)
    assert not p.primed  # the call comes after the thinking, which the model writes first
    assert p.constraint["structured_after"] == ["</think>", "<tool_call>"]
    assert not p.constraint["structured_optional"]
    assert plan("auto", reasoning=qwen3).constraint["structured_optional"]
    # thinking already closed in the prompt (Qwen3's enable_thinking false): primed again
    assert plan("required", reasoning=qwen3, prompt=PROMPT + "<think>\n\n</think>\n\n").primed
    # response_format after the thinking
    structured = plan_chat(PROMPT, tools=[], choice=ToolChoice("none"), tool_format=None, reasoning=qwen3,
                           structured={"json_object": True}, structured_names={"json_object": "response_format"})
    assert structured.constraint == {"json_object": True, "structured_after": "</think>"}


def test_special_token_triggers_are_constrained_too() -> None:
    # Mistral's [TOOL_CALLS] is a special token: the engine takes it as the trigger, and the
    # parser must see it in the text
    p = plan("auto", fmt="mistral", special_tokens={"[TOOL_CALLS]"})
    assert p.constraint["structured_after"] == "[TOOL_CALLS]" and p.constraint["structured_optional"]
    assert p.constraint["json_schema"]["type"] == "array" and "structured_tags" not in p.constraint
    assert p.skip_special_tokens is False
    forced = plan("required", fmt="mistral", special_tokens={"[TOOL_CALLS]"})
    assert forced.primed and forced.prompt.endswith("[TOOL_CALLS]")
    assert forced.constraint["json_schema"]["type"] == "array"
    # Llama 3: <|python_tag|> opens the calls, joined by "; "
    llama = plan("auto", fmt="llama3_json", special_tokens={"<|python_tag|>"})
    assert llama.constraint["structured_after"] == "<|python_tag|>" and llama.skip_special_tokens is False
    assert llama.constraint["structured_tags"] == {"begin": "", "end": "", "separator": "; ", "begun": ""}
    params_of(llama)


def test_no_constraint_when_it_is_off() -> None:
    off = plan("required", constrain=False)
    assert off.primed and off.constraint == {}
    assert plan("auto", constrain=False).constraint == {}
    assert plan("none").constraint == {} and plan("none").tool_format is None


def test_parallel_calls_are_structural_tags() -> None:
    tags = {"begin": "<tool_call>\n", "end": "\n</tool_call>", "separator": "\n"}
    # forced: the prompt wrote the first opening
    assert plan("required").constraint["structured_tags"] == {**tags, "begun": "<tool_call>\n"}
    # auto: the trigger wrote its part of it
    assert plan("auto").constraint["structured_tags"] == {**tags, "begun": "<tool_call>"}
    qwen3 = reasoning_format("qwen3")
    assert plan("required", reasoning=qwen3).constraint["structured_tags"] == {**tags, "begun": "<tool_call>"}
    assert plan("required", fmt="llama3_json").constraint["structured_tags"]["begun"] == ""
    # parallel_tool_calls false, or a named function: the one call's JSON, as before
    assert "structured_tags" not in plan("required", parallel=False).constraint
    assert "structured_tags" not in plan({"type": "function", "function": {"name": "ping"}}).constraint
    assert "structured_tags" not in plan("auto", parallel=False).constraint
    for p in (plan("required"), plan("auto"), plan("required", fmt="llama3_json")):
        params_of(p)


def test_parallel_calls_off_allows_one() -> None:
    schema = plan("required", fmt="mistral", parallel=False).constraint["json_schema"]
    assert schema["maxItems"] == 1
    assert not plan("required", fmt="mistral", parallel=False).output_parser().tools.sink.parallel


def test_strict_functions_close_their_objects() -> None:
    assert plan("required", tools=[TREE]).constraint["json_schema_strict"]
    assert "json_schema_strict" not in plan("required").constraint


def test_what_cannot_be_planned_names_the_field() -> None:
    parsed = parse_tools([WEATHER])
    with pytest.raises(InvalidInputError) as e:
        plan_chat(PROMPT, tools=parsed, choice=ToolChoice("auto"), tool_format=None)
    assert e.value.field == "tools"
    fmt: dict[str, Any] = {"structured": {"json_object": True}, "structured_names": {"json_object": "response_format"}}
    # where the calls cannot be told from an answer by their first character
    cases: list[dict[str, Any]] = [{"fmt": "llama3_json"}, {"fmt": "mistral", "special_tokens": {"[TOOL_CALLS]"}},
                                   {"constrain": False}]
    for kw in cases:
        with pytest.raises(InvalidInputError) as e:
            plan("auto", **fmt, **kw)
        assert e.value.field == "response_format"
    # with tool_choice none the tools are only shown to the model: response_format applies
    p = plan("none", structured={"json_object": True}, structured_names={"json_object": "response_format"})
    assert p.constraint == {"json_object": True}


def test_auto_with_response_format_is_an_answer_in_it_or_calls() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    names = {"json_schema": "response_format"}
    p = plan("auto", structured={"json_schema": schema}, structured_names=names)
    assert p.constraint["structured_or"] == {"json_schema": schema}
    assert p.constraint["structured_tags"] == {"begin": "<tool_call>\n", "end": "\n</tool_call>", "separator": "\n",
                                               "repeated": True}
    assert "structured_after" not in p.constraint and not p.primed
    assert p.field_names["structured_or"] == "response_format" and p.field_names["json_schema"] == "tools"
    params_of(p)
    one = plan("auto", parallel=False, structured={"json_schema": schema}, structured_names=names)
    assert one.constraint["structured_tags"]["repeated"] is False
    mistral = plan("auto", fmt="mistral", structured={"json_object": True}, structured_names={"json_object": "x"})
    assert mistral.constraint["structured_tags"] == {"begin": "[TOOL_CALLS]", "end": "", "repeated": False}
    # after the thinking
    thinking = plan("auto", reasoning=reasoning_format("qwen3"), structured={"json_schema": schema},
                    structured_names=names)
    assert thinking.constraint["structured_after"] == "</think>"
    # a forced call has no content for response_format to shape (as OpenAI): ignored
    forced = plan("required", structured={"json_schema": schema}, structured_names=names)
    assert forced.primed and "structured_or" not in forced.constraint


def test_sampling_params_check_the_new_fields() -> None:
    for kw, field in [({"structured_optional": True, "json_object": True}, "structured_optional"),
                      ({"structured_tags": {"begin": "<a>", "end": "</a>"}}, "structured_tags"),
                      ({"structured_tags": {"begin": "<a>"}, "json_object": True}, "structured_tags"),
                      ({"structured_tags": {"begin": "<a>", "end": 1}, "json_object": True}, "structured_tags"),
                      ({"structured_tags": {"begin": "<a>", "end": "", "x": ""}, "json_object": True}, "structured_tags"),
                      ({"structured_tags": {"begin": "<a>", "end": "", "begun": "<b"}, "json_object": True},
                       "structured_tags"),
                      ({"structured_tags": {"begin": "<a>", "end": "", "repeated": "yes"}, "json_object": True},
                       "structured_tags"),
                      ({"structured_or": {"json_object": True}}, "structured_or"),
                      ({"structured_or": {"n": 2}, "json_object": True}, "structured_or"),
                      ({"structured_or": {}, "json_object": True}, "structured_or"),
                      ({"structured_or": {"regex": "a", "choice": ["b"]}, "json_object": True}, "structured_or"),
                      ({"structured_after": ["</think>", ""], "json_object": True}, "structured_after"),
                      ({"json_schema_parts": {"a": {}}}, "json_schema_parts")]:
        with pytest.raises(InvalidInputError) as e:
            SamplingParams(**kw)
        assert e.value.field == field
    p = SamplingParams(json_object=True, structured_after=["a", "b"], structured_optional=True)
    assert p.triggers() == ["a", "b"] and "structured_optional" not in p.core_kwargs()


def test_history_messages_take_the_form_templates_expect() -> None:
    messages = template_messages([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ])
    assert messages[0] == {"role": "user", "content": "ab"}
    assert messages[1]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]
    assert messages[2] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    with pytest.raises(InvalidInputError) as e:
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}])
    assert e.value.field == "messages.0.tool_calls.0.function.arguments"
