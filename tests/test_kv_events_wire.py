"""The KV event stream against vLLM's wire format, decoded by ``msgpack_strict`` (not the
package that encodes it): frames, sequence numbers, the batch and event shapes with their
field names and types, replay and its end marker, the bounded queue. The server end to
end is in ``test_server_kv_events.py``."""

from __future__ import annotations

import json
import time

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is a dependency of ferrolm (make test installs it)")
pytest.importorskip("msgpack", reason="msgpack is a dependency of ferrolm (make test installs it)")

from ferrolm.errors import InvalidInputError  # noqa: E402
from ferrolm.kv_events_config import KvEventsConfig, parse_kv_events_config  # noqa: E402
from ferrolm.kv_publisher import KvEventPublisher  # noqa: E402
from ferrolm.kv_wire import END_SEQ, wire_event  # noqa: E402
from ferrolm.server.testing import free_port  # noqa: E402
from msgpack_strict import Float, Int, decode  # noqa: E402

STORED_FIELDS = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
]
REMOVED_FIELDS = ["type", "block_hashes", "medium", "group_idx"]
BIG_HASH = (1 << 64) - 5  # above i64::MAX: must come as uint64


def check_batch(frames: list[bytes], topic: bytes) -> tuple[int, list[dict]]:
    """Checks one PUB message strictly against vLLM's format; returns (seq, events)."""
    assert len(frames) == 3, "[topic, seq, payload]"
    got_topic, seq_bytes, payload = frames
    assert got_topic == topic
    assert len(seq_bytes) == 8, "seq is 8 bytes, big-endian"
    batch = decode(payload)
    assert isinstance(batch, list) and len(batch) == 3, "[ts, events, data_parallel_rank]"
    ts, events, dp_rank = batch
    assert isinstance(ts, Float) and ts.bits == 64 and abs(ts - time.time()) < 600
    assert isinstance(dp_rank, Int) and dp_rank == 0
    assert isinstance(events, list)
    for e in events:
        check_event(e)
    return int.from_bytes(seq_bytes, "big"), events


def check_event(e: dict) -> None:
    assert isinstance(e, dict), "events are tagged maps"
    kind = e["type"]
    if kind == "BlockStored":
        assert list(e) == STORED_FIELDS
        hashes, tokens, size = e["block_hashes"], e["token_ids"], e["block_size"]
        assert hashes and all(isinstance(h, Int) and h.unsigned for h in hashes), "u64 hashes, unsigned"
        parent = e["parent_block_hash"]
        assert parent is None or (isinstance(parent, Int) and parent.unsigned)
        assert isinstance(size, Int) and size > 0
        assert len(tokens) == len(hashes) * size, "whole blocks only"
        assert all(isinstance(t, Int) and t >= 0 for t in tokens)
        assert e["lora_id"] is None and e["lora_name"] is None
        assert e["medium"] == "GPU" and e["group_idx"] == 0 and e["kv_cache_spec_kind"] == "full_attention"
        extra = e["extra_keys"]
        assert isinstance(extra, list) and len(extra) == len(hashes), "one extra_keys entry per block"
        for i, keys in enumerate(extra):
            if keys is not None:
                assert i == 0 and parent is None, "the salt rides on a sequence's first block only"
                assert isinstance(keys, list) and len(keys) == 1 and isinstance(keys[0], str)
    elif kind == "BlockRemoved":
        assert list(e) == REMOVED_FIELDS
        assert e["block_hashes"] and all(isinstance(h, Int) and h.unsigned for h in e["block_hashes"])
        assert e["medium"] == "GPU" and e["group_idx"] == 0
    elif kind == "AllBlocksCleared":
        assert list(e) == ["type"]
    else:
        raise AssertionError(f"unknown event type {kind!r}")


# ---- the config ----


def test_config_has_vllms_fields_and_defaults():
    c = KvEventsConfig()
    assert (
        c.enable_kv_cache_events,
        c.endpoint,
        c.replay_endpoint,
        c.buffer_steps,
        c.hwm,
        c.max_queue_size,
        c.topic,
    ) == (False, "tcp://*:5557", None, 10_000, 100_000, 100_000, "")
    assert c.resolved_publisher == "null" and not c.publishes
    on = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert on.resolved_publisher == "zmq" and on.publishes
    assert not parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}').publishes
    # vLLM's bind-or-connect rule
    binds = {
        e: KvEventsConfig(endpoint=e).binds
        for e in ("tcp://*:5557", "tcp://[::]:5557", "ipc:///tmp/x", "inproc://x", "tcp://router:5557")
    }
    assert binds == {
        "tcp://*:5557": True,
        "tcp://[::]:5557": True,
        "ipc:///tmp/x": True,
        "inproc://x": True,
        "tcp://router:5557": False,
    }


