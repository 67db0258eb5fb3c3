"""Tool calls and reasoning over the HTTP API, on ``ferrolm serve --model tiny`` (random
weights; its chat template writes tools Hermes-style, so the server finds the format by
itself): with ``required`` or a named function every call parses and validates against
the function's schema, streamed and not, through the official ``openai`` client; a stream
put together gives the same message, reasoning, calls and usage as the answer whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from ferrolm.server.testing import RunningServer, running_server
from openai.lib.streaming.chat import ChatCompletionStreamState

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
MOVE = {
    "type": "object",
    "properties": {
        "to": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
        "fast": {"type": "boolean"},
    },
    "required": ["to"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "move", "parameters": MOVE}},
    {"type": "function", "function": {"name": "ping"}},
]
SCHEMAS = {"get_weather": WEATHER, "move": MOVE, "ping": {"type": "object", "additionalProperties": False}}
MSG: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL, THINK_END, IM_END = "32004", "32007", "32003"  # the tiny model's <tool_call>, </think>, <|im_end|>
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with client_of(server) as c:
        yield c


def streamed(client: openai.OpenAI, **kw: Any) -> Any:
    """A streamed completion put together by the openai client's own accumulator."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **kw):
        state.handle_chunk(chunk)
    return state.get_final_completion()


def calls_of(completion: Any) -> list[tuple[str, str]]:
    calls = completion.choices[0].message.tool_calls or []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [(c.function.name, c.function.arguments) for c in calls]


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "move"}}], ids=["required", "named"]
)
def test_forced_calls_always_validate_streamed_and_not(client: openai.OpenAI, tool_choice: Any) -> None:
    names = set()
    for seed in range(10):
        kw = {
            "model": "tiny",
            "messages": MSG,
            "tools": TOOLS,
            "tool_choice": tool_choice,
            "seed": seed,
            "temperature": 1.0,
            "max_tokens": 400,
        }
        whole = client.chat.completions.create(**kw)
        assert whole.choices[0].finish_reason == "tool_calls"
        assert whole.choices[0].message.content is None
        calls = calls_of(whole)
        assert calls  # one or more (parallel_tool_calls is on by default)
        names |= {name for name, _ in calls}
        stream = streamed(client, **kw)
        assert calls_of(stream) == calls  # the same seed: the same call, however it is delivered
        assert stream.choices[0].finish_reason == "tool_calls"
    assert names == {"move"} if isinstance(tool_choice, dict) else len(names) > 1


def test_auto_with_the_trigger_forced_by_logit_bias_returns_a_valid_call(client: openai.OpenAI) -> None:
    for seed in range(4):
        kw = {
            "model": "tiny",
            "messages": MSG,
            "tools": TOOLS,
            "seed": seed,
            "temperature": 1.0,
            "max_tokens": 120,
            "logit_bias": {TOOL_CALL: 100},
        }
        whole = client.chat.completions.create(**kw)
        assert whole.choices[0].finish_reason == "tool_calls" and calls_of(whole)
        assert calls_of(streamed(client, **kw)) == calls_of(whole)


def test_streamed_deltas_follow_openais_shape(server: RunningServer) -> None:
    body = {"messages": MSG, "tools": TOOLS, "tool_choice": "required", "seed": 1, "max_tokens": 120, "stream": True}
    r = httpx.post(f"{server.url}{CHAT}", json=body, timeout=120)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert deltas[0]["role"] == "assistant"
    assert set(calls[0]) == {"index", "id", "type", "function"} and calls[0]["function"]["arguments"] == ""
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])
    assert len(calls) > 2  # the arguments arrive in fragments
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any("content" in d and d["content"] for d in deltas)


