"""Structured output through the HTTP API (regex, json_schema, response_format)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest
from ferrolm.server.testing import RunningServer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


def test_regex_completion_matches(server: RunningServer) -> None:
    pattern = "[a-z]{3}-[0-9]{2}"
    body = {"prompt": "code:", "regex": pattern, "max_tokens": 24, "temperature": 1.0, "seed": 5}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert re.fullmatch(pattern, r["choices"][0]["text"]), r
    assert r["choices"][0]["finish_reason"] == "stop"
    streamed = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60)
    text = "".join(
        json.loads(line[6:])["choices"][0]["text"]
        for line in streamed.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == r["choices"][0]["text"]


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 20}])
def test_a_complete_document_ends_the_request_despite_ignore_eos_and_min_tokens(
    server: RunningServer, extra: dict[str, object]
) -> None:
    # once the regex is matched in full only EOS may follow: the request ends there (found
    # by the fuzz test as a 500 "no token is allowed")
    body = {"prompt": "code:", "regex": "[a-z]{1,3}", "max_tokens": 30, "temperature": 1.0, "seed": 2, **extra}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert re.fullmatch("[a-z]{1,3}", choice["text"]) and choice["finish_reason"] == "stop", choice


def test_json_schema_output_validates(server: RunningServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "answer in JSON"}],
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMA)
    native = httpx.post(
        f"{server.url}/generate",
        json={"text": "JSON:", "sampling_params": {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40}},
        timeout=60,
    ).json()
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
        body = {
            "messages": [{"role": "user", "content": "JSON"}],
            "max_tokens": 60,
            "temperature": 1.0,
            "seed": seed,
            "response_format": fmt,
        }
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
        doc = json.loads(r["choices"][0]["message"]["content"])
        assert set(doc) == {"ok"}, doc
    bad = {
        "messages": [{"role": "user", "content": "JSON"}],
        "max_tokens": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": OPEN, "strict": "yes"}},
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", json=bad, timeout=60)
    assert r.status_code == 400 and "strict" in r.text, r.text


# (strict true, false or absent onto the grammar's options: structured.rs's unit tests)

# refused naming the field, with the reason (the grammar's own message where it fails to compile)
REFUSED = [
    ("/v1/completions", {"prompt": "x", "regex": "(("}, "regex", 'invalid regex "((": regex parse error'),
    (
        "/v1/completions",
        {"prompt": "x", "guided_regex": "a", "regex": "b"},
        "guided_regex",
        "guided_regex: only one of regex, guided_regex may be given",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "guided_json": {"type": 5}},
        "guided_json",
        "invalid JSON Schema at #: `type` must be a string or a non-empty array",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "json_schema": "{not json"},
        "json_schema",
        "invalid JSON Schema at #: not JSON",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "json_schema": {"type": "string", "pattern": "(("}},
        "json_schema",
        'unsupported JSON Schema keyword "pattern',
    ),
    (
        "/v1/completions",
        {"prompt": "x", "guided_grammar": "root ::= 'a'"},
        "guided_grammar",
        "invalid grammar at line 1, column 10: single-quoted strings are not supported",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "grammar": 'root ::= "a" missing'},
        "grammar",
        "invalid grammar at line 1, column 14: undefined rule `missing`",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "ebnf": 'root ::= "a"', "response_format": {"type": "json_object"}},
        "response_format",
        "response_format: only one of ebnf, response_format may be given",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
        },
        "response_format.json_schema.schema",
        "response_format.json_schema.schema: a JSON Schema object is required",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": 1},
            },
        },
        "response_format.json_schema.strict",
        "response_format.json_schema.strict: must be a boolean",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"minimum": "3"}}},
        },
        "response_format",
        "invalid JSON Schema at #: `minimum` must be a number",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"regex": "a{2,1}"}},
        "sampling_params.regex",
        'invalid regex "a{2,1}": regex parse error',
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": {"$ref": "#/nowhere"}}},
        "sampling_params.json_schema",
        'invalid JSON Schema at #: unknown $ref "#/nowhere"',
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"ebnf": "root ::= (", "regex": "a"}},
        "sampling_params.ebnf",
        "sampling_params.ebnf: only one of sampling_params.regex, sampling_params.ebnf may be given",
    ),
    # of the wrong shape
    (
        "/v1/completions",
        {"prompt": "x", "response_format": {"type": "json_object", "json_schema": 5}},
        "response_format.json_schema",
        "response_format.json_schema: ",
    ),
    ("/v1/completions", {"prompt": "x", "response_format": "json"}, "response_format", "response_format: "),
    ("/v1/completions", {"prompt": "x", "guided_json": 5}, "guided_json", "guided_json: "),
    ("/v1/completions", {"prompt": "x", "guided_choice": []}, "guided_choice", "guided_choice: "),
    (
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": ["a"]}},
        "sampling_params.json_schema",
        "sampling_params.json_schema: ",
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "message"), REFUSED)
def test_structured_output_refused_naming_the_field(
    server: RunningServer, path: str, body: dict[str, Any], param: str, message: str
) -> None:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert message in error["message"], error
