"""Bad requests get status 400 (never 422 or 500) with OpenAI's error envelope naming the
field at fault, and leave the server serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ferrolm.server.testing import RunningServer, running_server

CONTEXT = 4096  # the tiny model's context
KV = 1024


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-total-tokens", str(KV)) as s:
        yield s


def post(server: RunningServer, path: str, body: Any, raw: bool = False) -> httpx.Response:
    if raw:
        return httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def assert_envelope(r: httpx.Response, status: int, param: str | None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param, error


C = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

BAD = [
    pytest.param(C, {"prompt": "x", "max_tokens": "ten"}, "max_tokens", id="wrong-type-int"),
    pytest.param(C, {"prompt": "x", "temperature": "hot"}, "temperature", id="wrong-type-float"),
    pytest.param(C, {"prompt": "x", "stream": "yes"}, "stream", id="wrong-type-bool"),
    pytest.param(C, {"prompt": 5}, "prompt", id="prompt-a-number"),
    pytest.param(C, {"max_tokens": 3}, "prompt", id="prompt-missing"),
    pytest.param(C, {"prompt": ""}, "prompt", id="prompt-empty"),
    pytest.param(C, {"prompt": []}, "prompt", id="prompt-empty-list"),
    pytest.param(C, {"prompt": "x", "temperature": -0.5}, "temperature", id="temperature-negative"),
    pytest.param(C, {"prompt": "x", "temperature": 1e9}, "temperature", id="temperature-absurd"),
    pytest.param(C, {"prompt": "x", "top_p": 1.5}, "top_p", id="top_p-above-1"),
    pytest.param(C, {"prompt": "x", "n": 0}, "n", id="n-zero"),
    pytest.param(C, {"prompt": "x", "max_tokens": 0}, "max_tokens", id="max_tokens-zero"),
    pytest.param(C, {"prompt": "x", "max_tokens": CONTEXT}, "max_tokens", id="max_tokens-beyond-context"),
    pytest.param(C, {"prompt": "x", "logprobs": 50}, "logprobs", id="logprobs-too-many"),
    pytest.param(C, {"prompt": "x", "frequency_penalty": 3}, "frequency_penalty", id="penalty-out-of-range"),
    pytest.param(C, {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias", id="logit_bias-key"),
    pytest.param(C, {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias", id="logit_bias-outside-vocab"),
    pytest.param(C, {"prompt": "x", "stop": [""]}, "stop", id="stop-empty"),
    pytest.param(C, {"prompt": "x", "seed": -1}, "seed", id="seed-negative"),
    pytest.param(C, {"prompt": [1, 2, 99999]}, "prompt", id="ids-outside-vocab"),
    pytest.param(C, {"prompt": [-1]}, "prompt", id="ids-negative"),
    pytest.param(C, {"prompt": "word " * (KV + 10), "max_tokens": 1}, "prompt", id="prompt-too-long"),
    pytest.param(C, {"prompt": "x", "echo": True, "stream": True}, "echo", id="echo-streamed-unsupported"),
    pytest.param(C, {"prompt": "x", "best_of": 3}, "best_of", id="best_of-unsupported"),
    pytest.param(
        C, {"prompt": "x", "response_format": {"type": "xml"}}, "response_format.type", id="response_format-unknown"
    ),
    pytest.param(CHAT, {"messages": []}, "messages", id="chat-no-messages"),
    pytest.param(CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", id="chat-bad-role"),
    pytest.param(CHAT, {"messages": [{"role": "user", "content": 3}]}, "messages.0.content", id="chat-content-type"),
    pytest.param(CHAT, {"messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens", id="chat-max-zero"),
    pytest.param(CHAT, {"messages": MSG, "top_logprobs": 2}, "top_logprobs", id="chat-top-without-logprobs"),
    pytest.param(
        CHAT, {"messages": MSG, "tools": [{"type": "function"}]}, "tools.0.function", id="chat-tool-incomplete"
    ),
    pytest.param(
        CHAT, {"messages": [{"role": "user", "content": "word " * (KV + 10)}]}, "messages", id="chat-prompt-too-long"
    ),
    pytest.param("/generate", {"sampling_params": {"max_new_tokens": 1}}, "text", id="generate-no-prompt"),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"temperature": -1}},
        "sampling_params.temperature",
        id="generate-temperature",
    ),
    pytest.param("/generate", {"input_ids": [99999]}, "input_ids", id="generate-ids-outside-vocab"),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"stop_token_ids": [99999]}},
        "sampling_params.stop_token_ids",
        id="generate-stop-token-outside-vocab",
    ),
]


# numbers the engine core could not even receive (u32 token ids and top_k, u64 counts and
# seeds, i64 priority, finite floats): a 400 naming the field, never an overflow's 500
G = "/generate"
BIG = [
    pytest.param(C, {"prompt": "x", "max_tokens": 2**64}, "max_tokens", id="max_tokens-2**64"),
    pytest.param(C, {"prompt": "x", "max_tokens": 2**63}, "max_tokens", id="max_tokens-beyond-context-u64"),
    pytest.param(C, {"prompt": "x", "max_tokens": 10**40}, "max_tokens", id="max_tokens-10**40"),
    pytest.param(
        CHAT,
        {"messages": MSG, "max_completion_tokens": 2**64},
        "max_completion_tokens",
        id="max_completion_tokens-2**64",
    ),
    pytest.param(CHAT, {"messages": MSG, "max_tokens": 2**64}, "max_tokens", id="chat-max_tokens-2**64"),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"max_new_tokens": 2**64}},
        "sampling_params.max_new_tokens",
        id="max_new_tokens-2**64",
    ),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"max_new_tokens": 2**62}},
        "sampling_params.max_new_tokens",
        id="max_new_tokens-beyond-context-u64",
    ),
    pytest.param(C, {"prompt": "x", "min_tokens": 2**64}, "min_tokens", id="min_tokens-2**64"),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"min_new_tokens": 2**64}},
        "sampling_params.min_new_tokens",
        id="min_new_tokens-2**64",
    ),
    pytest.param(C, {"prompt": "x", "top_k": 2**32}, "top_k", id="top_k-2**32"),
    pytest.param(CHAT, {"messages": MSG, "top_k": 2**32}, "top_k", id="chat-top_k-2**32"),
    pytest.param(G, {"text": "x", "sampling_params": {"top_k": 2**32}}, "sampling_params.top_k", id="native-top_k"),
    pytest.param(C, {"prompt": "x", "priority": 2**63}, "priority", id="priority-above-i64"),
    pytest.param(C, {"prompt": "x", "priority": -(2**63) - 1}, "priority", id="priority-below-i64"),
    pytest.param(G, {"text": "x", "priority": 2**63}, "priority", id="native-priority"),
    pytest.param(C, {"prompt": "x", "seed": 2**64}, "seed", id="seed-2**64"),
    pytest.param(C, {"prompt": "x", "logit_bias": {str(2**32): 1}}, "logit_bias", id="logit_bias-key-2**32"),
    pytest.param(C, {"prompt": "x", "logit_bias": {"9" * 5000: 1}}, "logit_bias", id="logit_bias-key-5000-digits"),
    pytest.param(
        C,
        {"prompt": "x", "logit_bias": {"0" * 5000 + "99999": 1}},
        "logit_bias",
        id="logit_bias-key-5000-zeros-outside-vocab",
    ),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"logit_bias": {str(2**40): 1}}},
        "sampling_params.logit_bias",
        id="native-logit_bias-key",
    ),
    pytest.param(C, {"prompt": "x", "stop_token_ids": [2**32]}, "stop_token_ids", id="stop_token_ids-2**32"),
    pytest.param(C, {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", id="stop_token_ids-negative"),
    pytest.param(
        G,
        {"text": "x", "sampling_params": {"stop_token_ids": [2**64]}},
        "sampling_params.stop_token_ids",
        id="native-stop_token_ids",
    ),
    pytest.param(C, {"prompt": [1, 2**32]}, "prompt", id="prompt-id-2**32"),
    pytest.param(C, {"prompt": [[1], [2**64]]}, "prompt", id="prompts-id-2**64"),
    pytest.param(G, {"input_ids": [2**40]}, "input_ids", id="input_ids-2**40"),
    pytest.param(C, {"prompt": "x", "best_of": 2**64}, "best_of", id="best_of-2**64"),
]
BIG += [
    pytest.param(C, {"prompt": "x", "logit_bias": {key: 1}}, "logit_bias", id=f"logit_bias-key-{name}")
    for name, key in [
        ("space", " 5"),
        ("plus", "+5"),
        ("underscore", "1_000"),
        ("arabic-digit", "\u0663"),
        ("minus", "-1"),
        ("empty", ""),
        ("trailing-space", "5 "),
        ("fullwidth", "\uff15"),
    ]
]
BAD += BIG

# non-finite floats: JSON has none, but Python's json (and others) write NaN and Infinity,
# and 1e400 overflows to infinity
NON_FINITE = [
    (C, b'{"prompt": "x", "temperature": NaN}', "temperature"),
    (C, b'{"prompt": "x", "top_p": Infinity}', "top_p"),
    (C, b'{"prompt": "x", "temperature": 1e400}', "temperature"),
    (C, b'{"prompt": "x", "logit_bias": {"5": -Infinity}}', "logit_bias"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "presence_penalty": NaN}', "presence_penalty"),
    (G, b'{"text": "x", "sampling_params": {"min_p": NaN}}', "sampling_params.min_p"),
    (G, b'{"text": "x", "sampling_params": {"repetition_penalty": Infinity}}', "sampling_params.repetition_penalty"),
]


@pytest.mark.parametrize(("path", "raw", "param"), NON_FINITE)
def test_non_finite_numbers_are_a_400_naming_the_field(
    server: RunningServer, path: str, raw: bytes, param: str
) -> None:
    assert_envelope(post(server, path, raw, raw=True), 400, param)


BAD += [
    pytest.param(
        CHAT,
        {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        id="response_format-without-schema",
    ),
    pytest.param(
        C, {"prompt": "x", "regex": "a+", "json_schema": {"type": "object"}}, "json_schema", id="two-constraints"
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field(
    server: RunningServer, path: str, body: dict[str, Any], param: str
) -> None:
    assert_envelope(post(server, path, body), 400, param)
    if "stream" not in body:  # a streamed request is refused the same way, before any event
        assert_envelope(post(server, path, {**body, "stream": True}), 400, param)


def test_an_unknown_model_is_a_404_naming_the_field(server: RunningServer) -> None:
    for path, body in ((C, {"prompt": "x", "model": "gpt-4"}), (CHAT, {"messages": MSG, "model": "gpt-4"})):
        for stream in (False, True):
            r = post(server, path, {**body, "stream": stream})
            assert_envelope(r, 404, "model")
            error = r.json()["error"]
            assert "gpt-4" in error["message"] and error["code"] == "model_not_found"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null", b'{"prompt": "x",}'])
def test_malformed_json_is_a_400(server: RunningServer, raw: bytes) -> None:
    for path in (C, CHAT, "/generate"):
        assert_envelope(post(server, path, raw, raw=True), 400, None)


def test_unknown_route_and_method(server: RunningServer) -> None:
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_server_still_serves_after_bad_input(server: RunningServer) -> None:
    r = post(server, C, {"prompt": "still here", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    info = httpx.get(f"{server.url}/server_info").json()["load"]
    assert info["waiting"] == 0 and info["running"] == 0 and info["kv_used"] == info["cached_tokens"]
