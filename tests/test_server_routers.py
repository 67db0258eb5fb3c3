"""Serving behind the routers that exist, unchanged: the SGLang Model Gateway (PyPI
``sglang-router``) and vllm-router (PyPI ``vllm-router``).

- The request shapes both routers send (``tests/data/router_requests.json``, captured from
  the routers) are served: the fields they add at their defaults are accepted; other
  values of those fields are refused naming the field and the value; what ferrolm can do
  is honoured (``no_stop_trim``, ``continue_final_message``, ``add_generation_prompt``,
  chat's ``echo``, ``spaces_between_special_tokens``; the reasoning fields in
  test_server_tools.py).
- A bodiless POST needs no Content-Type; what the routers read from a replica (/get_load,
  /model_info, vLLM's and SGLang's metric names, the render routes) is there.
- A keep-alive connection the server closes says so on its last response, so that
  concurrent keep-alive clients sending hostile requests never lose one unanswered.
- With the routers installed (the ``test`` extra), two replicas behind each: routing,
  cache-aware hits and a replica SIGKILLed mid-run (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ferrolm.bench import route, routers
from ferrolm.bench.serve import LaunchedServer
from ferrolm.server.testing import RunningServer, free_port, running_server

FIXTURE = json.loads((Path(__file__).parent / "data" / "router_requests.json").read_text())
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-request-bytes", str(MAX_BODY), "--max-total-tokens", "8192") as s:
        yield s


def error_of(r: httpx.Response, status: int, param: str | None) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    return str(error["message"])


# ---- the routers' request shapes ----


@pytest.mark.parametrize(
    "captured", FIXTURE["requests"], ids=[f"{r['router'].split()[0]}-{r['path']}" for r in FIXTURE["requests"]]
)
def test_each_request_a_router_sends_is_served(server: RunningServer, captured: dict[str, Any]) -> None:
    headers = {} if captured["content_type"] is None else {"content-type": captured["content_type"]}
    content = b"" if captured["body"] is None else json.dumps(captured["body"]).encode()
    r = httpx.request(
        captured["method"], f"{server.url}{captured['path']}", content=content, headers=headers, timeout=60
    )
    assert r.status_code == 200, r.text
    body = captured["body"] or {}
    if captured["path"] == "/v1/chat/completions/render":
        ids = r.json()["token_ids"]
        run = {**body, "max_tokens": 1, "stream": False, "stream_options": None}
        chat = httpx.post(f"{server.url}/v1/chat/completions", json=run, timeout=60)
        assert chat.json()["usage"]["prompt_tokens"] == len(ids) > 0, "the ids the chat is run with"
    elif captured["path"] == "/v1/completions/render":
        [rendered] = r.json()
        run = {**body, "max_tokens": 1, "stream": False}
        done = httpx.post(f"{server.url}/v1/completions", json=run, timeout=60)
        assert done.json()["usage"]["prompt_tokens"] == len(rendered["token_ids"]) > 0
    elif body.get("stream"):
        events = [ln for ln in r.text.splitlines() if ln.startswith("data:")]
        assert len(events) > 1 and "error" not in r.text, r.text
        if captured["path"].startswith("/v1/"):
            assert events[-1] == "data: [DONE]"
    elif captured["path"] != "/flush_cache":
        assert "error" not in r.json()


def test_the_fixture_holds_the_fields_the_routers_add() -> None:
    added = set()
    for r in FIXTURE["requests"]:
        added |= set(r["body"] or {})
    for name in (
        "no_stop_trim",
        "continue_final_message",
        "return_hidden_states",
        "separate_reasoning",
        "stream_reasoning",
        "include_reasoning",
        "echo",
        "skip_special_tokens",
        "max_completion_tokens",
    ):
        assert name in added, name


@pytest.mark.parametrize(
    ("path", "field", "value", "default"),
    [
        ("/v1/chat/completions", "return_hidden_states", True, False),
        ("/v1/completions", "use_beam_search", True, None),
        ("/generate", "return_entropy", True, False),
        ("/generate", "background", True, False),
        ("/generate", "data_parallel_rank", 1, 0),
    ],
)
def test_a_value_ferrolm_cannot_honour_is_refused_naming_field_and_value(
    server: RunningServer, path: str, field: str, value: Any, default: Any
) -> None:
    base: dict[str, Any] = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    }[path]
    message = error_of(httpx.post(f"{server.url}{path}", json={**base, field: value}, timeout=60), 400, field)
    assert message.startswith(f"{field}: {json.dumps(value)}"), message
    # and at its default, the same field is accepted
    assert httpx.post(f"{server.url}{path}", json={**base, field: default}, timeout=60).status_code == 200


def test_newer_sglang_and_openai_fields_at_their_defaults_are_accepted(server: RunningServer) -> None:
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "return_routed_experts": False,
        "routed_experts_start_len": 0,
        "return_cached_tokens_details": False,
        "return_prompt_token_ids": False,
        "return_meta_info": False,
        "routed_dp_rank": None,
        "stop_regex": None,
        "custom_labels": {"team": "a"},
        "best_of": 1,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False, "include_obfuscation": False},
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    on = {**chat, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=on, timeout=60)
    assert error_of(r, 400, "stream_options.continuous_usage_stats").startswith(
        "stream_options.continuous_usage_stats: true is not supported"
    )


def test_a_name_no_schema_defines_stays_a_400(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [], "no_stop_trimm": False}, timeout=60)
    assert "unknown field" in error_of(r, 400, "no_stop_trimm")


def test_no_stop_trim_keeps_the_stop_string_as_include_stop_str_in_output(server: RunningServer) -> None:
    body = {"prompt": "hello", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    text = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    stop = text[4:7]
    assert stop and stop not in text[:4]
    trimmed = httpx.post(f"{server.url}/v1/completions", json={**body, "stop": stop}, timeout=60).json()
    kept = httpx.post(f"{server.url}/v1/completions", json={**body, "stop": stop, "no_stop_trim": True}, timeout=60)
    assert trimmed["choices"][0]["text"] == text[: text.index(stop)]
    assert kept.json()["choices"][0]["text"] == text[: text.index(stop)] + stop


def test_echo_writes_the_prompt_before_each_completion(server: RunningServer) -> None:
    body = {"prompt": ["once upon", "a time"], "max_tokens": 4, "temperature": 0, "n": 2}
    plain = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"]
    echoed = httpx.post(f"{server.url}/v1/completions", json={**body, "echo": True}, timeout=60).json()["choices"]
    assert [c["index"] for c in echoed] == [0, 1, 2, 3]
    for p, e in zip(plain, echoed):
        assert e["text"] == body["prompt"][p["index"] // 2] + p["text"]
    ids = httpx.post(f"{server.url}/v1/completions/render", json={"prompt": "once upon"}, timeout=60).json()[0]
    by_ids = {"prompt": ids["token_ids"], "max_tokens": 4, "temperature": 0}
    text = httpx.post(f"{server.url}/v1/completions", json=by_ids, timeout=60).json()["choices"][0]["text"]
    echo = httpx.post(f"{server.url}/v1/completions", json={**by_ids, "echo": True}, timeout=60)
    assert echo.json()["choices"][0]["text"].endswith("once upon" + text)
    for other in ({"stream": True}, {"logprobs": 2}):
        r = httpx.post(f"{server.url}/v1/completions", json={**body, "echo": True, **other}, timeout=60)
        assert error_of(r, 400, "echo").startswith("echo: true is not supported with")


def chat_stream(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The deltas of a streamed chat's one choice, in order."""
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return [json.loads(ln)["choices"][0]["delta"] for ln in lines]


