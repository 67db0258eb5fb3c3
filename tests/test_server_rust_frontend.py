"""The Rust front end (``ferrolm serve --frontend rust``) beside the Python one: the same
outputs at temperature 0 and with seeds, the same metric names, disconnects that abort
and free the KV, the API key, an idle server that does not spin; and its chat templates
(minijinja) rendered as jinja2 renders them. The shared suites (test_server_openai.py,
test_server_errors.py) run against both front ends too."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tokenizers

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.server.testing import RunningServer, running_server, wait_until

SECRET = "s3cret-key"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RunningServer, RunningServer]]:
    flags = ("--max-total-tokens", "8192")
    with running_server(*flags, frontend="python") as py, running_server(*flags, frontend="rust") as rs:
        yield py, rs


@pytest.fixture(scope="module")
def rust(servers: tuple[RunningServer, RunningServer]) -> RunningServer:
    return servers[1]


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=120)


def comparable(path: str, answer: Any) -> Any:
    """What must agree between the front ends (not ids or timestamps)."""
    if path == "/generate":
        items = answer if isinstance(answer, list) else [answer]
        return [{"text": a["text"], "output_ids": a["output_ids"],
                 "meta": {k: v for k, v in a["meta_info"].items() if k != "id"}} for a in items]
    return {"choices": answer["choices"], "usage": answer["usage"], "object": answer["object"]}


SAME = [
    pytest.param("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0}, id="greedy"),
    pytest.param("/v1/completions", {"prompt": ["one", "two"], "max_tokens": 6, "temperature": 0.9, "seed": 7, "n": 2},
                 id="seeded-n2-two-prompts"),
    pytest.param("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0, "logprobs": 2},
                 id="ids-logprobs"),
    pytest.param("/v1/completions", {"prompt": "Counting:", "max_tokens": 16, "temperature": 0, "stop": [" the", "ing"],
                                     "include_stop_str_in_output": True}, id="stop"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "Tell me a story"}],
                                          "max_tokens": 12, "temperature": 0}, id="chat-greedy"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                                          "max_completion_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 3,
                                          "logprobs": True, "top_logprobs": 2}, id="chat-seeded-logprobs"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                          "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}},
                 id="chat-template-kwargs"),
    pytest.param("/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 10, "temperature": 0}},
                 id="generate"),
    pytest.param("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 1,
                               "sampling_params": {"max_new_tokens": 4, "temperature": 0.7, "seed": 1, "n": 2}},
                 id="generate-seeded-n2"),
]

# structured output: the same grammar (one cache, one vocabulary) gives the same tokens
OBJECT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"enum": [1, 2, 3]}},
          "required": ["name", "n"]}
SAME += [
    pytest.param("/v1/completions", {"prompt": "code:", "regex": "[a-z]{3}-[0-9]{2}", "max_tokens": 12,
                                     "temperature": 0}, id="regex-greedy"),
    pytest.param("/v1/completions", {"prompt": ["a", "b"], "guided_regex": "(yes|no|maybe)!", "max_tokens": 8,
                                     "temperature": 1.0, "seed": 4, "n": 2}, id="guided_regex-seeded-n2"),
    pytest.param("/v1/completions", {"prompt": "JSON:", "json_schema": OBJECT, "max_tokens": 40, "temperature": 0.8,
                                     "seed": 11, "logprobs": 1}, id="json_schema-seeded-logprobs"),
    pytest.param("/v1/completions", {"prompt": "JSON:", "guided_json": json.dumps(OBJECT), "max_tokens": 40,
                                     "temperature": 0}, id="guided_json-text"),
    pytest.param("/v1/completions", {"prompt": "pick", "guided_choice": ["alpha", "beta", "gamma"], "max_tokens": 8,
                                     "temperature": 1.0, "seed": 2}, id="guided_choice"),
    pytest.param("/v1/completions", {"prompt": "g", "guided_grammar": 'root ::= "(" [a-c]* ")"', "max_tokens": 10,
                                     "temperature": 0.9, "seed": 5}, id="guided_grammar"),
    pytest.param("/v1/completions", {"prompt": "g", "grammar": 'root ::= "x" | "y" root', "max_tokens": 10,
                                     "temperature": 0.9, "seed": 6}, id="grammar"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 30,
                                          "temperature": 1.0, "seed": 9, "response_format": {"type": "json_object"}},
                 id="chat-json_object"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 40,
                                          "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                                              "name": "x", "schema": OBJECT, "strict": True}}},
                 id="chat-json_schema-strict"),
    pytest.param("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                          "temperature": 0, "response_format": {"type": "text"}},
                 id="chat-response_format-text"),
    pytest.param("/generate", {"text": "JSON:", "sampling_params": {"json_schema": OBJECT, "max_new_tokens": 40,
                                                                    "temperature": 0.7, "seed": 3, "n": 2}},
                 id="generate-json_schema-n2"),
    pytest.param("/generate", {"text": "E:", "sampling_params": {"ebnf": 'root ::= [0-9]+ "." [0-9]', "max_new_tokens": 8,
                                                                 "temperature": 0}}, id="generate-ebnf"),
]


@pytest.mark.parametrize(("path", "body"), SAME)
def test_same_outputs_as_the_python_front_end(servers: tuple[RunningServer, RunningServer], path: str,
                                              body: dict[str, Any]) -> None:
    py, rs = servers
    a, b = post(py, path, body), post(rs, path, body)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert_same(comparable(path, b.json()), comparable(path, a.json()))


def assert_same(got: Any, expected: Any, where: str = "") -> None:
    """Equal structures; floats (logprobs) within a tolerance."""
    if isinstance(expected, float) or isinstance(got, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), where
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), where
        for k in expected:
            assert_same(got[k], expected[k], f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{where}[{i}]")
    else:
        assert got == expected, where


TRICKY_TEXTS = ["Hello, world!", "  leading and trailing  ", "tabs\tand\nnew\n\n\nlines\r\n", "123456789 3.14159",
                "é ü ñ 中文 日本語 한국어", "emoji \U0001F600\U0001F44D\U0001F3FD", "<|im_start|>user\nhi<|im_end|>",
                "don't you're we'll I'm", "a" * 300, "x = f(y) -> {z: [1, 2]};", "\u200b zero\u00a0width"]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_tokenization_agrees_with_the_python_tokenizer(servers: tuple[RunningServer, RunningServer], tiny: Any,
                                                       text: str) -> None:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    py, rs = (post(s, "/generate", body).json() for s in servers)
    assert rs["meta_info"]["prompt_tokens"] == len(tiny.tokenizer.encode(text))
    assert (rs["meta_info"]["prompt_tokens"], rs["output_ids"]) == (py["meta_info"]["prompt_tokens"], py["output_ids"])


# what the front ends refuse the same way: status, param and message
SAME_REFUSAL = [
    ("/v1/completions", {"prompt": "x", "regex": "(("}),
    ("/v1/completions", {"prompt": "x", "guided_regex": "a", "regex": "b"}),
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": 5}}),
    ("/v1/completions", {"prompt": "x", "json_schema": "{not json"}),
    ("/v1/completions", {"prompt": "x", "json_schema": {"type": "string", "pattern": "(("}}),
    ("/v1/completions", {"prompt": "x", "guided_grammar": "root ::= 'a'"}),
    ("/v1/completions", {"prompt": "x", "grammar": 'root ::= "a" missing'}),
    ("/v1/completions", {"prompt": "x", "ebnf": 'root ::= "a"', "response_format": {"type": "json_object"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": 1}}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"minimum": "3"}}}}),
    ("/generate", {"text": "x", "sampling_params": {"regex": "a{2,1}"}}),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": {"$ref": "#/nowhere"}}}),
    ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= (", "regex": "a"}}),
]


# refused by the shape of a field: the same status and param (the wording is pydantic's in
# the Python front end)
SAME_PARAM = [
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object", "json_schema": 5}}),
    ("/v1/completions", {"prompt": "x", "response_format": "json"}),
    ("/v1/completions", {"prompt": "x", "guided_json": 5}),
    ("/v1/completions", {"prompt": "x", "guided_choice": []}),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": ["a"]}}),
]


@pytest.mark.parametrize(("path", "body"), SAME_PARAM)
def test_structured_fields_of_the_wrong_shape_are_refused_naming_them(
        servers: tuple[RunningServer, RunningServer], path: str, body: dict[str, Any]) -> None:
    py, rs = (post(s, path, body) for s in servers)
    assert py.status_code == 400, py.text
    assert (rs.status_code, rs.json()["error"]["param"]) == (400, py.json()["error"]["param"]), (py.text, rs.text)


@pytest.mark.parametrize(("path", "body"), SAME_REFUSAL)
def test_structured_output_refused_as_the_python_front_end_refuses_it(
        servers: tuple[RunningServer, RunningServer], path: str, body: dict[str, Any]) -> None:
    py, rs = (post(s, path, body) for s in servers)
    assert py.status_code == 400, py.text
    assert (rs.status_code, rs.json()["error"]) == (py.status_code, py.json()["error"])


@pytest.mark.parametrize(("path", "body"), SAME[:1] + SAME[4:5] + [
    p for p in SAME if p.id in ("regex-greedy", "guided_choice", "chat-json_schema-strict")])
def test_streams_agree_with_the_python_front_end(servers: tuple[RunningServer, RunningServer], path: str,
                                                 body: dict[str, Any]) -> None:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    texts = []
    for server in servers:
        r = post(server, path, body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e.strip()]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join((c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "")
                       for c in chunks if c["choices"])
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        texts.append((text, finishes, chunks[-1]["usage"]))
    assert texts[0] == texts[1]


def test_the_same_metric_names(servers: tuple[RunningServer, RunningServer]) -> None:
    def types(server: RunningServer) -> dict[str, str]:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ferrolm:")}

    py, rs = servers
    # every series of the Python front end's, and the step loop's forward timing and the
    # commits' sampling threads (which only this server's loop exports)
    own = {"ferrolm:forward_seconds": "histogram", "ferrolm:forward_seconds_created": "gauge",
           "ferrolm:forward_loop_cpu_seconds_total": "counter",
           "ferrolm:sampling_thread_cpu_seconds_total": "counter"}
    assert types(rs) == types(py) | own
    assert types(rs)["ferrolm:time_to_first_token_seconds"] == "histogram"


def load(server: RunningServer) -> dict[str, int]:
    info: dict[str, int] = httpx.get(f"{server.url}/server_info", headers=server.headers, timeout=30).json()["load"]
    return info


def idle_and_freed(server: RunningServer) -> bool:
    info = load(server)
    return info["running"] == 0 and info["waiting"] == 0 and info["kv_used"] == info["cached_tokens"]


def test_a_stream_whose_client_goes_away_is_aborted_and_its_kv_freed(rust: RunningServer) -> None:
    body = {"prompt": "A story that never ends", "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{rust.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for _ in r.iter_raw():
            break  # one chunk, then hang up
    wait_until(lambda: idle_and_freed(rust), timeout=60)
    after = load(rust)
    assert after["finished"] >= 1


def test_a_waiting_client_that_goes_away_is_aborted_and_its_kv_freed(rust: RunningServer) -> None:
    body = json.dumps({"prompt": "Another long one", "max_tokens": 3000, "temperature": 0,
                       "ignore_eos": True}).encode()
    host, port = rust.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: load(rust)["running"] == 1, timeout=60)
    wait_until(lambda: idle_and_freed(rust), timeout=60)


def test_abort_request_by_id_ends_a_generation(rust: RunningServer) -> None:
    body = {"text": "x", "rid": "to-abort", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}}
    with httpx.stream("POST", f"{rust.url}/generate", json=body, timeout=60) as r:
        it = r.iter_lines()
        next(it)
        aborted = post(rust, "/abort_request", {"rid": "to-abort"}).json()
        assert aborted == {"aborted": 1}
        events = [json.loads(line[6:]) for line in it if line.startswith("data: {")]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    wait_until(lambda: idle_and_freed(rust), timeout=60)


def test_an_idle_server_does_not_spin(rust: RunningServer) -> None:
    wait_until(lambda: idle_and_freed(rust), timeout=60)
    pid = rust.process.pid
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_s() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    before, t0 = cpu_s(), time.monotonic()
    time.sleep(2.0)
    used, elapsed = cpu_s() - before, time.monotonic() - t0
    # a loop that polled would use a whole core; blocking leaves (almost) nothing
    assert used / elapsed < 0.05, f"{used:.3f} s of CPU in {elapsed:.1f} s idle"


def test_the_api_key_guards_all_but_health_and_metrics() -> None:
    with running_server("--max-total-tokens", "2048", api_key=SECRET, frontend="rust") as s:
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {SECRET}"},
                        {"Authorization": f"Bearer {SECRET}x"}):
            r = httpx.post(f"{s.url}/v1/completions", json=body, headers=headers, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
            assert r.headers["www-authenticate"] == "Bearer"
        ok = httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": f"bearer {SECRET}"}, timeout=30)
        assert ok.status_code == 200
        assert httpx.get(f"{s.url}/health").status_code == 200
        assert httpx.get(f"{s.url}/metrics").status_code == 200
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        info = httpx.get(f"{s.url}/server_info", headers=s.headers).json()
        assert info["settings"]["api_key"] == "set" and SECRET not in json.dumps(info)


def test_posts_must_be_json_and_within_the_size_limit(rust: RunningServer) -> None:
    r = httpx.post(f"{rust.url}/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(f"{rust.url}/flush_cache")  # no body and no type: refused too
    assert r.status_code == 415
    big = b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    r = httpx.post(f"{rust.url}/v1/completions", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


# ---- chat templates: minijinja (the Rust front end) against jinja2 (the Python one) ----

TINY = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
        " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# the families' shapes, written for this test: header ids (Llama 3), [INST] turns with a
# folded system prompt and alternation checks (Llama 2 / Mistral), ChatML with a default
# system prompt (Qwen), <start_of_turn> with a renamed role and no system role (Gemma)
LLAMA3_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
INST_STYLE = """{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set system = false %}
    {% set loop_messages = messages %}
{% endif %}
{{ bos_token }}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {% if loop.first and system %}
{{ '[INST] ' + system + '\\n\\n' + message['content'].strip() + ' [/INST]' }}
        {% else %}
{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}
        {% endif %}
    {% else %}
{{ ' ' + message['content'].strip() + eos_token }}
    {% endif %}
{% endfor %}"""
CHATML_DEFAULT_SYSTEM = """{% for message in messages %}
{% if loop.first and message['role'] != 'system' %}
{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{% endif %}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{% endif %}"""
TURN_STYLE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}
{% for message in messages %}
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}
{% endfor %}
{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"""
NAMESPACE_AND_JSON = """{% set ns = namespace(count=0, last='') %}
{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}
{{ ns.count }} {{ ns.last }} {{ messages | tojson }} {{ messages[0] | tojson(indent=2) }}
{{ messages[-1].content | upper }} {{ messages | length }} {{ messages[0].content.split(' ') | join('|') }}"""

CHATS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hello there  "},
     {"role": "assistant", "content": "Hi. "}, {"role": "user", "content": "é ü \u4e2d \U0001F600 \"q\" <b>&"}],
]


