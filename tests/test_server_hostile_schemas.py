"""Hostile JSON Schemas against a live server (issue 9, defects 1, 2 and 4): each small
request is answered (a document or a 400 naming the schema), none takes the engine's
memory with it, and a stream running meanwhile keeps going to its end (the front end
compiles on its grammar threads, in the step loop's process)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from ferrolm.server.testing import RunningServer, engine_pid, rss_bytes, wait_until


def nested_arrays(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": 3}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, "maxItems": 2}
    return schema


def doubling_refs(levels: int) -> dict[str, Any]:
    """Every level uses the one below twice: a flattened grammar doubles per level."""
    defs: dict[str, Any] = {"l0": {"type": "string", "maxLength": 3}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/$defs/l{i - 1}"}
        defs[f"l{i}"] = {
            "anyOf": [
                {"type": "array", "items": below, "maxItems": 2},
                {"type": "object", "additionalProperties": below},
            ]
        }
    return {"$defs": defs, "$ref": f"#/$defs/l{levels}"}


HOSTILE = [
    nested_arrays(20),
    nested_arrays(40),
    doubling_refs(20),
    {"$ref": "#"},
    {
        "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
        "$ref": "#/$defs/a",
    },
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
]


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


def load(server: RunningServer) -> dict[str, int]:
    return httpx.get(f"{server.url}/server_info", timeout=30).json()["load"]


def stream_tokens(server: RunningServer, out: dict[str, Any]) -> None:
    body = {
        "prompt": "a stream that runs while schemas compile",
        "max_tokens": 150,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                out["finish_reason"] = next(
                    (c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]), out.get("finish_reason")
                )
                out["usage"] = chunk.get("usage") or out.get("usage")


def test_hostile_schemas_are_answered_without_taking_the_engine_down(server: RunningServer) -> None:
    engine = engine_pid(server)
    rss_before = rss_bytes(engine)
    streamed: dict[str, Any] = {}
    runner = threading.Thread(target=stream_tokens, args=(server, streamed))
    runner.start()
    for round_ in range(3):
        for i, schema in enumerate(HOSTILE):
            body = {
                "messages": [{"role": "user", "content": f"JSON {round_} {i}"}],
                "max_tokens": 40,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            }
            r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code in (200, 400), (r.status_code, r.text)
            if r.status_code == 400:
                error = r.json()["error"]
                assert error["param"] == "response_format", error
            else:
                choice = r.json()["choices"][0]
                if choice["finish_reason"] == "stop":
                    json.loads(choice["message"]["content"])  # a complete document
    runner.join(timeout=120)
    assert not runner.is_alive()
    assert streamed["finish_reason"] == "length" and streamed["usage"]["completion_tokens"] == 150, streamed
    # depth 20 used to take 22 GB; the budget per compile is 256 MiB, and nothing stays
    grown = rss_bytes(engine) - rss_before
    assert grown < 512 * 2**20, f"the engine grew by {grown / 2**20:.0f} MiB"
    wait_until(lambda: load(server)["running"] == 0 and load(server)["waiting"] == 0, timeout=30)
    after = load(server)
    assert after["kv_used"] == after["cached_tokens"], after
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
