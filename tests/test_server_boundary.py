"""What the HTTP boundary lets in: fields (unknown ones refused, OpenAI's harmless ones
ignored, vLLM's guided_* mapped, cache_salt honoured), body size and type, and prompts
too long to tokenize; against a real ``ferrolm serve``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from ferrolm.server.testing import RunningServer, running_server

MAX_BODY = 1024 * 1024
MSG = [{"role": "user", "content": "hi"}]
C, CHAT, G = "/v1/completions", "/v1/chat/completions", "/generate"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-request-bytes", str(MAX_BODY), "--max-total-tokens", "8192") as s:
        yield s


def post(server: RunningServer, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    return error


# ---- fields: none is dropped without a word ----

UNKNOWN = [
    pytest.param(C, {"prompt": "x", "max_tokenz": 3}, "max_tokenz", id="misspelled"),
    pytest.param(C, {"prompt": "x", "session_params": {"id": "s"}}, "session_params", id="session_params"),
    pytest.param(
        C,
        {"prompt": "x", "guided_decoding_backend": "xgrammar"},
        "guided_decoding_backend",
        id="guided_decoding_backend",
    ),
    pytest.param(CHAT, {"messages": MSG, "functions": [{"name": "f"}]}, "functions", id="legacy-functions"),
    pytest.param(
        CHAT,
        {"messages": MSG, "stream_options": {"include_usag": True}},
        "stream_options.include_usag",
        id="nested-misspelled",
    ),
    pytest.param(
        CHAT, {"messages": [{"role": "user", "contnet": "hi"}]}, "messages.0.contnet", id="message-misspelled"
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "x",
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}, "extra": 1}
                    ],
                }
            ]
        },
        "messages.0.tool_calls.0.extra",
        id="message-tool-call-misspelled",
    ),
    pytest.param(G, {"text": "x", "lora_id": "adapter-1"}, "lora_id", id="native-lora_id"),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"max_new_token": 3}},
        "sampling_params.max_new_token",
        id="native-sampling-misspelled",
    ),
    pytest.param("/abort_request", {"rid": "x", "abort_everything": True}, "abort_everything", id="abort-unknown"),
    pytest.param("/flush_cache", {"force": True}, "force", id="flush-unknown"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNKNOWN)
def test_unknown_and_unsupported_fields_are_a_400_naming_them(
    server: RunningServer, path: str, body: dict[str, Any], param: str
) -> None:
    error = assert_error(post(server, path, body), 400, param)
    assert error["message"].startswith(f"{param}:")


def test_unsupported_fields_say_why(server: RunningServer) -> None:
    error = assert_error(post(server, C, {"prompt": "x", "session_params": {"id": "a"}}), 400, "session_params")
    assert "sessions" in error["message"]
    error = assert_error(post(server, C, {"prompt": "x", "max_tokenz": 1}), 400, "max_tokenz")
    assert "unknown field" in error["message"] and "max_tokens" in error["message"]


def test_openai_fields_that_change_nothing_are_accepted(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0}
    plain = client.chat.completions.create(messages=MSG, **kw)  # type: ignore[arg-type]
    ignored = client.chat.completions.create(
        messages=MSG,
        user="u-1",
        store=False,
        metadata={"team": "a"},
        service_tier="auto",
        parallel_tool_calls=False,
        safety_identifier="s-1",
        prompt_cache_key="k",
        **kw,
    )  # type: ignore[call-overload]
    assert ignored.choices[0].message.content == plain.choices[0].message.content
    completion = client.completions.create(prompt="hi", user="u-1", **kw)
    assert completion.choices[0].finish_reason in ("length", "stop")
    # llama.cpp's clients (and the e2e benchmark against its server) send cache_prompt
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": MSG}
    cached = post(server, CHAT, {**body, "cache_prompt": True})
    assert cached.status_code == 200, cached.text
    assert cached.json()["choices"][0]["message"]["content"] == plain.choices[0].message.content
    assert post(server, C, {"prompt": "hi", "max_tokens": 2, "cache_prompt": False}).status_code == 200
    assert_error(post(server, C, {"prompt": "hi", "max_tokens": 2, "cache_prompt": "yes"}), 400, "cache_prompt")


def test_assistant_messages_sent_back_as_openai_returns_them(server: RunningServer) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "refusal": None, "tool_calls": None, "annotations": []},
        {"role": "user", "content": "again", "name": "bob"},
    ]
    r = post(server, CHAT, {"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


# ---- vLLM's guided_* fields map onto structured output ----


def test_guided_regex_and_choice(server: RunningServer) -> None:
    pattern = "[a-z]{3}-[0-9]{2}"
    r = post(server, C, {"prompt": "code:", "guided_regex": pattern, "max_tokens": 24, "seed": 1}).json()
    assert re.fullmatch(pattern, r["choices"][0]["text"]), r
    choices = ["alpha", "beta", "gamma"]
    for seed in range(3):
        r = post(server, CHAT, {"messages": MSG, "guided_choice": choices, "max_tokens": 10, "seed": seed}).json()
        assert r["choices"][0]["message"]["content"] in choices, r


def test_guided_json(server: RunningServer) -> None:
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for guided in (schema, json.dumps(schema)):
        r = post(server, C, {"prompt": "JSON:", "guided_json": guided, "max_tokens": 30}).json()
        jsonschema.validate(json.loads(r["choices"][0]["text"]), schema)


GUIDED_BAD = [
    pytest.param({"prompt": "x", "guided_regex": "(("}, "guided_regex", id="regex-does-not-compile"),
    pytest.param({"prompt": "x", "guided_regex": "a", "regex": "b"}, "guided_regex", id="two-constraints"),
    pytest.param({"prompt": "x", "guided_choice": []}, "guided_choice", id="no-choices"),
    pytest.param({"prompt": "x", "guided_json": 5}, "guided_json", id="schema-a-number"),
    pytest.param({"prompt": "x", "guided_grammar": "root ::= 'a'"}, "guided_grammar", id="grammar-single-quotes"),
]


@pytest.mark.parametrize(("body", "param"), GUIDED_BAD)
def test_guided_fields_refused_naming_them(server: RunningServer, body: dict[str, Any], param: str) -> None:
    assert_error(post(server, C, body), 400, param)


# ---- cache_salt: the prefix cache's namespace ----


def cached_tokens(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    body = r.json()
    if "usage" in body:
        return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    return int(body["meta_info"]["cached_tokens"])


@pytest.mark.parametrize("path", [C, CHAT, G])
def test_cache_salt_separates_cached_prefixes(server: RunningServer, path: str) -> None:
    shared = f"A long shared system prompt for {path}, about the tenants of a server; " * 6

    def ask(suffix: str, salt: str | None) -> int:
        body: dict[str, Any]
        if path == C:
            body = {"prompt": shared + suffix, "max_tokens": 1}
        elif path == CHAT:
            body = {
                "messages": [{"role": "system", "content": shared}, {"role": "user", "content": suffix}],
                "max_tokens": 1,
            }
        else:
            body = {"text": shared + suffix, "sampling_params": {"max_new_tokens": 1}}
        if salt is not None:
            body["cache_salt"] = salt
        return cached_tokens(post(server, path, body))

    a, b = f"tenant-a{path}", f"tenant-b{path}"  # salts of this test only
    assert ask("first", a) == 0
    shared_tokens = ask("second", a)
    assert shared_tokens > 0, "the same salt shares the prefix"
    assert ask("third", b) == 0, "another salt sees nothing of tenant a's"
    # the unsalted namespace may hold a template's first tokens from other tests, never a's prefix
    assert ask("fourth", None) < shared_tokens // 2, "no salt sees nothing of tenant a's"
    assert ask("fifth", b) >= shared_tokens


def test_cache_salt_must_be_a_non_empty_string(server: RunningServer) -> None:
    assert_error(post(server, C, {"prompt": "x", "cache_salt": ""}), 400, "cache_salt")
    assert_error(post(server, C, {"prompt": "x", "cache_salt": 5}), 400, "cache_salt")


# ---- size: bodies and prompts ----


def test_a_body_over_the_limit_is_a_413(server: RunningServer) -> None:
    body = {"prompt": "x" * MAX_BODY, "max_tokens": 1}
    error = assert_error(post(server, C, body), 413, None)
    assert str(MAX_BODY) in error["message"] and error["code"] == "request_too_large"
    assert httpx.get(f"{server.url}/v1/models").status_code == 200


def test_a_chunked_body_over_the_limit_is_a_413(server: RunningServer) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 4096 + 1):
            yield b"y" * 4096
        yield b'", "max_tokens": 1}'

    r = httpx.post(f"{server.url}{C}", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert "content-length" not in r.request.headers
    assert_error(r, 413, None)
    small = httpx.post(
        f"{server.url}{C}",
        content=iter([b'{"prompt": "hi", ', b'"max_tokens": 1}']),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert small.status_code == 200, small.text


@pytest.mark.parametrize(("path", "field"), [(C, "prompt"), (G, "text"), (CHAT, "messages")])
def test_a_text_too_long_for_any_tokenization_is_refused_untokenized(
    server: RunningServer, path: str, field: str
) -> None:
    text = "word " * (MAX_BODY // 6)  # under the body limit; over the context at the fewest tokens it could be
    bodies: dict[str, dict[str, Any]] = {
        C: {"prompt": text},
        G: {"text": text},
        CHAT: {"messages": [{"role": "user", "content": text}]},
    }
    body = bodies[path]
    error = assert_error(post(server, path, body), 400, field)
    assert "at least" in error["message"], error  # the bound's refusal, not the tokenizer's count


# ---- content type: a web page cannot drive the API ----

FORM_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    None,
    "application/json; charset=latin-1",
    "application/jsonp",
    "text/json",
]


@pytest.mark.parametrize("content_type", FORM_TYPES)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (C, b'{"prompt": "x", "max_tokens": 1}'),
        ("/abort_request", b'{"abort_all": true}'),
        ("/flush_cache", b""),
        (G, b'{"text": "x"}'),
        (CHAT, b'{"messages": [{"role": "user", "content": "x"}]}'),
    ],
)
def test_a_post_that_is_not_json_is_a_415(
    server: RunningServer, path: str, body: bytes, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=60)
    if content_type is None and not body:
        # no body and no type: SGLang's documented `curl -X POST .../flush_cache`
        assert r.status_code == 200, r.text
        return
    assert assert_error(r, 415, None)["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", 'Application/JSON;charset="UTF-8"']
)
def test_json_content_types_are_accepted(server: RunningServer, content_type: str) -> None:
    r = httpx.post(
        f"{server.url}{C}",
        content=b'{"prompt": "x", "max_tokens": 1}',
        headers={"content-type": content_type},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/flush_cache", headers={"content-type": content_type}, timeout=60)
    assert r.status_code == 200, r.text


def test_flush_cache_is_not_a_get(server: RunningServer) -> None:
    r = httpx.get(f"{server.url}/flush_cache", timeout=60)
    assert r.status_code == 405 and "error" in r.json()
