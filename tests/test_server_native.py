"""The native API (``/generate``, ``/abort_request``, ``/flush_cache``) and the routes that
describe the server, over raw HTTP against a real ``ferrolm serve``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ferrolm.server.testing import RunningServer, running_server, wait_until

SECRET = "s3cret-key-never-shown"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-total-tokens", "8192", "--chunked-prefill-size", "512", api_key=SECRET) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        yield c


def load(http: httpx.Client) -> dict[str, int]:
    return http.get("/server_info").json()["load"]


def test_generate_text_and_ids_agree(http: httpx.Client) -> None:
    params = {"max_new_tokens": 6, "temperature": 0}
    by_text = http.post("/generate", json={"text": "Hello world", "sampling_params": params}).json()
    assert by_text["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert by_text["meta_info"]["completion_tokens"] == len(by_text["output_ids"])
    info = http.get("/get_model_info").json()
    assert info["vocab_size"] == 32008 and info["is_generation"]


def test_generate_stream_is_cumulative_and_ends_with_done(http: httpx.Client) -> None:
    body = {
        "text": "Stream me",
        "sampling_params": {"max_new_tokens": 5, "temperature": 0},
        "stream": True,
        "return_logprob": True,
    }
    r = http.post("/generate", json=body)
    blocks = [b[len("data: ") :] for b in r.text.split("\n\n") if b.strip()]
    assert blocks[-1] == "[DONE]"
    events = [json.loads(b) for b in blocks[:-1]]
    texts = [e["text"] for e in events]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
    whole = http.post("/generate", json={**body, "stream": False}).json()
    assert texts[-1] == whole["text"]
    assert len(whole["meta_info"]["output_token_logprobs"]) == len(whole["output_ids"])


def test_abort_request_by_rid_frees_kv(http: httpx.Client, server: RunningServer) -> None:
    body = {
        "text": "A long one",
        "rid": "long-1",
        "stream": True,
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
    }
    result: dict[str, Any] = {}

    def consume() -> None:
        with httpx.stream("POST", f"{server.url}/generate", json=body, headers=server.headers, timeout=60) as r:
            result["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    reader = threading.Thread(target=consume)
    reader.start()
    wait_until(lambda: load(http)["running"] == 1)
    assert http.post("/abort_request", json={"rid": "long-1"}).json() == {"aborted": 1}
    reader.join(timeout=30)
    assert not reader.is_alive()
    last = json.loads(result["events"][-2][len("data: ") :])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 3000
    after = wait_until(lambda: (s := load(http))["running"] == 0 and s)
    assert after["kv_used"] == after["cached_tokens"], "no request holds KV any more"


def test_flush_cache_returns_kv_to_zero(http: httpx.Client) -> None:
    http.post("/generate", json={"text": "fill the cache", "sampling_params": {"max_new_tokens": 4}})
    assert load(http)["cached_tokens"] > 0
    r = http.post("/flush_cache", json={})
    assert r.status_code == 200, r.text
    assert load(http)["kv_used"] == 0


def test_flush_cache_refused_while_busy(http: httpx.Client, server: RunningServer) -> None:
    body = {"text": "busy", "rid": "busy-1", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    worker = threading.Thread(
        target=lambda: httpx.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=60)
    )
    worker.start()
    try:
        wait_until(lambda: load(http)["running"] == 1)
        r = http.post("/flush_cache", json={})
        assert r.status_code == 400 and "running" in r.json()["error"]["message"]
    finally:
        assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
        worker.join(timeout=30)
    assert not worker.is_alive()


def test_server_info_never_shows_the_key(http: httpx.Client) -> None:
    r = http.get("/server_info")
    assert r.status_code == 200
    assert SECRET not in r.text
    info = r.json()
    assert info["settings"]["api_key"] == "set"
    assert info["settings"]["max_total_tokens"] == 8192 and info["settings"]["chunked_prefill_size"] == 512


def test_auth(server: RunningServer) -> None:
    body = {"text": "x", "sampling_params": {"max_new_tokens": 1}}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": SECRET},
        {"Authorization": f"Basic {SECRET}"},
    ):
        for path, payload in (("/generate", body), ("/v1/completions", {"prompt": "x", "max_tokens": 1})):
            r = httpx.post(f"{server.url}{path}", json=payload, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        for path in ("/v1/models", "/server_info", "/get_model_info"):
            assert httpx.get(f"{server.url}{path}", headers=headers).status_code == 401, path
    # probes and scrapers need no key
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200
    ok = httpx.post(f"{server.url}/generate", json=body, headers=server.headers)
    assert ok.status_code == 200


def test_auth_scheme_is_case_insensitive_and_the_key_is_not(server: RunningServer) -> None:
    # the fixture's server took its key from FERROLM_API_KEY, not from a flag
    assert SECRET.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    body = {"text": "x", "sampling_params": {"max_new_tokens": 1}}
    for value in (f"bearer {SECRET}", f"BEARER {SECRET}", f"BeArEr   {SECRET}"):
        r = httpx.post(f"{server.url}/generate", json=body, headers={"Authorization": value})
        assert r.status_code == 200, value
    for value in (
        f"Bearer {SECRET.upper()}",
        f"Bearer {SECRET[:-1]}",
        f"Bearer {SECRET}x",
        "Bearer",
        f"Bearer{SECRET}",
        f"Token {SECRET}",
    ):
        r = httpx.post(f"{server.url}/generate", json=body, headers={"Authorization": value})
        assert r.status_code == 401, value
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_client_with_key(server: RunningServer) -> None:
    import openai

    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=SECRET, max_retries=0)
    assert good.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="hi", max_tokens=2)
