"""Structured output through the HTTP API (regex, json_schema, response_format), against
both front ends."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

import jsonschema

from ferrolm.server.testing import FRONTENDS, RunningServer, running_server

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
          "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module", params=FRONTENDS)
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with running_server(frontend=request.param) as s:
        yield s


def test_regex_completion_matches(server: RunningServer) -> None:
    pattern = "[a-z]{3}-[0-9]{2}"
    body = {"prompt": "code:", "regex": pattern, "max_tokens": 24, "temperature": 1.0, "seed": 5}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert re.fullmatch(pattern, r["choices"][0]["text"]), r
    assert r["choices"][0]["finish_reason"] == "stop"
    streamed = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60)
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in streamed.text.splitlines()
                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text == r["choices"][0]["text"]


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 20}])
def test_a_complete_document_ends_the_request_despite_ignore_eos_and_min_tokens(
        server: RunningServer, extra: dict[str, object]) -> None:
    # once the regex is matched in full only EOS may follow: the request ends there (found
    # by the fuzz test as a 500 "no token is allowed")
    body = {"prompt": "code:", "regex": "[a-z]{1,3}", "max_tokens": 30, "temperature": 1.0, "seed": 2, **extra}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert re.fullmatch("[a-z]{1,3}", choice["text"]) and choice["finish_reason"] == "stop", choice


def test_json_schema_output_validates(server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "answer in JSON"}], "max_tokens": 40,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMA)
    native = httpx.post(f"{server.url}/generate", json={"text": "JSON:", "sampling_params": {
        "json_schema": json.dumps(SCHEMA), "max_new_tokens": 40}}, timeout=60).json()
    jsonschema.validate(json.loads(native["text"]), SCHEMA)


def test_a_regex_that_does_not_compile_is_a_400(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "regex": "(("}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "regex", r.text
    r = httpx.post(f"{server.url}/generate", json={"text": "x", "sampling_params": {"regex": "(("}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.regex", r.text


def test_grammar_times_reach_the_metrics(server: RunningServer) -> None:
    def count() -> float:
        for line in httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines():
            if line.startswith("ferrolm:grammar_compile_seconds_count"):
                return float(line.split()[-1])
        raise AssertionError("no grammar compile histogram")

    before = count()
    for i in range(3):
        body = {"prompt": "x", "regex": f"[a-c]{{{i + 1}}}", "max_tokens": 8}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    assert count() - before == 3


OPEN = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def test_strict_in_response_format_closes_objects(server: RunningServer) -> None:
    # OpenAI's strict mode: an absent additionalProperties is false, only declared members
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": OPEN, "strict": True}}
    for seed in range(3):
        body = {"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 60, "temperature": 1.0,
                "seed": seed, "response_format": fmt}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
        doc = json.loads(r["choices"][0]["message"]["content"])
        assert set(doc) == {"ok"}, doc
    bad = {"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 5,
           "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": OPEN, "strict": "yes"}}}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=bad, timeout=60)
    assert r.status_code == 400 and "strict" in r.text, r.text


def test_strict_maps_to_sampling_params() -> None:
    from ferrolm.server.protocol import ResponseFormat
    from ferrolm.server.structured_output import constraint_kwargs

    strict = ResponseFormat(type="json_schema", json_schema={"name": "a", "schema": OPEN, "strict": True})
    kwargs, _ = constraint_kwargs(response_format=strict)
    assert kwargs == {"json_schema": OPEN, "json_schema_strict": True}
    default = ResponseFormat(type="json_schema", json_schema={"name": "a", "schema": OPEN})
    assert constraint_kwargs(response_format=default)[0] == {"json_schema": OPEN}
