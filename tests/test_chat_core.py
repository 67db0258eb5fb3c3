"""The request core of chat through the binding (``_core.ChatCore``), as ``Engine.chat``
uses it: the prompt and its ids, the compiled grammar, the parser names and their errors,
and the output parser, whole and streamed, on the recorded outputs of
``tests/data/tool_call_outputs.json`` (the parsers themselves are tested in Rust:
``crates/ferrolm-frontend/src/tools/tests.rs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import LoadedModel
from ferrolm.sampling_params import SamplingParams
from ferrolm.server import args as server_args

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "tool_call_outputs.json").read_text(encoding="utf-8")
)["cases"]
# the cases whose prompt is the template's own (the others set the prompt's thinking state)
RENDERED = [c for c in CASES if "prompt" not in c]
USER = [{"role": "user", "content": "hi"}]
PING = {"type": "function", "function": {"name": "ping"}}


@pytest.fixture(scope="module")
def core(tiny: LoadedModel) -> _core.ChatCore:
    tok = tiny.tokenizer
    vocabulary = _core.Vocabulary(
        tok.token_bytes(), special_token_ids=tok.special_token_ids, eos_token_ids=list(tiny.config.eos_token_ids)
    )
    return _core.ChatCore(
        vocabulary, tok.hf.to_str(), tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token
    )


def request(**kw: Any) -> str:
    return json.dumps({"messages": USER, **kw})


def test_the_prompt_is_the_templates_and_its_ids_the_tokenizers(core: _core.ChatCore, tiny: LoadedModel) -> None:
    prepared = core.prepare(request())
    assert prepared.prompt == tiny.tokenizer.apply_chat_template(USER)
    ids = prepared.prompt_ids
    assert ids.dtype == np.uint32
    assert ids.tolist() == tiny.tokenizer.encode(prepared.prompt, add_special_tokens=False).tolist()
    assert prepared.grammar is None and prepared.skip_special_tokens is None


def test_a_forced_call_comes_with_its_grammar(core: _core.ChatCore) -> None:
    prepared = core.prepare(request(tools=[PING], tool_choice="required"))
    assert prepared.prompt.endswith("<|im_start|>assistant\n<tool_call>\n")
    assert isinstance(prepared.grammar, _core.Grammar)
    m = prepared.grammar.matcher()
    assert m.accept_string('{"name":"ping","arguments":{}}\n</tool_call>') and m.can_end()
    content, reasoning, calls, finish = prepared.parse('{"name": "ping", "arguments": {}}', "stop")
    assert (content, reasoning, finish) == (None, None, "tool_calls")
    [(call_id, name, arguments)] = calls
    assert call_id.startswith("call_") and (name, json.loads(arguments)) == ("ping", {})
    constrained = core.prepare(request(tools=[PING], tool_choice="required"), constrain_tool_calls=False)
    assert constrained.grammar is None and constrained.parses


def test_the_callers_constraint_is_planned_in(core: _core.ChatCore) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fields = SamplingParams(json_schema=schema).constraint_fields()
    prepared = core.prepare(request(), constraint_json=json.dumps(fields), reasoning_parser="none")
    assert prepared.grammar is not None and prepared.grammar.matcher().accept_string('{"ok":true}')
    with pytest.raises(InvalidInputError) as e:
        core.prepare(request(tools=[PING]), constraint_json=json.dumps({"regex": "<[a-z]+>"}))
    assert e.value.field == "regex"
    with pytest.raises(InvalidInputError) as e:
        core.prepare(request(), constraint_json=json.dumps({"regex": "a", "choice": ["b"]}))
    assert e.value.field == "choice"


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"tool_call_parser": "nonesuch"}, "tool_call_parser"), ({"reasoning_parser": "nonesuch"}, "reasoning_parser")],
)
def test_parser_names_are_the_cores(core: _core.ChatCore, kw: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInputError) as e:
        core.prepare(request(), **kw)
    assert e.value.field == field
    assert {"auto", "none", "hermes", "llama3_json", "mistral"} <= set(_core.TOOL_CALL_PARSERS)
    assert {"auto", "none", "qwen3", "deepseek_r1"} <= set(_core.REASONING_PARSERS)
    assert server_args.PARSER_CHOICES == _core.TOOL_CALL_PARSERS
    assert server_args.REASONING_CHOICES == _core.REASONING_PARSERS


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
            "tools.0.function.parameters",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"temperature": 1.0}, "temperature"),
    ],
)
def test_bad_requests_name_the_field(core: _core.ChatCore, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as e:
        core.prepare(json.dumps({"messages": USER, **kw}))
    assert e.value.field == field


def prepared_for(core: _core.ChatCore, case: dict[str, Any]) -> Any:
    # a tool, so the format parses; unconstrained, so any output is read as written
    tools = {"tools": [PING]} if case["format"] else {}
    return core.prepare(
        request(**tools),
        tool_call_parser=case["format"] or "none",
        reasoning_parser=case.get("reasoning") or "none",
        constrain_tool_calls=False,
    )


def streamed(parser: _core.ChatOutputParser, chunks: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    reasoning, content, calls = "", "", []
    for chunk in [*chunks, None]:
        pieces = parser.feed(chunk) if chunk is not None else parser.finish()
        for kind, text, index, call_id in pieces:
            if kind == "reasoning":
                reasoning += text
            elif kind == "content":
                content += text
            elif kind == "call":
                assert call_id.startswith("call_") and index == len(calls)
                calls.append((text, ""))
            else:
                calls[index] = (calls[index][0], calls[index][1] + text)
    return reasoning, content, calls


@pytest.mark.parametrize("case", RENDERED, ids=[c["name"] for c in RENDERED])
def test_recorded_outputs_parse_whole_and_streamed_alike(core: _core.ChatCore, case: dict[str, Any]) -> None:
    prepared = prepared_for(core, case)
    content, reasoning, calls, _ = prepared.parse(case["output"], "stop")
    assert content == case["content"]
    assert [[name, json.loads(arguments)] for _, name, arguments in calls] == case["calls"]
    assert reasoning == case.get("reasoning_content")
    whole = (reasoning or "", content or "", [(name, arguments) for _, name, arguments in calls])
    # (streamed in pieces of every size: the parsers' own tests, in Rust)
    assert streamed(prepared.output_parser(), list(case["output"])) == whole


def test_sampling_params_check_the_constraint_fields() -> None:
    # refused at construction by the request core's own rules (_core.check_constraint), the
    # field named down to the member at fault
    for kw, field in [
        ({"structured_optional": True, "json_object": True}, "structured_optional"),
        ({"structured_tags": {"begin": "<a>", "end": "</a>"}}, "structured_tags"),
        ({"structured_tags": {"begin": "<a>"}, "json_object": True}, "structured_tags"),
        ({"structured_tags": {"begin": "<a>", "end": 1}, "json_object": True}, "structured_tags.end"),
        ({"structured_tags": {"begin": "<a>", "end": "", "x": ""}, "json_object": True}, "structured_tags.x"),
        ({"structured_tags": {"begin": "<a>", "end": "", "begun": "<b"}, "json_object": True}, "structured_tags"),
        (
            {"structured_tags": {"begin": "<a>", "end": "", "repeated": "yes"}, "json_object": True},
            "structured_tags.repeated",
        ),
        ({"structured_or": {"json_object": True}}, "structured_or"),
        ({"structured_or": {"n": 2}, "json_object": True}, "structured_or.n"),
        ({"structured_or": {}, "json_object": True}, "structured_or"),
        ({"structured_or": {"regex": "a", "choice": ["b"]}, "json_object": True}, "structured_or"),
        ({"structured_after": ["</think>", ""], "json_object": True}, "structured_after"),
        ({"json_schema_parts": {"a": {}}}, "json_schema_parts"),
        ({"regex": "a", "json_object": True}, "json_object"),
        ({"ebnf": 5}, "ebnf"),
        ({"json_schema_strict": True}, "json_schema_strict"),
    ]:
        with pytest.raises(InvalidInputError) as e:
            SamplingParams(**kw)
        assert e.value.field == field
    p = SamplingParams(json_object=True, structured_after=["a", "b"], structured_optional=True)
    assert "structured_optional" not in p.core_kwargs()
    assert p.constraint_fields() == {"json_object": True, "structured_after": ["a", "b"], "structured_optional": True}
    assert p.without_constraint().constraint_fields() == {}