def test_chat_echo_starts_the_content_with_the_assistants_last_message(server: RunningServer) -> None:
    partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    body = {"messages": partial, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    echoed = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "echo": True}, timeout=60).json()
    content = plain["choices"][0]["message"]["content"]
    assert echoed["choices"][0]["message"]["content"] == "Once upon" + content
    counts = ("prompt_tokens", "completion_tokens")
    assert [echoed["usage"][k] for k in counts] == [plain["usage"][k] for k in counts], "echoing costs nothing"
    # streamed: the echoed text is its own delta, right after the role
    deltas = chat_stream(server, {**body, "echo": True})
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "Once upon"}
    assert "".join(d.get("content") or "" for d in deltas) == "Once upon" + content
    # the last message not the assistant's: nothing to echo
    user = {**body, "messages": partial[:1]}
    alone = httpx.post(f"{server.url}/v1/chat/completions", json=user, timeout=60).json()["choices"][0]
    with_echo = httpx.post(f"{server.url}/v1/chat/completions", json={**user, "echo": True}, timeout=60)
    assert with_echo.json()["choices"][0]["message"] == alone["message"]
    assert chat_stream(server, {**user, "echo": True})[1] != {"content": "hi"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_spaces_between_special_tokens_either_way_writes_adjacent_special_tokens_as_they_are(
    server: RunningServer, path: str
) -> None:
    # the tokenizers read here (ByteLevel; Metaspace/byte fallback) put nothing between
    # two added tokens, so vLLM's false and true give the same text (field_policy.rs)
    ask = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    body = {**ask, "max_tokens": 3, "temperature": 0, "skip_special_tokens": False, "logit_bias": {"32002": 100}}
    texts = []
    for value in (True, False, None):
        if path == "/generate":  # SGLang's, in sampling_params
            sampling = {"max_new_tokens": 3, "temperature": 0, "skip_special_tokens": False}
            sent = {"text": "hi", "sampling_params": {**sampling, "logit_bias": {"32002": 100}}}
            sent["sampling_params"]["spaces_between_special_tokens"] = value
        else:
            sent = {**body, "spaces_between_special_tokens": value}
        r = httpx.post(f"{server.url}{path}", json=sent, timeout=60)
        assert r.status_code == 200, r.text
        if path == "/generate":
            texts.append(r.json()["text"])
            continue
        choice = r.json()["choices"][0]
        texts.append(choice["text"] if path == "/v1/completions" else choice["message"]["content"])
    assert texts[0] == texts[1] == texts[2] == "<|im_start|>" * 3, texts


def render(server: RunningServer, **body: Any) -> str:
    r = httpx.post(f"{server.url}/v1/chat/completions/render", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["prompt"])


def test_add_generation_prompt_and_continue_final_message_shape_the_prompt(server: RunningServer) -> None:
    user = [{"role": "user", "content": "hi"}]
    opened = render(server, messages=user)
    closed = render(server, messages=user, add_generation_prompt=False)
    assert opened.startswith(closed) and len(opened) > len(closed), "the generation prompt ends the default"
    partial = [*user, {"role": "assistant", "content": "Once upon"}]
    continued = render(server, messages=partial, continue_final_message=True, add_generation_prompt=False)
    assert continued.endswith("Once upon") and continued.startswith(closed)
    assert render(server, messages=partial, continue_final_message=True).endswith("Once upon")
    both = {"messages": partial, "continue_final_message": True, "add_generation_prompt": True}
    error_of(httpx.post(f"{server.url}/v1/chat/completions", json=both, timeout=60), 400, "continue_final_message")
    last_user = {"messages": user, "continue_final_message": True}
    error_of(httpx.post(f"{server.url}/v1/chat/completions", json=last_user, timeout=60), 400, "continue_final_message")


# ---- no Content-Type without a body ----


def test_a_bodiless_post_needs_no_content_type(server: RunningServer) -> None:
    # as curl -X POST sends it: no Content-Type, no Content-Length
    with socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=30) as s:
        s.sendall(b"POST /flush_cache HTTP/1.1\r\nhost: x\r\n\r\n")
        head = s.recv(65536).split(b"\r\n")[0]
    assert head == b"HTTP/1.1 200 OK", head
    r = httpx.post(f"{server.url}/flush_cache", content=b"{}", headers={"content-type": "text/plain"}, timeout=60)
    assert r.status_code == 415
    r = httpx.post(f"{server.url}/flush_cache", content=b"{}", headers={"content-type": ""}, timeout=60)
    assert r.status_code == 415, "a body with no JSON type is refused"


