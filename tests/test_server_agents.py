"""The APIs agents speak, on ``ferrolm serve --model tiny``: OpenAI's Responses API
(``/v1/responses``), Anthropic's Messages API (``/v1/messages``) and vLLM's ``/tokenize`` and
``/detokenize``. Through the official SDKs, streamed and not (every stream parsed with
warnings as errors), and through raw HTTP for what the SDKs hide (event order, sequence
numbers, envelopes, the Anthropic SDK absent). Calls under ``required`` / ``any`` validate
against their schema; every field of each request schema (as the installed SDK types it) is
known to the server: honoured, accepted for a stated reason, or refused by name."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from ferrolm.server.testing import RunningServer, running_server, wait_until

try:
    import anthropic
except ImportError:  # the dev extra installs it
    anthropic = None

needs_anthropic = pytest.mark.skipif(
    anthropic is None, reason="the anthropic SDK is not installed (pip install 'anthropic>=0.60', in the dev extra)"
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
MOVE = {
    "type": "object",
    "properties": {"to": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}},
    "required": ["to"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "move": MOVE}
ANSWER = {
    "type": "object",
    "properties": {"n": {"enum": [1, 2, 3]}, "why": {"type": "string", "maxLength": 20}},
    "required": ["n", "why"],
    "additionalProperties": False,
}
RESPONSE_TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": schema, "strict": True} for name, schema in SCHEMAS.items()
]
MESSAGE_TOOLS: list[Any] = [{"name": name, "input_schema": schema} for name, schema in SCHEMAS.items()]
KEY = "agents-key"


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[RunningServer]:
    """A server that reads ``<think>`` apart and wants a key (Anthropic's SDK sends it as
    ``x-api-key``)."""
    with running_server("--reasoning-parser", "deepseek_r1", api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def anthropic_client(server: RunningServer, key: str = "unused") -> Any:
    assert anthropic is not None
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def sse_events(server: RunningServer, path: str, body: dict[str, Any], **kw: Any) -> list[tuple[str, dict[str, Any]]]:
    """A raw stream's (event name, data) pairs; every data line is JSON."""
    out: list[tuple[str, dict[str, Any]]] = []
    name = ""
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120, **kw) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[len("data: ") :])))
    return out


def no_warnings() -> Any:
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("error")
    return w


# ---- /tokenize and /detokenize ----


