"""The OpenAI-compatible endpoints through the official ``openai`` client and raw HTTP,
against a real ``ferrolm serve`` of the tiny model."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from ferrolm.server.testing import RunningServer, running_server

MODEL = "tiny-served"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--served-model-name", MODEL, "--max-total-tokens", "8192") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def sse_events(response: httpx.Response) -> list[Any]:
    """The JSON payloads of an SSE body, then "[DONE]" as a string."""
    events: list[Any] = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_completion_greedy_is_reproducible_and_usage_is_exact(client: openai.OpenAI, server: RunningServer) -> None:
    a = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0)
    b = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0)
    assert a.object == "text_completion" and a.model == MODEL
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason in ("length", "stop")
    from ferrolm.model.loader import resolve_model_folder
    from ferrolm.model.tokenizer import Tokenizer

    prompt_len = len(Tokenizer.from_folder(resolve_model_folder("tiny")).encode("The quick brown fox"))
    assert a.usage is not None and b.usage is not None
    assert a.usage.prompt_tokens == prompt_len
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens
    if a.choices[0].finish_reason == "length":
        assert a.usage.completion_tokens == 12


def test_cached_tokens_rise_on_a_repeated_prefix(client: openai.OpenAI) -> None:
    prompt = "A long shared system prompt about radix trees and prefix caching, " * 8
    first = client.completions.create(model=MODEL, prompt=prompt + "first", max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt + "second", max_tokens=2, temperature=0)
    assert first.usage is not None and second.usage is not None
    cached_first = first.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    cached_second = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached_second > cached_first
    assert cached_second >= second.usage.prompt_tokens // 2


def test_streamed_equals_non_streamed_at_temperature_0(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "temperature": 0}
    whole = client.completions.create(prompt="Once upon a time", **kw)
    parts = list(client.completions.create(prompt="Once upon a time", stream=True, **kw))
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in parts if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]

    messages = [{"role": "user", "content": "Tell me a story"}]
    chat = client.chat.completions.create(messages=messages, **kw)  # type: ignore[arg-type]
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant"


def test_chat_stream_framing(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "temperature": 0.7,
        "n": 2,
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}, "the role comes first"
        finishes = [c for c in mine if c["finish_reason"] is not None]
        assert len(finishes) == 1 and finishes[0] is mine[-1], "one finish chunk per choice, last"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    assert "cached_tokens" in usage_chunk["usage"]["prompt_tokens_details"]
    assert all(c["usage"] is None for c in chunks[:-1])


def test_n_samples_and_seed(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "prompt": "Roses are", "max_tokens": 8, "temperature": 1.0, "n": 3}
    a = client.completions.create(seed=11, **kw)
    b = client.completions.create(seed=11, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "same seed, same text"
    assert len({c.text for c in a.choices}) > 1, "the samples of one request differ"
    assert a.usage is not None
    if all(c.finish_reason == "length" for c in a.choices):
        assert a.usage.completion_tokens == 3 * 8


def test_several_prompts_in_one_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=["one", "two"], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree
    single = client.completions.create(model=MODEL, prompt="two", max_tokens=3, temperature=0)
    assert r.choices[2].text == single.choices[0].text


def test_stop_string(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="Counting:", max_tokens=16, temperature=0)
    text = free.choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    stopped = client.completions.create(model=MODEL, prompt="Counting:", max_tokens=16, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_logprobs_shapes(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x is not None and x <= 0 for x in lp.token_logprobs)
    assert all(len(top) <= 3 for top in lp.top_logprobs)

    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_extra_sampling_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=6,
        temperature=0.8,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=0.2,
        logit_bias={"100": 5.0},
        seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 6},
    )
    assert r.usage is not None and r.usage.completion_tokens == 6
    assert r.choices[0].finish_reason == "length"


def test_banned_token_never_appears(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=0)
    first = free.choices[0].logprobs.tokens[0]  # type: ignore[union-attr,index]
    gen = httpx.post(
        str(client.base_url).removesuffix("/v1/") + "/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
    ).json()
    banned = gen["output_ids"][0]
    r = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=0, logit_bias={str(banned): -100}
    )
    assert r.choices[0].logprobs.tokens[0] != first  # type: ignore[union-attr,index]


def test_models(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    # an unknown model is a 404 (OpenAI's and vLLM's answer), naming the field
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert info.value.body["param"] == "model"  # type: ignore[index]


# ---- the server's tokens are the offline Engine's ----
# Each request below is sent to the server and run by an offline ``Engine`` built as the
# server builds its own (``build_engine``), with the SamplingParams the fields stand for;
# both caches flushed first, so both compute the same batches. The same tokens, text,
# finish and log-probabilities, greedy and seeded, say the server reads every field into
# the right parameter (structured-output fields included) and formats what comes back
# without loss.

OBJECT = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"enum": [1, 2, 3]}},
    "required": ["name", "n"],
}
C, G = "/v1/completions", "/v1/chat/completions"
CHAT_MSGS: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}]
JSON_PLEASE: list[Any] = [{"role": "user", "content": "JSON please"}]
OFFLINE = [
    pytest.param(
        C,
        {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0},
        "The quick brown fox",
        dict(max_new_tokens=16, temperature=0),
        id="greedy",
    ),
    pytest.param(
        C,
        {"prompt": ["one", "two"], "max_tokens": 6, "temperature": 0.9, "seed": 7, "n": 2},
        ["one", "two"],
        dict(max_new_tokens=6, temperature=0.9, seed=7, n=2),
        id="seeded-n2-two-prompts",
    ),
    pytest.param(
        C,
        {"prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0, "logprobs": 2},
        [1, 2, 3, 4],
        dict(max_new_tokens=5, temperature=0, logprobs=True, top_logprobs=2),
        id="ids-logprobs",
    ),
    pytest.param(
        C,
        {
            "prompt": "Counting:",
            "max_tokens": 16,
            "temperature": 0,
            "stop": [" the", "ing"],
            "include_stop_str_in_output": True,
        },
        "Counting:",
        dict(max_new_tokens=16, temperature=0, stop=[" the", "ing"], include_stop_str=True),
        id="stop",
    ),
    pytest.param(
        C,
        {"prompt": "code:", "regex": "[a-z]{3}-[0-9]{2}", "max_tokens": 12, "temperature": 0},
        "code:",
        dict(max_new_tokens=12, temperature=0, regex="[a-z]{3}-[0-9]{2}"),
        id="regex-greedy",
    ),
    pytest.param(
        C,
        {
            "prompt": ["a", "b"],
            "guided_regex": "(yes|no|maybe)!",
            "max_tokens": 8,
            "temperature": 1.0,
            "seed": 4,
            "n": 2,
        },
        ["a", "b"],
        dict(max_new_tokens=8, temperature=1.0, seed=4, n=2, regex="(yes|no|maybe)!"),
        id="guided_regex-n2",
    ),
    pytest.param(
        C,
        {"prompt": "JSON:", "json_schema": OBJECT, "max_tokens": 40, "temperature": 0.8, "seed": 11, "logprobs": 1},
        "JSON:",
        dict(max_new_tokens=40, temperature=0.8, seed=11, json_schema=OBJECT, logprobs=True, top_logprobs=1),
        id="json_schema-seeded-logprobs",
    ),
    pytest.param(
        C,
        {"prompt": "JSON:", "guided_json": json.dumps(OBJECT), "max_tokens": 40, "temperature": 0},
        "JSON:",
        dict(max_new_tokens=40, temperature=0, json_schema=json.dumps(OBJECT)),
        id="guided_json-text",
    ),
    pytest.param(
        C,
        {"prompt": "pick", "guided_choice": ["alpha", "beta", "gamma"], "max_tokens": 8, "temperature": 1.0, "seed": 2},
        "pick",
        dict(max_new_tokens=8, temperature=1.0, seed=2, choice=["alpha", "beta", "gamma"]),
        id="guided_choice",
    ),
    pytest.param(
        C,
        {"prompt": "g", "guided_grammar": 'root ::= "(" [a-c]* ")"', "max_tokens": 10, "temperature": 0.9, "seed": 5},
        "g",
        dict(max_new_tokens=10, temperature=0.9, seed=5, ebnf='root ::= "(" [a-c]* ")"'),
        id="guided_grammar",
    ),
    pytest.param(
        C,
        {"prompt": "g", "grammar": 'root ::= "x" | "y" root', "max_tokens": 10, "temperature": 0.9, "seed": 6},
        "g",
        dict(max_new_tokens=10, temperature=0.9, seed=6, ebnf='root ::= "x" | "y" root'),
        id="grammar",
    ),
    pytest.param(
        "/generate",
        {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 10, "temperature": 0}},
        "Once upon a time",
        dict(max_new_tokens=10, temperature=0),
        id="generate",
    ),
    pytest.param(
        "/generate",
        {
            "input_ids": [5, 6, 7],
            "return_logprob": True,
            "top_logprobs_num": 1,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.7, "seed": 1, "n": 2},
        },
        [5, 6, 7],
        dict(max_new_tokens=4, temperature=0.7, seed=1, n=2, logprobs=True, top_logprobs=1),
        id="generate-seeded-n2",
    ),
    pytest.param(
        "/generate",
        {
            "text": "JSON:",
            "sampling_params": {"json_schema": OBJECT, "max_new_tokens": 40, "temperature": 0.7, "seed": 3, "n": 2},
        },
        "JSON:",
        dict(max_new_tokens=40, temperature=0.7, seed=3, n=2, json_schema=OBJECT),
        id="generate-json_schema-n2",
    ),
    pytest.param(
        "/generate",
        {"text": "E:", "sampling_params": {"ebnf": 'root ::= [0-9]+ "." [0-9]', "max_new_tokens": 8, "temperature": 0}},
        "E:",
        dict(max_new_tokens=8, temperature=0, ebnf='root ::= [0-9]+ "." [0-9]'),
        id="generate-ebnf",
    ),
    pytest.param(
        G,
        {"messages": CHAT_MSGS, "max_tokens": 12, "temperature": 0},
        CHAT_MSGS,
        dict(max_new_tokens=12, temperature=0),
        id="chat-greedy",
    ),
    pytest.param(
        G,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_completion_tokens": 8,
            "temperature": 1.0,
            "top_p": 0.9,
            "seed": 3,
            "logprobs": True,
            "top_logprobs": 2,
        },
        [{"role": "user", "content": "Hi"}],
        dict(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3, logprobs=True, top_logprobs=2),
        id="chat-seeded-logprobs",
    ),
    pytest.param(
        G,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        [{"role": "user", "content": "Hi"}],
        dict(max_new_tokens=8, temperature=0),
        id="chat-template-kwargs",
    ),
    pytest.param(
        G,
        {
            "messages": JSON_PLEASE,
            "max_tokens": 30,
            "temperature": 1.0,
            "seed": 9,
            "response_format": {"type": "json_object"},
        },
        JSON_PLEASE,
        dict(max_new_tokens=30, temperature=1.0, seed=9, json_object=True),
        id="chat-json_object",
    ),
    pytest.param(
        G,
        {
            "messages": JSON_PLEASE,
            "max_tokens": 40,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": OBJECT, "strict": True}},
        },
        JSON_PLEASE,
        dict(max_new_tokens=40, temperature=0, json_schema=OBJECT, json_schema_strict=True),
        id="chat-json_schema-strict",
    ),
    pytest.param(
        G,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 6,
            "temperature": 0,
            "response_format": {"type": "text"},
        },
        [{"role": "user", "content": "hi"}],
        dict(max_new_tokens=6, temperature=0),
        id="chat-response_format-text",
    ),
]


@pytest.fixture(scope="module")
def offline() -> Any:
    from ferrolm.server.args import ServerArgs
    from ferrolm.server.rust_frontend import build_engine

    # the server's flags (its runner too, under FERROLM_TEST_RUNNER): the same engine
    args = ServerArgs(max_total_tokens=8192)
    runner = os.environ.get("FERROLM_TEST_RUNNER")
    if runner:
        args.runner, args.device = runner, "cpu"
    return build_engine(args)


def close(got: list[float], want: list[float]) -> bool:
    return got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(("path", "body", "prompt", "params"), OFFLINE)
def test_the_server_gives_the_offline_engines_tokens(
    server: RunningServer, offline: Any, path: str, body: dict[str, Any], prompt: Any, params: dict[str, Any]
) -> None:
    from ferrolm.sampling_params import SamplingParams

    assert httpx.post(f"{server.url}/flush_cache", json={}, timeout=60).status_code == 200
    offline.core.flush_cache()
    r = httpx.post(f"{server.url}{path}", json={"model": MODEL, **body} if path != "/generate" else body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    sampling = SamplingParams(**params)
    if path == G:
        kwargs = {"chat_template_kwargs": body["chat_template_kwargs"]} if "chat_template_kwargs" in body else {}
        chats = offline.chat(prompt, sampling, **kwargs)
        assert [(c["message"]["content"], c["finish_reason"]) for c in answer["choices"]] == [
            (c.content, c.finish_reason) for c in chats
        ]
        assert answer["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in chats)
        if body.get("logprobs"):
            [choice], [chat] = answer["choices"], chats
            assert [e["token"] for e in choice["logprobs"]["content"]] == [
                offline.tokenizer.decode([t]) for t in chat.token_ids
            ]
        return
    results = offline.generate(prompt, sampling)
    if path == "/generate":
        items = answer if isinstance(answer, list) else [answer]
        assert [(a["output_ids"], a["text"], a["meta_info"]["finish_reason"]["type"]) for a in items] == [
            (x.token_ids, x.text, x.finish_reason) for x in results
        ]
        if body.get("return_logprob"):
            for a, x in zip(items, results):
                assert close([lp for lp, *_ in a["meta_info"]["output_token_logprobs"]], x.logprobs)
        return
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [
        (i, x.text, x.finish_reason) for i, x in enumerate(results)
    ]
    assert answer["usage"]["completion_tokens"] == sum(len(x.token_ids) for x in results)
    if "logprobs" in body:
        for c, x in zip(answer["choices"], results):
            assert close(c["logprobs"]["token_logprobs"], x.logprobs)
            assert [len(top) for top in c["logprobs"]["top_logprobs"]] == [len(top) for top in x.top_logprobs]


# (plain completions and chat: test_streamed_equals_non_streamed_at_temperature_0; a regex:
# test_server_structured)
@pytest.mark.parametrize(
    ("path", "body"),
    [(p.values[0], p.values[1]) for p in OFFLINE if p.id in ("guided_choice", "chat-json_schema-strict")],
)
def test_a_stream_carries_the_same_answer(server: RunningServer, path: str, body: dict[str, Any]) -> None:
    whole = httpx.post(f"{server.url}{path}", json=body, timeout=120).json()
    r = httpx.post(
        f"{server.url}{path}", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=120
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(
        (c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "")
        for c in chunks
        if c["choices"]
    )
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    choice = whole["choices"][0]
    assert text == choice.get("text", (choice.get("message") or {}).get("content"))
    assert finishes == [choice["finish_reason"]]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: chunks[-1]["usage"][k] for k in counts} == {k: whole["usage"][k] for k in counts}


TRICKY_TEXTS = [
    "Hello, world!",
    "  leading and trailing  ",
    "tabs\tand\nnew\n\n\nlines\r\n",
    "123456789 3.14159",
    "é ü ñ 中文 日本語 한국어",
    "emoji \U0001f600\U0001f44d\U0001f3fd",
    "<|im_start|>user\nhi<|im_end|>",
    "don't you're we'll I'm",
    "a" * 300,
    "x = f(y) -> {z: [1, 2]};",
    "\u200b zero\u00a0width",
]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_prompts_are_tokenized_as_the_models_tokenizer_does(server: RunningServer, tiny: Any, text: str) -> None:
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    assert r["meta_info"]["prompt_tokens"] == len(tiny.tokenizer.encode(text))