# ---- what the routers read from a replica ----


def test_get_load_model_info_and_router_metrics(server: RunningServer) -> None:
    [load] = httpx.get(f"{server.url}/get_load", timeout=60).json()
    assert load == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    assert httpx.get(f"{server.url}/model_info", timeout=60).json()["served_model_name"] == "tiny"
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "hello there", "max_tokens": 2}, timeout=60)
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "hello there", "max_tokens": 2}, timeout=60)
    values: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=60).text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    vl, sl = '{engine="0",model_name="tiny"}', '{model_name="tiny"}'
    assert values["vllm:prefix_cache_hits_total" + vl] == values["vllm:gpu_prefix_cache_hits_total" + vl] > 0
    assert values["vllm:prefix_cache_queries_total" + vl] == values["vllm:gpu_prefix_cache_queries_total" + vl]
    assert values["vllm:kv_cache_usage_perc" + vl] == values["vllm:gpu_cache_usage_perc" + vl] == 0.0
    [info] = [k for k in values if k.startswith("vllm:cache_config_info{")]
    assert 'block_size="16"' in info and values[info] == 1.0
    for name in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage"):
        assert values[f"sglang:{name}{sl}"] == 0.0, name
    assert values["sglang:cache_hit_rate" + sl] == values["ferrolm:cache_hit_rate"] > 0


