"""Many clients at once, clients that go away, slow readers, and the Prometheus counters,
against a real ``ferrolm serve``. Every loop here is bounded in count and time."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from ferrolm.server.testing import RunningServer, engine_pid, rss_bytes, running_server, wait_until
from prometheus_client.parser import text_string_to_metric_families

CONCURRENT_STREAMS = 64  # the issue asks for 64 concurrent streams


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with running_server("--max-running-requests", "64", "--max-total-tokens", "16384") as s:
        yield s


def load(server: RunningServer) -> dict[str, int]:
    return httpx.get(f"{server.url}/server_info", timeout=30).json()["load"]


def assert_no_request_holds_kv(server: RunningServer) -> None:
    after = wait_until(lambda: (s := load(server))["running"] == 0 and s["waiting"] == 0 and s)
    assert after["kv_used"] == after["cached_tokens"], after


def metric_values(server: RunningServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels or set(s.labels) == {"le"} and s.labels["le"] == "+Inf"
    }


LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}


def test_concurrent_streams_all_complete(server: RunningServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"client {i} says hello"}],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_of_them() -> list[tuple[str, str | None]]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(CONCURRENT_STREAMS))), 150)
        finally:
            await client.close()

    results = asyncio.run(all_of_them())
    assert len(results) == CONCURRENT_STREAMS
    assert all(finish in ("length", "stop") for _, finish in results)
    # the same prompt alone gives the same text as in the crowd (greedy)
    alone = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "client 7 says hello"}], max_tokens=12, temperature=0
    )
    assert alone.choices[0].message.content == results[7][0]
    assert_no_request_holds_kv(server)


def test_stream_disconnect_aborts_and_frees_kv(server: RunningServer) -> None:
    body = {"model": "tiny", "prompt": "go on and on", "stream": True, **LONG}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]  # a few events, then hang up
        assert any(line.startswith("data: ") for line in got)
        assert load(server)["running"] == 1
    assert_no_request_holds_kv(server)


def test_non_streamed_disconnect_aborts_and_frees_kv(server: RunningServer) -> None:
    body = {"model": "tiny", "prompt": "a long answer please", **LONG}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    assert_no_request_holds_kv(server)
    stats = load(server)
    assert stats["generation_tokens"] < 10_000  # the 3000-token answer was not finished in the background


def test_slow_reader_loses_nothing(server: RunningServer) -> None:
    body = {"model": "tiny", "prompt": "slow reader", "max_tokens": 40, "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        for i, line in enumerate(r.iter_lines()):
            if i == 0:
                time.sleep(1.0)  # the engine runs ahead meanwhile
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[len("data: ") :])["choices"][0]["text"]
    assert text == whole


def test_metrics_count_the_requests_sent(server: RunningServer) -> None:
    before = metric_values(server)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    prompt_tokens = completion_tokens = 0
    sent = 5
    for i in range(sent):
        r = client.completions.create(model="tiny", prompt=f"metrics request {i}", max_tokens=4 + i, temperature=0)
        assert r.usage is not None
        prompt_tokens += r.usage.prompt_tokens
        completion_tokens += r.usage.completion_tokens
    after = metric_values(server)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta("ferrolm:num_requests_finished_total") == sent
    assert delta("ferrolm:prompt_tokens_total") == prompt_tokens
    assert delta("ferrolm:generation_tokens_total") == completion_tokens
    assert delta("ferrolm:time_to_first_token_seconds_count") == sent
    assert delta("ferrolm:e2e_request_latency_seconds_count") == sent
    assert delta("ferrolm:queue_time_seconds_count") == sent
    assert delta("ferrolm:inter_token_latency_seconds_count") == completion_tokens - sent
    for name in (
        "ferrolm:num_running_reqs",
        "ferrolm:num_queue_reqs",
        "ferrolm:kv_cache_usage",
        "ferrolm:cache_hit_tokens_total",
        "ferrolm:num_retractions_total",
    ):
        assert name in after, name
    assert after["ferrolm:num_running_reqs"] == 0


def test_abort_an_openai_stream_by_its_id(server: RunningServer) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "abort me"}], "stream": True, **LONG}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        first = json.loads(next(lines)[len("data: ") :])
        aborted = httpx.post(f"{server.url}/abort_request", json={"rid": first["id"]}, timeout=30).json()
        assert aborted == {"aborted": 1}
        rest = list(lines)  # bounded: the request ends now, well before 3000 tokens
    assert rest[-1] == "data: [DONE]"
    finish = json.loads(rest[-2][len("data: ") :])["choices"][0]
    assert finish["finish_reason"] == "abort" and finish["delta"] == {}
    assert_no_request_holds_kv(server)


# ---- soak: clients that hang up at random, aborts, all at once ----

SOAK_WARMUP = 80
SOAK_REQUESTS = 300
SOAK_CONCURRENCY = 16
PREFIXES = ["You are a helpful assistant. " * 4, "Translate the following text. " * 3, "Summarize: "]


async def soak_one(client: httpx.AsyncClient, rng: random.Random, i: int) -> str:
    """One request of a random kind; returns how it ended. Never waits unboundedly."""
    route = rng.choice(["/v1/completions", "/v1/chat/completions", "/generate"])
    text = rng.choice(PREFIXES) + f"request {i} " + "x" * rng.randrange(0, 40)
    budget = rng.randrange(1, 48)
    kind = rng.choice(["whole", "whole", "stream", "stream-hangup", "hangup", "abort"])
    stream = kind in ("stream", "stream-hangup", "abort")
    rid = f"soak-{i}"
    extra: dict[str, Any] = {"ignore_eos": rng.random() < 0.5}
    if rng.random() < 0.3:
        extra["cache_salt"] = rng.choice(["tenant-a", "tenant-b"])
    if route == "/generate":
        body: dict[str, Any] = {
            "text": text,
            "rid": rid,
            "stream": stream,
            "sampling_params": {"max_new_tokens": budget, **extra, "n": 1 if stream else rng.choice([1, 2])},
        }
        if "cache_salt" in extra:
            body["cache_salt"] = body["sampling_params"].pop("cache_salt")
    elif route == "/v1/completions":
        body = {"prompt": text, "max_tokens": budget, "stream": stream, "n": rng.choice([1, 2]), **extra}
    else:
        body = {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": budget,
            "stream": stream,
            "n": rng.choice([1, 2]),
            **extra,
        }
    if kind == "hangup":  # a non-streamed request whose client goes away at a random moment
        try:
            await asyncio.wait_for(client.post(route, json=body), timeout=rng.uniform(0.001, 0.1))
            return "finished"
        except TimeoutError:
            return "hung up"
    async with client.stream("POST", route, json=body) as r:
        assert r.status_code == 200, await r.aread()
        if not stream:
            payload = json.loads(await r.aread())
            reasons = (
                [c["finish_reason"] for c in payload["choices"]]
                if "choices" in payload
                else [
                    (p["meta_info"]["finish_reason"] or {}).get("type")
                    for p in (payload if isinstance(payload, list) else [payload])
                ]
            )
            assert set(reasons) <= {"length", "stop", "abort"}, payload
            return "finished"
        events = 0
        stop_after = rng.randrange(1, 6)
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            data = line[len("data: ") :]
            # An error event is an object with an "error" member; the model's own text may say "error".
            assert data == "[DONE]" or "error" not in json.loads(data), line
            if kind == "stream-hangup" and events >= stop_after:
                return "hung up"  # leaving the block closes the connection mid-stream
            if kind == "abort" and events == 1:
                abort_id = rid if route == "/generate" else json.loads(data)["id"]
                target = {"abort_all": True} if rng.random() < 0.03 else {"rid": abort_id}
                assert (await client.post("/abort_request", json=target)).status_code == 200
        return "streamed"


def soak(server: RunningServer, count: int, seed: int) -> dict[str, int]:
    async def run() -> dict[str, int]:
        rng = random.Random(seed)
        gate = asyncio.Semaphore(SOAK_CONCURRENCY)
        ends: dict[str, int] = {}
        limits = httpx.Limits(max_connections=SOAK_CONCURRENCY * 2)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:

            async def one(i: int) -> None:
                async with gate:
                    end = await soak_one(client, random.Random(rng.random()), i)
                    ends[end] = ends.get(end, 0) + 1

            await asyncio.wait_for(asyncio.gather(*(one(seed * 10_000 + i) for i in range(count))), 150)
        return ends

    return asyncio.run(run())


def test_soak_with_random_disconnects_and_aborts_leaks_nothing(server: RunningServer) -> None:
    processes = {"server": engine_pid(server)}  # the HTTP threads and the step loop share it
    soak(server, SOAK_WARMUP, seed=1)  # allocators, caches and the token table settle first
    assert_no_request_holds_kv(server)
    before = {name: rss_bytes(pid) for name, pid in processes.items()}
    ends = soak(server, SOAK_REQUESTS, seed=2)
    assert sum(ends.values()) == SOAK_REQUESTS
    assert ends.get("hung up", 0) > 0 and ends.get("streamed", 0) > 0, ends
    assert_no_request_holds_kv(server)
    after = {name: rss_bytes(pid) for name, pid in processes.items()}
    for name in processes:  # flat, generously: a leak of a request's state would grow with the count
        assert after[name] <= before[name] * 1.25 + (64 << 20), (name, before[name] >> 20, after[name] >> 20)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "after the soak", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_without_kv_events_nothing_is_published_but_the_metrics_are_there(server: RunningServer) -> None:
    # the server here runs without --kv-events-config (test_server_kv_events.py: with it)
    info = httpx.get(f"{server.url}/server_info", timeout=30).json()
    assert info["kv_events"] == {"enabled": False, "block_size": 16}
    assert "kv_events_queued" not in info["load"]
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"}' in metrics
    assert "ferrolm:kv_event_batches_published_total" not in metrics


# what /metrics declares, by name and type (the server README lists them)
METRIC_TYPES = {
    "ferrolm:prompt_tokens_total": "counter",
    "ferrolm:generation_tokens_total": "counter",
    "ferrolm:cache_hit_tokens_total": "counter",
    "ferrolm:num_retractions_total": "counter",
    "ferrolm:num_requests_finished_total": "counter",
    "ferrolm:num_request_errors_total": "counter",
    "ferrolm:num_steps_total": "counter",
    "ferrolm:num_running_reqs": "gauge",
    "ferrolm:num_queue_reqs": "gauge",
    "ferrolm:kv_used_tokens": "gauge",
    "ferrolm:kv_capacity_tokens": "gauge",
    "ferrolm:cached_tokens": "gauge",
    "ferrolm:kv_cache_usage": "gauge",
    "ferrolm:cache_hit_rate": "gauge",
    "ferrolm:time_to_first_token_seconds": "histogram",
    "ferrolm:inter_token_latency_seconds": "histogram",
    "ferrolm:e2e_request_latency_seconds": "histogram",
    "ferrolm:queue_time_seconds": "histogram",
    "ferrolm:grammar_compile_seconds": "histogram",
    # as Prometheus's Python client writes a histogram's creation time
    "ferrolm:time_to_first_token_seconds_created": "gauge",
    "ferrolm:inter_token_latency_seconds_created": "gauge",
    "ferrolm:e2e_request_latency_seconds_created": "gauge",
    "ferrolm:queue_time_seconds_created": "gauge",
    "ferrolm:grammar_compile_seconds_created": "gauge",
    # the step loop's forward timing, and the CPU of the commits' sampling threads
    "ferrolm:forward_seconds": "histogram",
    "ferrolm:forward_seconds_created": "gauge",
    "ferrolm:forward_loop_cpu_seconds_total": "counter",
    "ferrolm:sampling_thread_cpu_seconds_total": "counter",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    # vLLM 0.x's names and SGLang's, which the routers read
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:gpu_prefix_cache_queries_total": "counter",
    "vllm:gpu_prefix_cache_hits_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:cache_config_info": "gauge",
    # speculative decoding: vLLM's counters, and drafts by tokens kept
    "vllm:spec_decode_num_drafts_total": "counter",
    "vllm:spec_decode_num_draft_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "ferrolm:spec_decode_accepted_tokens_per_draft": "histogram",
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:max_total_num_tokens": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
}


def test_the_metrics_declared_by_name_and_type(server: RunningServer) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    declared = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert declared == METRIC_TYPES
    # and Prometheus's own parser reads every family
    assert {f.name for f in text_string_to_metric_families(text)} >= {"ferrolm:num_steps", "vllm:num_requests_running"}


def test_an_idle_server_does_not_spin(server: RunningServer) -> None:
    assert_no_request_holds_kv(server)
    pid = engine_pid(server)
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