def test_tokenize_a_prompt_and_back(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/tokenize", json={"model": "tiny", "prompt": "Hello there, world"}, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["count"] == len(got["tokens"]) > 0 and got["max_model_len"] > 0 and got["token_strs"] is None
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": got["tokens"]}, timeout=30).json()
    assert back["prompt"].endswith("Hello there, world")
    strs = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello", "return_token_strs": True}, timeout=30).json()
    assert len(strs["token_strs"]) == strs["count"]


def test_tokenize_messages_counts_what_chat_sends(server: RunningServer, oai: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    with_prompt = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=30).json()
    without = httpx.post(
        f"{server.url}/tokenize", json={"messages": messages, "add_generation_prompt": False}, timeout=30
    ).json()
    assert without["count"] < with_prompt["count"]
    assert with_prompt["tokens"][: without["count"]] == without["tokens"]
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.prompt_tokens == with_prompt["count"]


def test_tokenize_refuses_bad_input_naming_the_field(server: RunningServer) -> None:
    for path, body, param in [
        ("/tokenize", {"prompt": "x", "chat_template": "{{ x }}"}, "chat_template"),
        ("/tokenize", {"prompt": "x", "bogus": 1}, "bogus"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ("/tokenize", {"prompt": "x", "messages": []}, "messages"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ]:
        r = httpx.post(f"{server.url}{path}", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


# ---- /v1/responses through the openai SDK ----


def calls_of_response(response: Any) -> list[tuple[str, str]]:
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return [(c.name, c.arguments) for c in calls]


def streamed_response(client: openai.OpenAI, **kw: Any) -> Any:
    """The response a stream ends with: ``response.completed``'s, put together by the SDK,
    or ``response.incomplete``'s (the SDK's final response is only a completed one)."""
    w = no_warnings()
    try:
        with client.responses.stream(**kw) as stream:
            last = None
            for event in stream:
                if event.type in ("response.completed", "response.incomplete"):
                    last = event
            assert last is not None
            return stream.get_final_response() if last.type == "response.completed" else last.response
    finally:
        w.__exit__(None, None, None)


def test_responses_text_whole_and_streamed_agree(oai: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "input": "Tell me a story", "max_output_tokens": 12, "temperature": 0}
    whole = oai.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.output_text and whole.output[0].type == "message"
    assert whole.usage is not None and whole.usage.output_tokens == 12
    assert whole.usage.input_tokens_details.cached_tokens >= 0
    stream = streamed_response(oai, **kw)
    assert stream.output_text == whole.output_text


def test_responses_required_calls_validate_whole_and_streamed(oai: openai.OpenAI) -> None:
    for seed_input in ["Weather in Paris?", "Move the pieces", "What now?"]:
        kw: Any = {
            "model": "tiny",
            "input": [{"role": "user", "content": seed_input}],
            "tools": RESPONSE_TOOLS,
            "tool_choice": "required",
            "max_output_tokens": 200,
            "temperature": 0,
        }
        whole = oai.responses.create(**kw)
        assert whole.status == "completed", whole
        calls = calls_of_response(whole)
        assert calls
        assert calls_of_response(streamed_response(oai, **kw)) == calls
        one = oai.responses.create(**{**kw, "parallel_tool_calls": False, "temperature": 1.0})
        assert len(calls_of_response(one)) == 1
        named = oai.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "move"}})
        assert {name for name, _ in calls_of_response(named)} == {"move"}


def test_responses_multi_turn_with_tool_results_and_the_store(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model="tiny",
        instructions="You answer with tools.",
        input="Weather in Paris?",
        tools=RESPONSE_TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0,
        metadata={"turn": "1"},
    )
    [(name, arguments)] = calls_of_response(first)
    call = next(item for item in first.output if item.type == "function_call")
    assert first.metadata == {"turn": "1"} and first.instructions == "You answer with tools."
    # the store: the same response back, and the conversation carried on
    again = oai.responses.retrieve(first.id)
    assert again.id == first.id and calls_of_response(again) == [(name, arguments)]
    second = oai.responses.create(
        model="tiny",
        previous_response_id=first.id,
        tools=RESPONSE_TOOLS,  # tools are not carried over, as in OpenAI's API
        instructions="You answer with tools.",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}],
        max_output_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.output_text
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    # the earlier turn's prompt is in the prefix cache
    assert second.usage.input_tokens_details.cached_tokens > 0
    # the same turn sent whole, without the store: the same prompt
    explicit = oai.responses.create(
        model="tiny",
        tools=RESPONSE_TOOLS,
        instructions="You answer with tools.",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": name, "arguments": arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
        ],
        max_output_tokens=8,
        temperature=0,
        store=False,
    )
    assert explicit.usage is not None and explicit.usage.input_tokens == second.usage.input_tokens
    assert explicit.output_text == second.output_text
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(explicit.id)
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny", previous_response_id="resp_nope", input="x")
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_responses_structured_output(oai: openai.OpenAI) -> None:
    kw: Any = {
        "model": "tiny",
        "input": "Pick a number",
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
        "max_output_tokens": 100,
        "temperature": 0,
    }
    whole = oai.responses.create(**kw)
    jsonschema.validate(json.loads(whole.output_text), ANSWER)
    assert streamed_response(oai, **kw).output_text == whole.output_text


def test_responses_bad_input_names_the_field(oai: openai.OpenAI) -> None:
    for kw, param in [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]}, "tools.0.parameters"),
        ({"include": ["file_search_call.results"]}, "include.0"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"tool_choice": {"type": "function", "name": "absent"}, "tools": RESPONSE_TOOLS}, "tool_choice"),
        ({"extra_body": {"bogus": 1}}, "bogus"),
    ]:
        body: Any = {"model": "tiny", "input": "x", "max_output_tokens": 4, **kw}
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(**body)
        err = e.value.body
        assert isinstance(err, dict) and str(err["param"]).startswith(param), (kw, err)
        assert err["message"].startswith(str(err["param"])), err


def sdk_fields(typed_dict: Any) -> set[str]:
    fields: set[str] = set()
    for klass in typed_dict.__mro__:
        fields |= set(getattr(klass, "__annotations__", {}))
    return fields


