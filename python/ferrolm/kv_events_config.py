"""``--kv-events-config``: where and how the KV cache events go, with vLLM's field names
and defaults, so a command line written for ``vllm serve`` works here unchanged.

    ferrolm serve --kv-events-config '{"enable_kv_cache_events": true, "topic": "kv-events"}'
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ferrolm.errors import InvalidInputError

PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    enable_kv_cache_events: bool = False
    # None: "zmq" when events are on, else "null" (as vLLM resolves it)
    publisher: str | None = None
    # bound when it names a wildcard (`*`, `::`) or is ipc:// or inproc://, else connected
    endpoint: str = "tcp://*:5557"
    # a ROUTER socket that answers a start sequence number with the buffered batches
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (messages; 0: no limit)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread; more are dropped
    topic: str = ""

    @property
    def resolved_publisher(self) -> str:
        if self.publisher is not None:
            return self.publisher
        return "zmq" if self.enable_kv_cache_events else "null"

    @property
    def publishes(self) -> bool:
        """Whether events are computed and sent at all."""
        return self.enable_kv_cache_events and self.resolved_publisher == "zmq"

    @property
    def binds(self) -> bool:
        """vLLM's rule: a stable address is bound, a volatile one connected to."""
        e = self.endpoint
        return "*" in e or "::" in e or e.startswith(("ipc://", "inproc://"))


def describe_stream(config: KvEventsConfig | None, block_size: int) -> dict[str, Any]:
    """How a router follows this replica's KV events (``/server_info``'s ``kv_events``
    without the publisher's counters; ``enabled`` false when off): where to subscribe and
    ask for replays, the topic, the block size its index must use."""
    if config is None or not config.publishes:
        return {"enabled": False, "block_size": block_size}
    return {
        "enabled": True,
        "format": "vllm",
        "publisher": config.resolved_publisher,
        "endpoint": config.endpoint,
        "replay_endpoint": config.replay_endpoint,
        "topic": config.topic,
        "block_size": block_size,
        "medium": "GPU",
        "data_parallel_rank": 0,
        "bind": config.binds,
        "buffer_steps": config.buffer_steps,
        "hwm": config.hwm,
        "max_queue_size": config.max_queue_size,
    }


def parse_kv_events_config(text: str | dict[str, Any]) -> KvEventsConfig:
    """The config from its JSON text (or an already parsed object). Raises
    ``InvalidInputError`` naming the offending field: not JSON, not an object, an
    unknown field, a value of the wrong type or out of range."""
    if isinstance(text, str):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"kv_events_config: not valid JSON ({e.msg} at {e.pos})", "kv_events_config") from e
    else:
        raw = text
    if not isinstance(raw, dict):
        raise InvalidInputError("kv_events_config: expected a JSON object", "kv_events_config")
    known = {f.name: f for f in dataclasses.fields(KvEventsConfig)}
    for name, value in raw.items():
        field = known.get(name)
        if field is None:
            raise InvalidInputError(
                f"kv_events_config.{name}: unknown field; known: {', '.join(known)}", f"kv_events_config.{name}"
            )
        _check(name, value)
    return KvEventsConfig(**raw)


def _check(name: str, value: Any) -> None:
    where = f"kv_events_config.{name}"
    if name == "enable_kv_cache_events":
        if not isinstance(value, bool):
            raise InvalidInputError(f"{where}: expected true or false", where)
    elif name == "publisher":
        if value not in PUBLISHERS:
            raise InvalidInputError(f"{where}: {value!r} is not one of {', '.join(PUBLISHERS)}", where)
    elif name in ("endpoint", "topic") or (name == "replay_endpoint" and value is not None):
        if not isinstance(value, str):
            raise InvalidInputError(f"{where}: expected a string", where)
        if name != "topic" and "://" not in value:
            raise InvalidInputError(f"{where}: {value!r} is not a ZMQ address (tcp://host:port, ipc://path)", where)
    elif name in ("buffer_steps", "hwm", "max_queue_size"):
        least = 0 if name == "hwm" else 1  # a high-water mark of 0 is ZMQ's "no limit"
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidInputError(f"{where}: expected an integer of at least {least}", where)