@pytest.mark.parametrize(
    "text, field",
    [
        ("not json", "kv_events_config"),
        ("[1]", "kv_events_config"),
        ('{"enable_kv_cache_event": true}', "kv_events_config.enable_kv_cache_event"),
        ('{"enable_kv_cache_events": 1}', "kv_events_config.enable_kv_cache_events"),
        ('{"publisher": "kafka"}', "kv_events_config.publisher"),
        ('{"endpoint": 5557}', "kv_events_config.endpoint"),
        ('{"endpoint": "localhost:5557"}', "kv_events_config.endpoint"),
        ('{"buffer_steps": 0}', "kv_events_config.buffer_steps"),
        ('{"max_queue_size": true}', "kv_events_config.max_queue_size"),
        ('{"hwm": -1}', "kv_events_config.hwm"),
    ],
)
def test_a_bad_config_names_its_field(text, field):
    with pytest.raises(InvalidInputError) as e:
        parse_kv_events_config(text)
    assert e.value.field == field and field in str(e.value)


# ---- the publisher on its own ----


def stored(hashes, parent, tokens, size, ns=None):
    return ("stored", hashes, parent, tokens, size, ns)


@pytest.fixture
def endpoints():
    port, replay = free_port(), free_port()
    return f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"


def subscribe(ctx, endpoint: str, topic: bytes = b"kv") -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    return sub


def recv(sock: zmq.Socket, timeout_ms: int = 10_000) -> list[bytes]:
    assert sock.poll(timeout_ms), "nothing arrived"
    return sock.recv_multipart()