def check_every_field_is_known(
    server: RunningServer, path: str, base: dict[str, Any], fields: set[str], **kw: Any
) -> None:
    """Each field sent with a value of no accepted shape: a 400 that names it (never as an
    unknown field), or accepted where the field changes no token."""
    for field in sorted(fields):
        body = {**base, field: {"bogus": [1]}}
        r = httpx.post(f"{server.url}{path}", json=body, timeout=60, **kw)
        text = r.text
        if r.status_code == 200:
            continue
        assert r.status_code == 400, (field, text)
        assert field in text and f"{field}: unknown field" not in text, (field, text)


def test_every_responses_field_is_honoured_or_refused_by_name(server: RunningServer) -> None:
    from openai.types.responses import response_create_params as p

    fields = sdk_fields(p.ResponseCreateParamsBase) | {"stream"}
    assert {"input", "tools", "previous_response_id", "store", "text", "reasoning"} <= fields
    check_every_field_is_known(server, "/v1/responses", {"input": "x", "max_output_tokens": 2}, fields)


def test_responses_stream_events_are_typed_and_numbered(server: RunningServer) -> None:
    body = {"input": "Hi", "tools": RESPONSE_TOOLS, "tool_choice": "required", "max_output_tokens": 200, "stream": True}
    events = sse_events(server, "/v1/responses", {**body, "temperature": 0})
    names = [n for n, _ in events]
    assert all(d["type"] == n for n, d in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-1] == "response.completed" and "response.function_call_arguments.done" in names
    deltas = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
    done = [d["arguments"] for n, d in events if n == "response.function_call_arguments.done"]
    assert deltas == "".join(done)
    text = sse_events(server, "/v1/responses", {"input": "Hi", "max_output_tokens": 5, "stream": True})
    names = [n for n, _ in text]
    assert names.index("response.content_part.added") < names.index("response.output_text.delta")
    assert names[-1] == "response.incomplete"


# ---- /v1/messages through the anthropic SDK ----


def tool_uses(message: Any) -> list[tuple[str, Any]]:
    uses = [b for b in message.content if b.type == "tool_use"]
    for u in uses:
        assert u.id.startswith("toolu_")
        jsonschema.validate(u.input, SCHEMAS[u.name])
    return [(u.name, u.input) for u in uses]


def streamed_message(client: Any, **kw: Any) -> Any:
    w = no_warnings()
    try:
        with client.messages.stream(**kw) as stream:
            for _ in stream:
                pass
            return stream.get_final_message()
    finally:
        w.__exit__(None, None, None)