# ---- keep-alive: no request goes unanswered ----


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def read_response(s: socket.socket) -> tuple[bytes, dict[str, str]]:
    """One response's status line and headers (its body read by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response (got {data!r})")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode().strip() for k, v in (ln.split(b":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return lines[0], headers


HOSTILE_HEADS = [
    # refused before the body is read: 415, 413 (declared), 404 and 405 that read no body
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\ncontent-length: 4000\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    % (MAX_BODY + 1),
    b"POST /nowhere HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n",
    b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 4000\r\n\r\n",
    # 431 (too many header fields): hyper's own answer
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4000\r\n"
    + b"".join(b"x-h%d: v\r\n" % i for i in range(200))
    + b"\r\n",
]


@pytest.mark.parametrize("head", HOSTILE_HEADS, ids=["415", "413", "404", "get-with-body", "431"])
def test_a_response_before_the_body_says_connection_close_or_keeps_serving(server: RunningServer, head: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=30) as s:
        s.sendall(head)
        status, headers = read_response(s)
        assert status.split()[1] in (b"404", b"413", b"415", b"431", b"200"), status
        if headers.get("connection", "").lower() == "close":
            return  # the client knows not to send another request on it
        # no word of closing: the connection must go on serving
        s.sendall(b"x" * 4000 + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        status, _ = read_response(s)
        assert status == b"HTTP/1.1 200 OK"


def test_concurrent_raw_keep_alive_clients_lose_no_request(server: RunningServer) -> None:
    """Clients that trust the protocol: they send the next request on the same connection
    unless the last response said ``connection: close``, and a body the server answered
    before reading goes only to a connection that stays open."""
    ordinary = [
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 17"
        b'\r\n\r\n{"messages": 3.0}',
    ]
    problems: list[str] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        s = socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=30)
        try:
            for i in range(40):
                hostile = HOSTILE_HEADS[(seed + i) % len(HOSTILE_HEADS)] if i % 2 else None
                try:
                    if hostile is not None:
                        s.sendall(hostile)
                        _, headers = read_response(s)
                        if headers.get("connection", "").lower() != "close":
                            s.sendall(b"x" * 4000)  # the body, to a connection that stays open
                    else:
                        s.sendall(ordinary[(seed + i) % len(ordinary)])
                        status, headers = read_response(s)
                        assert status.split()[1] in (b"200", b"400"), status
                except (OSError, AssertionError) as e:
                    with lock:
                        problems.append(f"request {i} of client {seed}: {type(e).__name__}: {e}")
                    headers = {"connection": "close"}
                if headers.get("connection", "").lower() == "close":
                    s.close()
                    s = socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=30)
        finally:
            s.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:5]


def test_concurrent_keep_alive_clients_with_hostile_requests_get_every_answer(server: RunningServer) -> None:
    chat = "/v1/chat/completions"
    JSON = {"content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        (
            "POST",
            chat,
            {"content": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', "headers": JSON},
        ),
        ("POST", "/v1/completions", {"json": {"max_tokens": 2}}),
        ("POST", "/v1/completions", {"content": b"x" * 3000, "headers": {"content-type": "text/plain"}}),
        (
            "POST",
            "/v1/completions",
            {"content": b"{" * (MAX_BODY + 10), "headers": {"content-type": "application/json"}},
        ),
        ("POST", "/v1/completions", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("POST", "/nowhere", {"json": {"a": 1}}),
        ("GET", "/v1/models", {}),
        ("POST", "/v1/completions", {"json": {"prompt": "hi", "max_tokens": 2, "temperature": 0}}),
        ("POST", "/generate", {"json": {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": -1}}}),
    ]
    dropped: list[str] = []
    answered = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for i in range(90):
                method, path, kw = cases[(seed * 7 + i) % len(cases)]
                try:
                    r = c.request(method, path, **kw)
                    with lock:
                        answered[0] += 1
                        if r.status_code >= 500:
                            dropped.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
                except Exception as e:  # a dropped connection: httpx.RemoteProtocolError
                    with lock:
                        dropped.append(f"{method} {path}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not dropped, dropped[:5]
    assert answered[0] == 4 * 90


# ---- the routers from PyPI ----


def needs(kind: str) -> str:
    command = routers.find_router(kind)
    if command is None:
        pytest.skip(
            f"{routers.ROUTER_COMMANDS[kind]} is not installed (pip install 'ferrolm[test]'); the request "
            "shapes it sends are covered by the fixture tests above"
        )
    return command


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[tuple[LaunchedServer, str]]]:
    launched: list[tuple[LaunchedServer, str]] = []
    try:
        for _ in range(2):
            pub, replay = free_port(), free_port()
            server = LaunchedServer("tiny", route.replica_flags(pub, replay, 16, 16384), None)
            launched.append((server, f"tcp://127.0.0.1:{pub}"))
        yield launched
    finally:
        for s, _ in launched:
            s.close()


def flush(urls: list[str]) -> None:
    for u in urls:
        assert httpx.post(f"{u}/flush_cache", timeout=60).status_code == 200


ROUTED = [("sglang", "round_robin"), ("sglang", "cache_aware"), ("vllm", "cache_aware"), ("vllm", "kv_aware")]


@pytest.mark.parametrize(("kind", "policy"), ROUTED, ids=[f"{k}-{p}" for k, p in ROUTED])
def test_routed_chat_is_served_and_cache_aware_policies_hit(
    replicas: list[tuple[LaunchedServer, str]], kind: str, policy: str
) -> None:
    needs(kind)
    urls = [s.url for s, _ in replicas]
    flush(urls)
    before = routers.cache_totals(urls)
    kv = {s.url: endpoint for s, endpoint in replicas} if policy == "kv_aware" else None
    router = routers.Router(kind, policy, urls, kv_events=kv)
    try:
        opening, users = routers.chat_workload(seed=1, conversations=6, turns=3)
        stats = routers.run_chat(router.url, opening, users, concurrency=2, max_tokens=4)
    finally:
        router.close()
    assert stats.failed == 0, stats.failures[:3]
    after = routers.cache_totals(urls)
    served = [after[u][2] - before[u][2] for u in urls]
    prompt = sum(after[u][0] - before[u][0] for u in urls)
    cached = sum(after[u][1] - before[u][1] for u in urls)
    assert sum(served) == stats.requests == 18
    if policy == "round_robin":
        assert min(served) >= 8, served
    else:
        # every later turn of a conversation finds its history on the replica it went to
        assert cached / prompt > 0.5, (cached, prompt, served)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_replica_killed_mid_run_costs_at_most_a_handful(kind: str) -> None:
    needs(kind)
    servers = [LaunchedServer("tiny", ["--max-total-tokens", "16384"], None) for _ in range(2)]
    router = None
    try:
        router = routers.Router(kind, "round_robin", [s.url for s in servers])
        victim = servers[1]
        opening, users = routers.chat_workload(seed=2, conversations=8, turns=3)
        stats = routers.run_chat(
            router.url,
            opening,
            users,
            concurrency=2,
            max_tokens=4,
            kill_after=6,
            kill=lambda: os.killpg(victim.process.pid, signal.SIGKILL),
        )
        assert stats.requests == 24
        assert stats.failed <= 3, stats.failures
        served = routers.cache_totals([servers[0].url])[servers[0].url][2]
        assert served >= stats.requests - stats.failed - 6, "the survivor took the rest"
    finally:
        if router is not None:
            router.close()
        for s in servers:
            s.close()