def test_the_conversation_goes_on_with_the_calls_and_their_results(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="tiny", messages=MSG, tools=TOOLS, tool_choice="required", seed=2, max_tokens=120
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history = [
        *MSG,
        first.choices[0].message,  # as the openai client returns it
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, seed=2, max_tokens=8, logit_bias={TOOL_CALL: -100}
    )
    assert second.choices[0].message.tool_calls is None
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


def test_none_shows_the_tools_but_parses_nothing(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=MSG, tools=TOOLS, tool_choice="none", seed=0, max_tokens=8, logit_bias={TOOL_CALL: 100}
    )
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content is not None and r.choices[0].message.content.startswith("<tool_call>")


def test_native_generate_returns_parsed_calls(server: RunningServer) -> None:
    body = {
        "text": "Call a tool:",
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "sampling_params": {"max_new_tokens": 120, "temperature": 1.0, "seed": 4},
    }
    out = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
    [call] = out["tool_calls"]
    assert call["function"]["name"] == "get_weather" and out["content"] is None
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    assert out["meta_info"]["finish_reason"]["type"] == "tool_calls"
    assert json.loads(out["text"])["arguments"] == json.loads(call["function"]["arguments"])
    # auto over token ids, the trigger forced: the calls come parsed too
    body = {
        "input_ids": [5, 6, 7],
        "tools": TOOLS,
        "sampling_params": {"max_new_tokens": 120, "temperature": 0, "logit_bias": {TOOL_CALL: 100}},
    }
    out = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
    assert out["tool_calls"] and out["meta_info"]["finish_reason"]["type"] == "tool_calls", out
    for call in out["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


BAD_PATTERN = {
    "type": "function",
    "function": {
        "name": "bad",
        "parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}},
    },
}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TOOLS[0], BAD_PATTERN], "tool_choice": "required"}, "tools.1.function.parameters"),
        (
            {"tools": [TOOLS[0], BAD_PATTERN]},
            "tools.1.function.parameters",
        ),  # auto: the same grammar behind the trigger
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "none"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools.0.function.extra"),
        ({"tools": []}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        ({"tools": [TOOLS[2], TOOLS[2]]}, "tools.1.function.name"),
        (
            {
                "tools": TOOLS,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}},
                    },
                },
            },
            "response_format",
        ),
        ({"tools": TOOLS, "regex": "<[a-z]+>"}, "regex"),  # an answer that could begin as a call does
        ({"tools": TOOLS, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"bos_token": "<x>", "messages": []}}, "chat_template_kwargs"),
        (
            {
                "messages": [
                    *MSG,
                    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "ping"}}]},
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        (
            {
                "messages": [
                    *MSG,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "ping", "arguments": "{not json"}}
                        ],
                    },
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server: RunningServer, body: dict[str, Any], param: str) -> None:
    for stream in (False, True):
        r = httpx.post(
            f"{server.url}{CHAT}", json={"messages": MSG, "max_tokens": 4, **body, "stream": stream}, timeout=60
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text


def test_several_calls_in_one_answer_streamed_and_not(client: openai.OpenAI) -> None:
    counts = []
    for seed in range(8):
        # the end of the turn made less likely (the tiny model mostly stops after one call)
        kw: dict[str, Any] = {
            "model": "tiny",
            "messages": MSG,
            "tools": TOOLS,
            "tool_choice": "required",
            "seed": seed,
            "temperature": 1.0,
            "max_tokens": 400,
            "logit_bias": {IM_END: -3},
        }
        whole = client.chat.completions.create(**kw)
        assert whole.choices[0].finish_reason == "tool_calls"
        calls = calls_of(whole)
        assert len({c.id for c in whole.choices[0].message.tool_calls or []}) == len(calls)
        stream = streamed(client, **kw)
        assert calls_of(stream) == calls
        counts.append(len(calls))
    assert max(counts) > 1, counts
    # parallel_tool_calls false: one call, always
    for seed in range(4):
        kw = {
            "model": "tiny",
            "messages": MSG,
            "tools": TOOLS,
            "tool_choice": "required",
            "seed": seed,
            "max_tokens": 400,
            "parallel_tool_calls": False,
        }
        assert len(calls_of(client.chat.completions.create(**kw))) == 1
        assert len(calls_of(streamed(client, **kw))) == 1


def test_auto_with_response_format_answers_in_it_or_calls(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"enum": [1, 2, 3]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for seed in range(3):
        kw: dict[str, Any] = {
            "model": "tiny",
            "messages": MSG,
            "tools": TOOLS,
            "seed": seed,
            "max_tokens": 400,
            "response_format": fmt,
            "logit_bias": {TOOL_CALL: -100},
        }
        whole = client.chat.completions.create(**kw)
        assert whole.choices[0].message.tool_calls is None
        jsonschema.validate(json.loads(whole.choices[0].message.content or ""), schema)
        assert streamed(client, **kw).choices[0].message.content == whole.choices[0].message.content
        kw["logit_bias"] = {TOOL_CALL: 100}
        whole = client.chat.completions.create(**kw)
        assert whole.choices[0].finish_reason == "tool_calls" and calls_of(whole)
        assert calls_of(streamed(client, **kw)) == calls_of(whole)


HISTORY: list[Any] = [
    *MSG,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_x",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_x", "content": "sunny"},
]
# answers asked whole and streamed that the tests above do not ask both ways (required,
# named, auto with the trigger forced, not parallel, auto with response_format: above)
ANSWERS = [
    pytest.param(
        {
            "tools": TOOLS,
            "tool_choice": "required",
            "temperature": 0,
            "max_tokens": 200,
            "n": 2,
            "logit_bias": {IM_END: -3},
        },
        id="required-greedy-n2",
    ),
    pytest.param({"tools": TOOLS, "temperature": 1.0, "seed": 2, "max_tokens": 12}, id="auto-free"),
    pytest.param({"tools": TOOLS, "tool_choice": "none", "temperature": 0, "max_tokens": 8}, id="none"),
    pytest.param(
        {"messages": HISTORY, "tools": TOOLS, "temperature": 0, "max_tokens": 8, "logit_bias": {TOOL_CALL: -100}},
        id="history",
    ),
]


def streamed_choices(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each choice of a raw stream put together (content, reasoning, calls, finish reason),
    checking OpenAI's shape of streamed calls: a call's first delta carries its id, name
    and empty arguments at the next index, later ones only arguments."""
    r = httpx.post(
        f"{server.url}{CHAT}", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=120
    )
    assert r.status_code == 200, r.text
    out: dict[int, dict[str, Any]] = {}
    usage = None
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            got = out.setdefault(choice["index"], {"content": "", "reasoning": "", "calls": [], "finish": None})
            delta = choice["delta"]
            got["content"] += delta.get("content") or ""
            got["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                if "id" in call:
                    assert call["index"] == len(got["calls"]) and call["function"]["arguments"] == ""
                    got["calls"].append([call["function"]["name"], ""])
                else:
                    got["calls"][call["index"]][1] += call["function"]["arguments"]
            got["finish"] = choice["finish_reason"] or got["finish"]
    return [*(out[i] for i in sorted(out)), {"usage": usage}]


def check_whole_and_streamed_agree(server: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    body = {"messages": MSG, **body}
    r = httpx.post(f"{server.url}{CHAT}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    whole = r.json()
    *streams, usage = streamed_choices(server, body)
    # the same counts (the stream's prompt was cached by the answer asked first)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: usage["usage"][k] for k in counts} == {k: whole["usage"][k] for k in counts}
    assert len(streams) == len(whole["choices"]) == body.get("n", 1)
    for choice, stream in zip(whole["choices"], streams):
        message = choice["message"]
        calls = message.get("tool_calls") or []
        assert all(c["id"].startswith("call_") for c in calls)
        assert stream["content"] == (message["content"] or "")
        assert stream["reasoning"] == (message.get("reasoning_content") or "")
        assert stream["calls"] == [[c["function"]["name"], c["function"]["arguments"]] for c in calls]
        assert stream["finish"] == choice["finish_reason"]
        if calls:
            assert choice["finish_reason"] == "tool_calls"
            for c in calls:
                jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return whole


@pytest.mark.parametrize("body", ANSWERS)
def test_whole_and_streamed_answers_agree(server: RunningServer, body: dict[str, Any]) -> None:
    check_whole_and_streamed_agree(server, body)


def test_the_server_still_serves_after_refusals(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=MSG, tools=TOOLS, tool_choice="required", seed=0, max_tokens=120
    )
    assert calls_of(r)


# ---- reasoning, and calls without the constraint ----


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[RunningServer]:
    with running_server("--reasoning-parser", "deepseek_r1") as s:
        yield s


def test_reasoning_comes_apart_and_structure_applies_after_it(thinking_server: RunningServer) -> None:
    with client_of(thinking_server) as client:
        check_reasoning(client)


def test_reasoning_alone_whole_and_streamed_agree(thinking_server: RunningServer) -> None:
    # (then a document, then calls: check_reasoning)
    body = {"temperature": 1.0, "seed": 2, "max_tokens": 60, "logit_bias": {THINK_END: 8}}
    message = check_whole_and_streamed_agree(thinking_server, body)["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"], message


def stream_deltas(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The deltas of a streamed chat's one choice, in order."""
    r = httpx.post(f"{server.url}{CHAT}", json={"messages": MSG, **body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return [json.loads(ln)["choices"][0]["delta"] for ln in lines]


THINKING = {"temperature": 1.0, "seed": 2, "max_tokens": 60, "logit_bias": {THINK_END: 8}}


def test_include_reasoning_false_returns_no_reasoning_whole_or_streamed(thinking_server: RunningServer) -> None:
    shown = httpx.post(f"{thinking_server.url}{CHAT}", json={"messages": MSG, **THINKING}, timeout=120).json()
    body = {**THINKING, "include_reasoning": False}
    hidden = httpx.post(f"{thinking_server.url}{CHAT}", json={"messages": MSG, **body}, timeout=120).json()
    assert shown["choices"][0]["message"]["reasoning_content"], "the output has reasoning"
    message = hidden["choices"][0]["message"]
    assert "reasoning_content" not in message, message
    assert message["content"] == shown["choices"][0]["message"]["content"], "still parsed apart"
    deltas = stream_deltas(thinking_server, body)
    assert not [d for d in deltas if "reasoning_content" in d], deltas
    assert "".join(d.get("content") or "" for d in deltas) == (message["content"] or "")


@pytest.mark.parametrize("ends", [True, False], ids=["closed", "never-closed"])
def test_stream_reasoning_false_sends_the_reasoning_as_one_delta(thinking_server: RunningServer, ends: bool) -> None:
    body = THINKING if ends else {**THINKING, "logit_bias": {THINK_END: -100}, "max_tokens": 20}
    whole = httpx.post(f"{thinking_server.url}{CHAT}", json={"messages": MSG, **body}, timeout=120).json()
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] and (message["content"] is not None) == ends, message
    streamed = stream_deltas(thinking_server, body)
    assert len([d for d in streamed if "reasoning_content" in d]) > 1, "by default it streams as it comes"
    deltas = stream_deltas(thinking_server, {**body, "stream_reasoning": False})
    at = [i for i, d in enumerate(deltas) if "reasoning_content" in d]
    assert len(at) == 1 and deltas[at[0]]["reasoning_content"] == message["reasoning_content"], deltas
    contents = [i for i, d in enumerate(deltas) if d.get("content")]
    assert all(i > at[0] for i in contents), "the reasoning comes when it ends, before the content"
    assert "".join(d.get("content") or "" for d in deltas) == (message["content"] or "")


def check_reasoning(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"enum": [1, 2, 3]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    for seed in range(3):
        kw = {
            "model": "tiny",
            "messages": MSG,
            "seed": seed,
            "max_tokens": 200,
            "logit_bias": {THINK_END: 12},
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        }
        whole = client.chat.completions.create(**kw)
        jsonschema.validate(json.loads(whole.choices[0].message.content or ""), schema)
        stream = streamed(client, **kw)
        assert stream.choices[0].message.content == whole.choices[0].message.content
        extra = whole.choices[0].message.model_extra or {}
        assert "reasoning_content" in extra
        streamed_reasoning = "".join(  # not in the accumulator's model: read from the raw chunks
            (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            for c in client.chat.completions.create(stream=True, **kw)
            if c.choices
        )
        assert streamed_reasoning == (extra["reasoning_content"] or "")
    # tools after the thinking
    kw = {
        "model": "tiny",
        "messages": MSG,
        "tools": TOOLS,
        "tool_choice": "required",
        "seed": 0,
        "max_tokens": 200,
        "logit_bias": {THINK_END: 12, TOOL_CALL: 12},
    }
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls" and calls_of(whole)
    assert calls_of(streamed(client, **kw)) == calls_of(whole)


def test_the_constraint_can_be_turned_off() -> None:
    with running_server("--disable-tool-call-constraint", "--tool-call-parser", "hermes") as s, client_of(s) as client:
        r = client.chat.completions.create(
            model="tiny", messages=MSG, tools=TOOLS, tool_choice="required", seed=0, max_tokens=6
        )
        # the random model's free text is no call: parsed as content, not forced into one
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
        # auto with response_format needs the constraint to tell an answer from calls
        r2 = httpx.post(
            f"{s.url}{CHAT}",
            json={"messages": MSG, "tools": TOOLS, "max_tokens": 4, "response_format": {"type": "json_object"}},
            timeout=60,
        )
        assert r2.status_code == 400 and r2.json()["error"]["param"] == "response_format", r2.text
        info = httpx.get(f"{s.url}/server_info", timeout=30).json()["settings"]
        assert info["disable_tool_call_constraint"] is True and info["tool_call_parser"] == "hermes"