def ask_replay(ctx, endpoint: str, start: int) -> list[list[bytes]]:
    """What the replay socket answers a DEALER (as Dynamo's listener asks; a REQ socket
    would take only the first reply), less the empty delimiter frame."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies = []
        while True:
            frames = recv(dealer)
            assert frames[0] == b"", "an empty delimiter first"
            replies.append(frames[1:])
            if replies[-1][0] == END_SEQ:
                return replies
    finally:
        dealer.close()


def test_batches_go_out_in_vllms_format_in_sequence_and_replay_from_any_point(endpoints):
    pub_ep, replay_ep = endpoints
    config = parse_kv_events_config(
        json.dumps(
            {
                "enable_kv_cache_events": True,
                "endpoint": pub_ep.replace("127.0.0.1", "*"),
                "replay_endpoint": replay_ep.replace("127.0.0.1", "*"),
                "topic": "kv",
            }
        )
    )
    publisher = KvEventPublisher(config)
    ctx = zmq.Context()
    try:
        sub = subscribe(ctx, pub_ep)
        # the slow joiner: whatever is sent before the subscription takes effect is lost
        # to it, so the subscriber learns where the stream is from a probe it can see
        batches = [
            [stored([1, BIG_HASH], None, list(range(8)), 4)],
            [stored([7], BIG_HASH, [8, 9, 10, 11], 4), ("removed", [1])],
            [stored([9], None, [5, 5, 5, 5], 4, "tenant-a")],
            [("cleared",)],
        ]
        for raw in batches:
            assert publisher.publish(raw)
        assert publisher.wait_handled(len(batches), 10.0)
        assert publisher.sent == 4 and publisher.dropped == 0
        # a subscriber that joined late gets everything from the replay socket
        replies = ask_replay(ctx, replay_ep, 0)
        assert [len(r) for r in replies] == [2] * 5, "[seq, payload], then the end marker"
        assert replies[-1] == [END_SEQ, b""]
        seqs, events = [], []
        for seq_bytes, payload in replies[:-1]:
            seq, evs = check_batch([b"kv", seq_bytes, payload], b"kv")
            seqs.append(seq)
            events.append(evs)
        assert seqs == [0, 1, 2, 3], "+1 per batch from 0"
        first, second, salted, cleared = events
        assert first[0]["block_hashes"] == [1, BIG_HASH] and first[0]["block_hashes"][1].fmt == "uint64"
        assert first[0]["extra_keys"] == [None, None] and first[0]["parent_block_hash"] is None
        assert second[0]["parent_block_hash"] == BIG_HASH and second[0]["token_ids"] == [8, 9, 10, 11]
        assert second[1]["type"] == "BlockRemoved" and second[1]["block_hashes"] == [1]
        assert salted[0]["extra_keys"] == [["tenant-a"]], "cache_salt on block 0, as vLLM sets it"
        assert cleared == [{"type": "AllBlocksCleared"}]
        # from the middle; and past the end only the marker
        assert [int.from_bytes(r[0], "big") for r in ask_replay(ctx, replay_ep, 2)[:-1]] == [2, 3]
        assert ask_replay(ctx, replay_ep, 99) == [[END_SEQ, b""]]
        # live: once subscribed, the next batch arrives as three frames with the next seq.
        # The subscription may have taken effect while the first four went out: those
        # arrive first, and must be the same batches the replay socket gave.
        deadline = time.monotonic() + 20
        while True:
            publisher.publish([("removed", [7])])
            if sub.poll(200):
                seq, evs = check_batch(sub.recv_multipart(), b"kv")
                while seq < len(batches):
                    assert evs == events[seq], "a batch seen live differs from its replay"
                    seq, evs = check_batch(recv(sub), b"kv")
                break
            assert time.monotonic() < deadline, "the subscription never took effect"
        assert seq >= 4 and evs == [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0}]
        sub.close()
    finally:
        publisher.shutdown()
        ctx.destroy(linger=0)


def test_a_topic_filters_and_a_malformed_replay_request_gets_the_end_marker(endpoints):
    pub_ep, replay_ep = endpoints
    publisher = KvEventPublisher(
        KvEventsConfig(
            enable_kv_cache_events=True,
            endpoint=pub_ep.replace("127.0.0.1", "*"),
            replay_endpoint=replay_ep,
            topic="kv@pod-1@tiny",
        )
    )
    ctx = zmq.Context()
    try:
        other = subscribe(ctx, pub_ep, b"kv@pod-2")
        mine = subscribe(ctx, pub_ep, b"kv@pod-1@")
        deadline = time.monotonic() + 20
        while not mine.poll(200):
            publisher.publish([("cleared",)])
            assert time.monotonic() < deadline
        assert mine.recv_multipart()[0] == b"kv@pod-1@tiny"
        assert not other.poll(100), "another pod's subscriber gets nothing"
        req = ctx.socket(zmq.REQ)
        req.connect(replay_ep)
        req.send(b"\x01\x02")  # not 8 bytes
        assert recv(req) == [END_SEQ, b""], "a REQ client is not left waiting"
        req.close(linger=0)
        other.close()
        mine.close()
    finally:
        publisher.shutdown()
        ctx.destroy(linger=0)


def test_a_full_queue_drops_and_counts_without_blocking(endpoints, monkeypatch):
    pub_ep, _ = endpoints
    publisher = KvEventPublisher(
        KvEventsConfig(enable_kv_cache_events=True, endpoint=pub_ep.replace("127.0.0.1", "*"), max_queue_size=2)
    )
    try:
        # hold the thread so that the queue fills: its encoder waits on a lock we own
        import threading

        import ferrolm.kv_publisher as mod

        gate = threading.Event()
        real = mod.encode_batch

        def slow(*a, **kw):
            gate.wait(10)
            return real(*a, **kw)

        monkeypatch.setattr(mod, "encode_batch", slow)
        results = [publisher.publish([("cleared",)]) for _ in range(10)]
        assert results.count(False) >= 7, results  # 2 queued, at most 1 taken by the thread
        assert publisher.dropped == results.count(False) and publisher.queued == results.count(True)
        gate.set()
        assert publisher.wait_handled(publisher.queued, 10.0)
        assert publisher.sent == publisher.queued
    finally:
        publisher.shutdown()


def test_an_address_in_use_fails_at_start_naming_it(endpoints):
    pub_ep, _ = endpoints
    config = KvEventsConfig(enable_kv_cache_events=True, endpoint=pub_ep.replace("127.0.0.1", "*"))
    first = KvEventPublisher(config)
    try:
        with pytest.raises(OSError, match="kv_events_config: cannot open 'tcp://\\*:"):
            KvEventPublisher(config)
    finally:
        first.shutdown()


def test_wire_event_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown raw KV event kind"):
        wire_event(("moved", [1]))