@needs_anthropic
def test_messages_text_whole_and_streamed_agree(server: RunningServer) -> None:
    client = anthropic_client(server)
    kw: Any = {
        "model": "tiny",
        "max_tokens": 12,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 12
    assert [b.type for b in whole.content] == ["text"]
    count = client.messages.count_tokens(model="tiny", system=kw["system"], messages=kw["messages"])
    assert count.input_tokens == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    stream = streamed_message(client, **kw)
    assert stream.content[0].text == whole.content[0].text and stream.stop_reason == "max_tokens"
    # a stop sequence from the answer itself ends it there
    stop = whole.content[0].text[3:7]
    stopped = client.messages.create(**{**kw, "stop_sequences": [stop]})
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stop not in stopped.content[0].text if stopped.content else True


@needs_anthropic
def test_messages_any_tool_calls_validate_whole_and_streamed(server: RunningServer) -> None:
    client = anthropic_client(server)
    for text in ["Weather in Paris?", "Move", "Now what?"]:
        kw: Any = {
            "model": "tiny",
            "max_tokens": 200,
            "messages": [{"role": "user", "content": text}],
            "tools": MESSAGE_TOOLS,
            "tool_choice": {"type": "any"},
            "extra_body": {"temperature": 0},
        }
        whole = client.messages.create(**kw)
        assert whole.stop_reason == "tool_use", whole
        uses = tool_uses(whole)
        assert uses and tool_uses(streamed_message(client, **kw)) == uses
        one = client.messages.create(**{**kw, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
        assert len(tool_uses(one)) == 1
        named = client.messages.create(**{**kw, "tool_choice": {"type": "tool", "name": "move"}})
        assert {n for n, _ in tool_uses(named)} == {"move"}
        none = client.messages.create(**{**kw, "tool_choice": {"type": "none"}, "max_tokens": 6})
        assert not tool_uses(none) and none.stop_reason == "max_tokens"


@needs_anthropic
def test_messages_multi_turn_with_tool_results(server: RunningServer) -> None:
    client = anthropic_client(server)
    kw: Any = {"model": "tiny", "tools": MESSAGE_TOOLS, "extra_body": {"temperature": 0}}
    question = {"role": "user", "content": "Weather in Paris?"}
    first = client.messages.create(
        max_tokens=200, messages=[question], tool_choice={"type": "tool", "name": "get_weather"}, **kw
    )
    [use] = [b for b in first.content if b.type == "tool_use"]
    history = [
        question,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "21 C"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    second = client.messages.create(max_tokens=8, messages=history, **kw)
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) > first.usage.input_tokens
    assert (second.usage.cache_read_input_tokens or 0) > 0  # the first turn's prompt was cached
    streamed = streamed_message(client, max_tokens=8, messages=history, **kw)
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in second.content]
    counted = client.messages.count_tokens(model="tiny", messages=history, tools=MESSAGE_TOOLS)
    assert counted.input_tokens == second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0)


@needs_anthropic
def test_messages_structured_output(server: RunningServer) -> None:
    client = anthropic_client(server)
    kw: Any = {
        "model": "tiny",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Pick a number"}],
        "output_config": {"format": {"type": "json_schema", "schema": ANSWER}},
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**kw)
    jsonschema.validate(json.loads(whole.content[0].text), ANSWER)
    assert whole.stop_reason == "end_turn"
    assert streamed_message(client, **kw).content[0].text == whole.content[0].text


@needs_anthropic
def test_messages_bad_input_gets_anthropics_envelope_naming_the_field(server: RunningServer) -> None:
    client = anthropic_client(server)
    base: Any = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    for kw, field in [
        ({"tools": [{"name": "f", "input_schema": {"type": "nope"}}]}, "tools.0.input_schema"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0.type"),
        ({"container": "c"}, "container"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"extra_body": {"bogus": 1}}, "bogus"),
    ]:
        with pytest.raises(anthropic.BadRequestError) as e:  # type: ignore[union-attr]
            client.messages.create(**{**base, **kw})
        body = e.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith(field), (kw, body)


@needs_anthropic
def test_every_messages_field_is_honoured_or_refused_by_name(server: RunningServer) -> None:
    from anthropic.types import message_create_params as p

    fields = sdk_fields(p.MessageCreateParamsBase) | {"stream", "temperature", "top_p", "top_k"}
    assert {"messages", "system", "tools", "tool_choice", "stop_sequences", "thinking"} <= fields
    base = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    check_every_field_is_known(server, "/v1/messages", base, fields)


@needs_anthropic
def test_messages_thinking_blocks_and_the_key_from_x_api_key(thinking_server: RunningServer) -> None:
    client = anthropic_client(thinking_server, key=KEY)
    kw: Any = {"model": "tiny", "max_tokens": 10, "messages": [{"role": "user", "content": "Think"}]}
    whole = client.messages.create(**kw, extra_body={"temperature": 0})
    assert whole.content[0].type == "thinking" and whole.content[0].thinking, whole
    stream = streamed_message(client, **kw, extra_body={"temperature": 0})
    assert stream.content[0].type == "thinking" and stream.content[0].thinking == whole.content[0].thinking
    with pytest.raises(anthropic.AuthenticationError) as e:  # type: ignore[union-attr]
        anthropic_client(thinking_server, key="wrong").messages.create(**kw)
    assert isinstance(e.value.body, dict) and e.value.body["error"]["type"] == "authentication_error"


def test_responses_reasoning_items(thinking_server: RunningServer) -> None:
    with openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        kw: Any = {"model": "tiny", "input": "Think", "max_output_tokens": 10, "temperature": 0}
        whole = client.responses.create(**kw, reasoning={"effort": "medium", "summary": "auto"})
        item = whole.output[0]
        assert item.type == "reasoning" and item.content and item.content[0].text
        assert item.summary and item.summary[0].text == item.content[0].text
        stream = streamed_response(client, **kw, reasoning={"effort": "medium"})
        assert stream.output[0].type == "reasoning" and stream.output[0].content[0].text == item.content[0].text
        assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens > 0
        # Codex's stateless turns: include the reasoning, hand it back, and the next turn's
        # prompt holds it again (the same prompt as the stored conversation's)
        kept = client.responses.create(**kw, include=["reasoning.encrypted_content"], store=False)
        encrypted = kept.output[0].encrypted_content
        assert kept.output[0].type == "reasoning" and encrypted
        streamed = streamed_response(client, **kw, include=["reasoning.encrypted_content"], store=False)
        assert streamed.output[0].encrypted_content == encrypted
        history = [item.model_dump(exclude_none=True) for item in kept.output]
        for item in history:
            item.pop("content", None)  # what a client that keeps only the opaque part sends
            item.pop("summary", None) if item["type"] == "reasoning" else None
        follow = {**kw, "input": [{"role": "user", "content": "Think"}, *history, {"role": "user", "content": "More"}]}
        with_reasoning = client.responses.create(**follow, store=False)
        stored = client.responses.create(**kw)
        chained = client.responses.create(**{**kw, "input": "More"}, previous_response_id=stored.id)
        assert with_reasoning.usage is not None and chained.usage is not None
        assert with_reasoning.usage.input_tokens == chained.usage.input_tokens


# ---- thinking budgets: the core forces the end of the thinking ----

THINK_END = 32007  # the tiny model's </think>, one token


def generated_ids(server: RunningServer, text: str, stream: bool, **sampling: Any) -> list[int]:
    """The output ids of a native /generate (a stream's last result)."""
    body = {"text": text, "stream": stream, "sampling_params": {"temperature": 0, "ignore_eos": True, **sampling}}
    r = httpx.post(f"{server.url}/generate", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return list(r.json()["output_ids"])
    blocks = [b[len("data: ") :] for b in r.text.split("\n\n") if b.strip()]
    assert blocks[-1] == "[DONE]"
    return list(json.loads(blocks[-2])["output_ids"])


def test_generate_forces_the_end_of_thinking_after_exactly_the_budget(thinking_server: RunningServer) -> None:
    # deepseek_r1: the output thinks from its first token; the tiny model never closes it
    free = generated_ids(thinking_server, "Think", False, max_new_tokens=12)
    assert THINK_END not in free
    for budget in (0, 1, 5):
        for stream in (False, True):
            ids = generated_ids(thinking_server, "Think", stream, max_new_tokens=12, thinking_token_budget=budget)
            assert len(ids) == 12 and ids[:budget] == free[:budget], (budget, stream)
            assert ids[budget] == THINK_END and THINK_END not in ids[:budget], (budget, stream, ids)
    # a prompt that closed the thinking leaves nothing to cap
    closed = generated_ids(thinking_server, "Think</think>", False, max_new_tokens=6, thinking_token_budget=1)
    assert closed == generated_ids(thinking_server, "Think</think>", False, max_new_tokens=6)


def test_chat_thinking_token_budget_cuts_the_reasoning_and_the_answer_follows(thinking_server: RunningServer) -> None:
    with openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        messages: Any = [{"role": "user", "content": "Think"}]

        def ask(max_tokens: int, **extra: Any) -> Any:
            return client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                extra_body={"ignore_eos": True, **extra},
            )

        short = ask(6).choices[0].message.model_extra["reasoning_content"]
        for extra in ({"thinking_token_budget": 6}, {"reasoning_effort": "low"}):  # low: 6 of 30
            got = ask(30, **extra)
            msg = got.choices[0].message
            assert msg.model_extra["reasoning_content"] == short, extra
            assert msg.content, extra
            assert got.usage is not None and got.usage.completion_tokens == 30


@needs_anthropic
def test_messages_thinking_budget_and_effort_cap_the_thinking_block(thinking_server: RunningServer) -> None:
    client = anthropic_client(thinking_server, key=KEY)
    kw: Any = {"model": "tiny", "messages": [{"role": "user", "content": "Think"}], "extra_body": {"temperature": 0}}
    # effort low: a fifth of max_tokens, 8 tokens of thinking; the answer follows
    short = client.messages.create(**kw, max_tokens=8)
    assert [b.type for b in short.content] == ["thinking"], short
    for streamed in (False, True):
        call = streamed_message if streamed else lambda client, **kw: client.messages.create(**kw)
        got = call(client, **kw, max_tokens=40, output_config={"effort": "low"})
        assert got.content[0].type == "thinking" and got.content[0].thinking == short.content[0].thinking, got
        assert got.content[1].type == "text" and got.content[1].text, got
        assert got.usage.output_tokens > 9
    # Anthropic's budget_tokens (at least 1024): the thinking ends there, the answer follows
    long = client.messages.create(**kw, max_tokens=1024)
    got = client.messages.create(**kw, max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024})
    if long.stop_reason == "max_tokens":  # the model thought all 1024 tokens
        assert got.content[0].type == "thinking" and got.content[0].thinking == long.content[0].thinking
        assert got.content[1].type == "text" and got.content[1].text, got
    else:  # it stopped before: nothing to cap
        assert got.content == long.content


