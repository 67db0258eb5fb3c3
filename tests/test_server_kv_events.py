"""``ferrolm serve --kv-events-config``: the stream a real server publishes, decoded by
``msgpack_strict`` and checked against vLLM's format (``test_kv_events_wire.check_batch``)
for inserts, evictions, namespaces (``cache_salt``), ``/flush_cache`` and a subscriber
that joins late; the block hashes against the Python twin's; ``/server_info`` and the
``vllm:`` metrics; bad configurations."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is a dependency of ferrolm (make test installs it)")

from ferrolm.kv_events import chain_hashes, namespace_seed  # noqa: E402
from ferrolm.kv_wire import END_SEQ  # noqa: E402
from ferrolm.server.testing import RunningServer, free_port, running_server  # noqa: E402
from test_kv_events_wire import check_batch  # noqa: E402

BLOCK = 4
TOPIC = b"kv@pod-0@tiny"
KV_TOKENS = 160  # a small pool: the workload below evicts


class Stream:
    """Every batch the server published, by sequence number: from the live socket, with
    gaps (the slow joiner) filled from the replay socket."""

    def __init__(self, ctx: Any, endpoint: str, replay: str) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.ctx, self.replay_endpoint = ctx, replay
        self.frames: dict[int, list[bytes]] = {}  # seq -> [topic, seq, payload] as received live
        self.replayed: dict[int, bytes] = {}  # seq -> payload as replayed

    def catch_up(self, count: int) -> None:
        for _ in range(200):
            if all(s in self.frames or s in self.replayed for s in range(count)):
                return
            if self.sub.poll(100):
                frames = self.sub.recv_multipart()
                self.frames[int.from_bytes(frames[1], "big")] = frames
            else:
                missing = min(s for s in range(count) if s not in self.frames and s not in self.replayed)
                for seq, payload in replay(self.ctx, self.replay_endpoint, missing):
                    self.replayed[seq] = payload
        raise AssertionError(f"the stream did not reach {count} batches")

    def events(self, start: int, stop: int) -> list[dict]:
        out = []
        for seq in range(start, stop):
            frames = self.frames.get(seq) or [TOPIC, seq.to_bytes(8, "big"), self.replayed[seq]]
            got_seq, events = check_batch(frames, TOPIC)
            assert got_seq == seq
            out += events
        return out


def replay(ctx: Any, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """The batches from ``start`` as the replay socket answers a DEALER:
    ``[b"", seq, payload]`` each, then ``[b"", seq = -1, b""]``."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    out = []
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            frames = dealer.recv_multipart()
            assert len(frames) == 3 and frames[0] == b""
            if frames[1] == END_SEQ:
                assert frames[2] == b""
                return out
            out.append((int.from_bytes(frames[1], "big"), frames[2]))
    finally:
        dealer.close()


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def server(ports: tuple[int, int]) -> Iterator[RunningServer]:
    pub, rep = ports
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{rep}",
        "topic": TOPIC.decode(),
    }
    with running_server(
        "--kv-events-config",
        json.dumps(config),
        "--page-size",
        str(BLOCK),
        "--max-total-tokens",
        str(KV_TOKENS),
        "--chunked-prefill-size",
        "64",
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def stream(server: RunningServer, ports: tuple[int, int]) -> Iterator[Stream]:
    ctx = zmq.Context()
    s = Stream(ctx, f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}")
    yield s
    ctx.destroy(linger=0)


def queued(http: httpx.Client) -> int:
    info = http.get("/server_info").json()["kv_events"]
    assert info["dropped_batches"] == 0
    return int(info["queued_batches"])


def generate(http: httpx.Client, ids: list[int], salt: str | None = None, new: int = 4) -> dict[str, Any]:
    if salt is None:
        r = http.post(
            "/generate",
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}},
        )
        r.raise_for_status()
        body = r.json()
        return {"output_ids": body["output_ids"], "cached": body["meta_info"]["cached_tokens"]}
    r = http.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": ids,
            "max_tokens": new,
            "temperature": 0,
            "ignore_eos": True,
            "cache_salt": salt,
        },
    )
    r.raise_for_status()
    return {"output_ids": None, "cached": r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]}


def test_server_info_describes_the_stream(http: httpx.Client, ports: tuple[int, int]) -> None:
    info = http.get("/server_info").json()["kv_events"]
    assert info["enabled"] and info["format"] == "vllm" and info["publisher"] == "zmq"
    assert info["endpoint"] == f"tcp://*:{ports[0]}" and info["replay_endpoint"] == f"tcp://*:{ports[1]}"
    assert info["block_size"] == BLOCK and info["topic"] == TOPIC.decode() and info["bind"]
    settings = http.get("/server_info").json()["settings"]
    assert settings["page_size"] == BLOCK and settings["kv_events_config"]["topic"] == TOPIC.decode()


def test_the_first_batch_clears_what_a_router_held_for_this_endpoint(http: httpx.Client, stream: Stream) -> None:
    # a replica restarted at the same endpoint (after a crash) starts empty: a router
    # following it must drop the blocks of the process before
    assert queued(http) >= 1
    stream.catch_up(1)
    assert stream.events(0, 1) == [{"type": "AllBlocksCleared"}]