def jinja2_render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    tok = Tokenizer(hf, bos_token="<s>", eos_token="</s>", chat_template=template)
    return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("template", [TINY, LLAMA3_STYLE, INST_STYLE, CHATML_DEFAULT_SYSTEM, TURN_STYLE,
                                      NAMESPACE_AND_JSON],
                         ids=["tiny", "llama3-style", "inst-style", "chatml-default-system", "turn-style",
                              "namespace-json-filters"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_templates_render_as_jinja2(template: str, chat: int, add_generation_prompt: bool) -> None:
    messages = CHATS[chat]
    try:
        expected = jinja2_render(template, messages, add_generation_prompt)
    except InvalidInputError as e:
        # the template refuses this chat (raise_exception): so must minijinja, with its message
        with pytest.raises(InvalidInputError) as info:
            _core.render_chat_template(template, json.dumps(messages), bos_token="<s>", eos_token="</s>",
                                       add_generation_prompt=add_generation_prompt)
        assert str(e).removeprefix("chat template: ") in str(info.value)
        return
    got = _core.render_chat_template(template, json.dumps(messages), bos_token="<s>", eos_token="</s>",
                                     add_generation_prompt=add_generation_prompt)
    assert got == expected


def test_the_tiny_models_template_matches(tiny: Any) -> None:
    tok = tiny.tokenizer
    messages = CHATS[1]
    got = _core.render_chat_template(tok.chat_template, json.dumps(messages), bos_token=tok.bos_token,
                                     eos_token=tok.eos_token)
    assert got == tok.apply_chat_template(messages)


def test_a_template_that_does_not_compile_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="does not compile"):
        _core.render_chat_template("{% for x in %}", "[]")


TOOLS_FOR_TEMPLATE: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast, à la carte", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 14},
                                         "ratio": {"type": "number", "default": 0.5}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CHAT: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "call_1", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Zürich", "days": 2, "ratio": 1.5}}},
        {"type": "function", "id": "call_2", "function": {"name": "ping", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 °C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    {"role": "assistant", "content": "Sunny.", "reasoning_content": "it said so"},
    {"role": "user", "content": "Thanks"},
]
# a Llama-3-style template that prints the tools and calls in its own words (written for this test)
TOOLS_IN_USER_TURN = """{{ bos_token }}{% for m in messages %}
{% if m.role == 'user' and loop.last and tools is defined %}
{{ 'Functions: ' }}{% for t in tools %}{{ t.function.name }}={{ t | tojson(indent=2) }};{% endfor %}
{% endif %}
{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.id }}] {{ c.function.name }}({{ c.function.arguments | tojson }})
{% endfor %}{% elif m.role == 'tool' %}<{{ m.tool_call_id }}>{{ m.content }}
{% else %}{{ m.role }}: {{ m.content }}{{ ' (' + m.reasoning_content + ')' if m.reasoning_content }}
{% endif %}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"""


@pytest.mark.parametrize("with_tools", [True, False])
def test_templates_render_tools_and_calls_as_jinja2(tiny: Any, with_tools: bool) -> None:
    tok = tiny.tokenizer
    tools = TOOLS_FOR_TEMPLATE if with_tools else None
    variables: dict[str, Any] = {"tools": tools} if tools else {}
    for template in (tok.chat_template, TOOLS_IN_USER_TURN):
        expected = Tokenizer(tok.hf, bos_token=tok.bos_token, eos_token=tok.eos_token,
                             chat_template=template).apply_chat_template(TOOL_CHAT, **variables)
        got = _core.render_chat_template(template, json.dumps(TOOL_CHAT), bos_token=tok.bos_token,
                                         eos_token=tok.eos_token, tools_json=json.dumps(tools) if tools else None)
        assert got == expected


# ---- tool calls and reasoning: the same calls, parsed the same way, from either front end ----

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL_TOKEN, THINK_END_TOKEN = "32004", "32007"  # the tiny model's <tool_call> and </think>
HISTORY: list[Any] = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_x", "content": "sunny"}]
CHAT_PATH = "/v1/chat/completions"
TOOL_SAME = [
    pytest.param({"tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": 3, "max_tokens": 200},
                 id="required-seeded"),
    pytest.param({"tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 200, "n": 2,
                  "logit_bias": {"32003": -3}}, id="required-greedy-n2"),
    pytest.param({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                  "temperature": 1.0, "seed": 5, "max_tokens": 200}, id="named"),
    pytest.param({"tools": TOOLS, "temperature": 1.0, "seed": 1, "max_tokens": 120,
                  "logit_bias": {TOOL_CALL_TOKEN: 100}}, id="auto-forced-trigger"),
    pytest.param({"tools": TOOLS, "temperature": 1.0, "seed": 2, "max_tokens": 12}, id="auto-free"),
    pytest.param({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
                  "seed": 4, "max_tokens": 200}, id="not-parallel"),
    pytest.param({"tools": TOOLS, "temperature": 1.0, "seed": 6, "max_tokens": 200, "logit_bias": {TOOL_CALL_TOKEN: 100},
                  "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                      "type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"]}}}},
                 id="auto-or-answer"),
    pytest.param({"tools": TOOLS, "tool_choice": "none", "temperature": 0, "max_tokens": 8}, id="none"),
    pytest.param({"messages": HISTORY, "tools": TOOLS, "temperature": 0, "max_tokens": 8,
                  "logit_bias": {TOOL_CALL_TOKEN: -100}}, id="history"),
]


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if calls:
        assert all(c["id"].startswith("call_") for c in calls)
        message = {**message, "tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in calls]}
    return message


def streamed_choices(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each choice of a stream put together: content, reasoning, calls, finish reason."""
    r = post(server, CHAT_PATH, {**body, "stream": True})
    assert r.status_code == 200, r.text
    out: dict[int, dict[str, Any]] = {}
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
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
    return [out[i] for i in sorted(out)]


def check_tools_agree(servers: tuple[RunningServer, RunningServer], body: dict[str, Any]) -> None:
    body = {"messages": ASK, **body}
    answers = [post(s, CHAT_PATH, body) for s in servers]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    whole = [[{**c, "message": without_ids(c["message"])} for c in a.json()["choices"]] for a in answers]
    assert_same(whole[1], whole[0])
    assert answers[0].json()["usage"] == answers[1].json()["usage"]
    streams = [streamed_choices(s, body) for s in servers]
    assert streams[0] == streams[1]
    for choice, streamed in zip(whole[0], streams[0]):  # streamed or not, the same message
        message = choice["message"]
        assert streamed["content"] == (message["content"] or "")
        assert streamed["reasoning"] == (message.get("reasoning_content") or "")
        assert streamed["calls"] == [[c["function"]["name"], c["function"]["arguments"]]
                                     for c in message.get("tool_calls") or []]
        assert streamed["finish"] == choice["finish_reason"]


@pytest.mark.parametrize("body", TOOL_SAME)
def test_tool_calls_agree_with_the_python_front_end(servers: tuple[RunningServer, RunningServer],
                                                    body: dict[str, Any]) -> None:
    check_tools_agree(servers, body)


def test_native_tool_calls_agree_with_the_python_front_end(servers: tuple[RunningServer, RunningServer]) -> None:
    for body in ({"text": "Call a tool:", "tools": TOOLS, "tool_choice": "required",
                  "sampling_params": {"max_new_tokens": 120, "temperature": 1.0, "seed": 4}},
                 {"input_ids": [5, 6, 7], "tools": TOOLS, "sampling_params": {"max_new_tokens": 60, "temperature": 0,
                                                                              "logit_bias": {TOOL_CALL_TOKEN: 100}}}):
        answers = [post(s, "/generate", body) for s in servers]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        py, rs = (a.json() for a in answers)
        assert comparable("/generate", rs) == comparable("/generate", py)
        assert without_ids({"tool_calls": rs["tool_calls"]}) == without_ids({"tool_calls": py["tool_calls"]})
        assert rs["content"] == py["content"] and rs["tool_calls"]


TOOL_REFUSALS = [
    {"tools": [TOOLS[0], {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}}}}], "tool_choice": "required"},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tool_choice": "auto"},
    {"tools": []},
    {"tools": [{"type": "function", "function": {"name": "a b"}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]},
    {"tools": TOOLS, "regex": "<[a-z]+>"},
    {"tools": TOOLS, "tool_choice": "sometimes"},
    {"chat_template_kwargs": {"bos_token": "<x>", "messages": []}},
    {"tools": TOOLS, "chat_template_kwargs": {"tools": []}},
    {"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "ping", "arguments": "{not json"}}]}]},
    {"messages": [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "ping"}}]}]},
]


@pytest.mark.parametrize("body", TOOL_REFUSALS)
def test_tool_input_is_refused_naming_the_same_field(servers: tuple[RunningServer, RunningServer],
                                                    body: dict[str, Any]) -> None:
    py, rs = (post(s, CHAT_PATH, {"messages": ASK, "max_tokens": 4, **body}) for s in servers)
    assert py.status_code == 400, py.text
    assert (rs.status_code, rs.json()["error"]["param"]) == (400, py.json()["error"]["param"]), (py.text, rs.text)


@pytest.fixture(scope="module")
def thinking_servers() -> Iterator[tuple[RunningServer, RunningServer]]:
    flags = ("--max-total-tokens", "4096", "--reasoning-parser", "deepseek_r1")
    with running_server(*flags, frontend="python") as py, running_server(*flags, frontend="rust") as rs:
        yield py, rs


@pytest.mark.parametrize("body", [
    {"temperature": 1.0, "seed": 2, "max_tokens": 60, "logit_bias": {THINK_END_TOKEN: 8}},
    {"temperature": 1.0, "seed": 3, "max_tokens": 120, "logit_bias": {THINK_END_TOKEN: 12},
     "response_format": {"type": "json_object"}},
    {"tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": 0, "max_tokens": 200,
     "logit_bias": {THINK_END_TOKEN: 12, TOOL_CALL_TOKEN: 12}},
], ids=["reasoning", "reasoning-then-json", "reasoning-then-calls"])
def test_reasoning_agrees_with_the_python_front_end(thinking_servers: tuple[RunningServer, RunningServer],
                                                   body: dict[str, Any]) -> None:
    check_tools_agree(thinking_servers, body)
