"""The server on the torch runner with device sampling forced on gives the same seeded
tokens and logprobs as with the core's CPU sampler, streamed and not: the server's step
loop is the one ``ferrolm.Engine`` runs (``ferrolm.step_loop``), and with device sampling
every token is drawn on the runner's device from the core's sampling columns and comes
back through ``Frontend.commit_tokens`` with its logprobs.

Both servers run in this process (``build_engine``, ``start_frontend`` and the step loop
on a thread), so that the test can check that the tokens really were drawn on the device
(the loop's ``sampling_steps``). ``FERROLM_TEST_DEVICE=cuda`` runs it on a GPU
(``scripts/gpu_check.sh``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed; the torch runner's device sampling is not tested")

from ferrolm.server.args import ServerArgs
from ferrolm.server.rust_frontend import StepLoop
from ferrolm.server.testing import serving_in_process
from small_models import TORCH_TEST_DEVICE

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# native /generate bodies: seeded draws with logprobs, penalties and bias on a greedy
# request, a seeded draw under a JSON schema's masks, and plain greedy
NATIVE = [
    {
        "text": "Once upon a time",
        "return_logprob": True,
        "top_logprobs_num": 3,
        "sampling_params": {"temperature": 0.8, "seed": 11, "max_new_tokens": 12, "ignore_eos": True},
    },
    {
        "text": "The weather today",
        "return_logprob": True,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": 12,
            "repetition_penalty": 1.4,
            "frequency_penalty": 0.5,
            "min_new_tokens": 4,
            "logit_bias": {"100": 5.0},
        },
    },
    {
        "text": "A number:",
        "return_logprob": True,
        "sampling_params": {"temperature": 0.7, "seed": 5, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)},
    },
    {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
]
CHAT = {
    "messages": [{"role": "user", "content": "Tell me a story"}],
    "max_tokens": 10,
    "temperature": 0.9,
    "seed": 3,
    "logprobs": True,
    "top_logprobs": 2,
}


@contextmanager
def serving(device_sampling: bool, **more: Any) -> Iterator[tuple[StepLoop, str]]:
    # float32 weights and pool: the two servers' logits are the same numbers
    args = ServerArgs(
        port=0,
        max_total_tokens=4096,
        runner="torch",
        device=TORCH_TEST_DEVICE,
        dtype="float32",
        kv_cache_dtype="float32",
        device_sampling=device_sampling,
        **{"device_greedy": False, **more},
    )
    with serving_in_process(args) as served:
        yield served


def native(url: str, body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The request's final result (a stream's last event)."""
    r = httpx.post(f"{url}/generate", json={**body, "stream": stream}, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return dict(r.json())
    blocks = [b[len("data: ") :] for b in r.text.split("\n\n") if b.strip()]
    assert blocks[-1] == "[DONE]"
    return dict(json.loads(blocks[-2]))


def chat(url: str, stream: bool) -> tuple[str, list[float], list[list[float]]]:
    """Text, token logprobs and top logprobs of the chat answer, a stream's chunks joined."""
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=120)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(b[len("data: ") :]) for b in r.text.split("\n\n") if b.strip() and b != "data: [DONE]"]
        choices = [c["choices"][0] for c in chunks if c["choices"]]
    else:
        choices = r.json()["choices"]
    text, logprobs, tops = "", [], []
    for c in choices:
        text += (c.get("delta") or c.get("message") or {}).get("content") or ""
        for entry in (c.get("logprobs") or {}).get("content") or []:
            logprobs.append(entry["logprob"])
            tops.append([t["logprob"] for t in entry["top_logprobs"]])
    return text, logprobs, tops


def answers(url: str) -> list[Any]:
    out: list[Any] = []
    for stream in (False, True):
        for body in NATIVE:
            result = native(url, body, stream)
            meta = result["meta_info"]
            out.append(
                (
                    result["output_ids"],
                    result["text"],
                    meta["finish_reason"]["type"],
                    meta.get("output_token_logprobs"),
                    meta.get("output_top_logprobs"),
                )
            )
        out.append(chat(url, stream))
    return out


def test_device_sampling_gives_what_the_cpu_sampler_gives_streamed_and_not() -> None:
    with serving(device_sampling=True) as (loop, url):
        assert loop.device_sampling
        on_device = answers(url)
        assert loop.sampling_steps > 0 and loop.greedy_steps == 0
    with serving(device_sampling=False) as (loop, url):
        assert not loop.device_sampling
        on_host = answers(url)
        assert loop.sampling_steps == 0
    assert len(on_device) == len(on_host) == 2 * (len(NATIVE) + 1)
    for got, want in zip(on_device, on_host, strict=True):
        if len(got) == 3:  # chat: text, logprobs, top logprobs
            assert got[0] == want[0]
            np.testing.assert_allclose(got[1], want[1], atol=1e-4)
            for g, w in zip(got[2], want[2], strict=True):
                np.testing.assert_allclose(g, w, atol=1e-4)
            continue
        ids, text, finish, logprobs, tops = got
        assert (ids, text, finish) == want[:3]
        if logprobs is not None:
            assert [t for _, t in logprobs] == [t for _, t in want[3]] == ids
            np.testing.assert_allclose([x for x, _ in logprobs], [x for x, _ in want[3]], atol=1e-4)
            for g, w in zip(tops, want[4], strict=True):
                assert [t for _, t in g] == [t for _, t in w]
                np.testing.assert_allclose([x for x, _ in g], [x for x, _ in w], atol=1e-4)
    # the runs asked for something: seeded text, a schema's JSON, logprobs
    assert all(len(answer[0]) > 0 for answer in on_device)
    assert '"n"' in on_device[2][1].replace(" ", "")
    assert len(on_device[0][4][0]) == 3
    chat_answer = on_device[len(NATIVE)]
    assert len(chat_answer[1]) > 0 and len(chat_answer[2][0]) == 2


THINK_END = 32007  # the tiny model's </think>
# a seeded draw and a greedy one, each with a thinking budget (deepseek_r1: the output
# thinks from its first token, and the tiny model never closes it)
THINKING = [
    {
        "text": "Think",
        "sampling_params": {
            "temperature": 0.8,
            "seed": 4,
            "max_new_tokens": 10,
            "ignore_eos": True,
            "thinking_token_budget": 3,
        },
    },
    {
        "text": "Think",
        "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True, "thinking_token_budget": 2},
    },
]


def test_a_thinking_budget_forces_the_same_tokens_on_the_device_as_on_the_host() -> None:
    got: dict[bool, list[list[int]]] = {}
    for on_device in (True, False):
        with serving(on_device, device_greedy=on_device, reasoning_parser="deepseek_r1") as (loop, url):
            got[on_device] = [native(url, b, stream)["output_ids"] for b in THINKING for stream in (False, True)]
            # a forced step of the greedy request is drawn under the batch's mask, the
            # others are picked greedily on the device
            assert (loop.sampling_steps > 0 and loop.greedy_steps > 0) == on_device
    assert got[True] == got[False]
    for ids, budget in zip(got[True], (3, 3, 2, 2), strict=True):
        assert len(ids) == 10 and ids[budget] == THINK_END and THINK_END not in ids[:budget], ids