def test_inserts_namespaces_evictions_and_flush_in_vllms_format(http: httpx.Client, stream: Stream) -> None:
    start = queued(http)
    # an insert: the prompt's whole blocks when its prefill ends, the output's when it ends
    prompt = list(range(1000, 1010))  # 10 tokens: 2 whole blocks, then 2 tokens
    out = generate(http, prompt)
    after_first = queued(http)
    stream.catch_up(after_first)
    events = stream.events(start, after_first)
    stored = [e for e in events if e["type"] == "BlockStored"]
    sequence = prompt + out["output_ids"]
    hashes = [h for e in stored for h in e["block_hashes"]]
    tokens = [t for e in stored for t in e["token_ids"]]
    kv_len = len(sequence) - 1  # the last output token was never run
    assert tokens == sequence[: kv_len // BLOCK * BLOCK], "whole blocks, in order, prompt then output"
    assert hashes == chain_hashes(namespace_seed(None), tokens, BLOCK), "the Python twin's hashes"
    assert stored[0]["parent_block_hash"] is None and stored[0]["extra_keys"][0] is None
    for a, b in zip(stored, stored[1:]):
        assert b["parent_block_hash"] == a["block_hashes"][-1], "each run chains from the one before"
    # the same prompt under a cache_salt: its own chain, the salt on block 0
    generate(http, prompt, salt="tenant-a")
    after_salt = queued(http)
    stream.catch_up(after_salt)
    salted = [e for e in stream.events(after_first, after_salt) if e["type"] == "BlockStored"]
    assert salted[0]["extra_keys"][0] == ["tenant-a"] and salted[0]["parent_block_hash"] is None
    salted_hashes = [h for e in salted for h in e["block_hashes"]]
    assert salted_hashes[:2] == chain_hashes(namespace_seed("tenant-a"), prompt[:8], BLOCK)
    assert not set(salted_hashes) & set(hashes), "namespaces never share a block"
    # evictions: prompts that fill the pool push the first sequences out
    for k in range(4):
        generate(http, list(range(2000 + 100 * k, 2000 + 100 * k + 60)), new=2)
    after_fill = queued(http)
    stream.catch_up(after_fill)
    removed = {
        h for e in stream.events(after_salt, after_fill) if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    }
    assert set(hashes) <= removed and set(salted_hashes) <= removed, "the first sequences were evicted"
    # a flush is one AllBlocksCleared
    assert http.post("/flush_cache", json={}).json()["success"]
    after_flush = queued(http)
    stream.catch_up(after_flush)
    assert stream.events(after_fill, after_flush) == [{"type": "AllBlocksCleared"}]
    # a late subscriber: everything from 0 by replay, byte for byte what went out live
    late = replay(stream.ctx, stream.replay_endpoint, 0)
    assert [seq for seq, _ in late] == list(range(after_flush)), "every batch, in order, from 0"
    for seq, payload in late:
        if seq in stream.frames:
            assert stream.frames[seq][2] == payload
            assert stream.frames[seq][0] == TOPIC


def test_metrics_export_vllms_load_and_cache_names(http: httpx.Client) -> None:
    prompt = list(range(3000, 3030))
    generate(http, prompt)
    generate(http, prompt)
    text = http.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith("vllm:") or line.startswith("ferrolm:"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    labels = '{engine="0",model_name="tiny"}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert name + labels in values, name
    assert values["vllm:prefix_cache_queries_total" + labels] == values["ferrolm:prompt_tokens_total"]
    assert values["vllm:prefix_cache_hits_total" + labels] == values["ferrolm:cache_hit_tokens_total"] > 0
    assert values["vllm:num_requests_running" + labels] == 0
    # idle: every cached block is evictable, so none is "in use" as vLLM counts it
    assert values["vllm:kv_cache_usage_perc" + labels] == 0.0
    assert values["ferrolm:kv_event_batches_published_total"] > 0
    assert values["ferrolm:kv_event_batches_dropped_total"] == 0


def serve_fails(*flags: str, timeout: float = 120) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "ferrolm.cli", "serve", "--port", str(free_port()), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode != 0
    return r.stdout + r.stderr


@pytest.mark.parametrize(
    "config, field",
    [
        ('{"enable_kv_cache_events": "yes"}', "kv_events_config.enable_kv_cache_events"),
        ('{"enable_kv_cache_events": true, "buffer_step": 5}', "kv_events_config.buffer_step"),
        ("{enable}", "kv_events_config"),
    ],
)
def test_a_bad_config_stops_serve_naming_the_field(config: str, field: str) -> None:
    assert field in serve_fails("--kv-events-config", config, timeout=60)


def test_an_endpoint_in_use_stops_serve_naming_it() -> None:
    ctx = zmq.Context()
    taken = ctx.socket(zmq.PUB)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
        out = serve_fails("--kv-events-config", config)
        assert f"kv_events_config: cannot open 'tcp://*:{port}'" in out
    finally:
        taken.close(linger=0)
        ctx.destroy(linger=0)