def test_responses_reasoning_effort_caps_the_reasoning_item(thinking_server: RunningServer) -> None:
    with openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        kw: Any = {"model": "tiny", "input": "Think", "temperature": 0}
        short = client.responses.create(**kw, max_output_tokens=10)
        assert [item.type for item in short.output] == ["reasoning"], short
        for streamed in (False, True):
            call = streamed_response if streamed else lambda client, **kw: client.responses.create(**kw)
            got = call(client, **kw, max_output_tokens=20, reasoning={"effort": "medium"})  # 10 of 20
            reasoning, answer = got.output[0], got.output[1]
            assert reasoning.type == "reasoning" and reasoning.content[0].text == short.output[0].content[0].text
            assert answer.type == "message" and answer.content[0].text, got
            assert got.usage is not None and got.usage.output_tokens > 11  # 10, the marker, the answer


# ---- the Messages API over raw HTTP (with or without the SDK) ----


def test_messages_raw_stream_has_anthropics_event_sequence(server: RunningServer) -> None:
    body = {
        "model": "tiny",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": MESSAGE_TOOLS,
        "tool_choice": {"type": "any"},
        "temperature": 0,
        "stream": True,
    }
    events = sse_events(server, "/v1/messages", body)
    names = [n for n, _ in events]
    assert all(d["type"] == n for n, d in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
    blocks: dict[int, str] = {}
    for n, d in events:
        if n == "content_block_delta":
            assert d["delta"]["type"] == "input_json_delta"
            blocks[d["index"]] = blocks.get(d["index"], "") + d["delta"]["partial_json"]
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    for i, block in enumerate(starts):
        jsonschema.validate(json.loads(blocks[i]), SCHEMAS[block["name"]])
    end = events[-2][1]
    assert end["delta"]["stop_reason"] == "tool_use" and end["usage"]["output_tokens"] > 0
    # the same whole
    whole = httpx.post(f"{server.url}/v1/messages", json={**body, "stream": False}, timeout=120).json()
    assert [(b["name"], b["input"]) for b in whole["content"]] == [
        (s["name"], json.loads(blocks[i])) for i, s in enumerate(starts)
    ]


def test_messages_raw_errors_use_anthropics_envelope(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/messages", json={"model": "tiny", "messages": []}, timeout=30)
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": r.json()["error"]["message"]},
    }
    assert r.json()["error"]["message"].startswith("messages")
    r = httpx.post(f"{server.url}/v1/messages", content=b"x", headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 415 and r.json()["type"] == "error"
    r = httpx.post(
        f"{server.url}/v1/messages",
        json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "speed": "fast"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith('speed: "fast" is not supported')
    r = httpx.post(f"{server.url}/v1/messages/count_tokens", json={"model": "tiny", "max_tokens": 3}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")


def test_messages_stream_disconnect_frees_the_request(server: RunningServer) -> None:
    body = {"model": "tiny", "max_tokens": 3000, "messages": [{"role": "user", "content": "go on"}], "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(16)]
        assert any(line.startswith("event: content_block_delta") for line in got), got
        load = httpx.get(f"{server.url}/server_info", timeout=30).json()["load"]
        assert load["running"] == 1, load

    def idle() -> Any:
        s = httpx.get(f"{server.url}/server_info", timeout=30).json()["load"]
        return s["running"] == 0 and s["waiting"] == 0 and s

    after = wait_until(idle)
    assert after["kv_used"] == after["cached_tokens"], after
