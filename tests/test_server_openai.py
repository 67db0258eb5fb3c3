"""The OpenAI-compatible endpoints through the official ``openai`` client and raw HTTP,
against a real ``ferrolm serve`` of the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ferrolm.server.testing import FRONTENDS, RunningServer, running_server

MODEL = "tiny-served"


@pytest.fixture(scope="module", params=FRONTENDS)
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with running_server("--served-model-name", MODEL, "--max-total-tokens", "8192", frontend=request.param) as s:
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
        data = block[len("data: "):]
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
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0.7,
            "n": 2, "seed": 3, "stream": True, "stream_options": {"include_usage": True}}
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

    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_extra_sampling_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=6, temperature=0.8, top_p=0.9, frequency_penalty=0.5,
        presence_penalty=0.2, logit_bias={"100": 5.0}, seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 6},
    )
    assert r.usage is not None and r.usage.completion_tokens == 6
    assert r.choices[0].finish_reason == "length"


def test_banned_token_never_appears(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=0)
    first = free.choices[0].logprobs.tokens[0]  # type: ignore[union-attr,index]
    gen = httpx.post(str(client.base_url).removesuffix("/v1/") + "/generate",
                     json={"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()
    banned = gen["output_ids"][0]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=0,
                                  logit_bias={str(banned): -100})
    assert r.choices[0].logprobs.tokens[0] != first  # type: ignore[union-attr,index]


def test_models(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert info.value.body["param"] == "model"  # type: ignore[index]
