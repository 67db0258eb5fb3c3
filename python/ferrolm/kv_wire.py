"""KV events as vLLM puts them on the wire, so that a consumer written for vLLM (NVIDIA
Dynamo's KV indexer, llm-d's precise prefix scorer) reads ferrolm's stream unchanged.

A batch is one ZMQ message of three frames: the topic, the sequence number (8 bytes,
big-endian unsigned, 0, 1, 2, ... per batch sent) and the payload, a msgpack array
``[ts, events, data_parallel_rank]`` (``ts``: float seconds since the epoch). Each event is
a msgpack map tagged by its ``"type"`` (vLLM encodes its event structs by field name since
vllm-project/vllm#42892; the outer batch stays positional)::

    {"type": "BlockStored", "block_hashes": [u64, ...], "parent_block_hash": u64 | nil,
     "token_ids": [int, ...], "block_size": int, "lora_id": int | nil, "medium": "GPU",
     "lora_name": str | nil, "extra_keys": [[cache_salt] | nil, ...], "group_idx": 0,
     "kv_cache_spec_kind": "full_attention"}
    {"type": "BlockRemoved", "block_hashes": [u64, ...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

``token_ids`` holds whole blocks (``len == len(block_hashes) * block_size``).
``extra_keys`` has one entry per block, as vLLM's: the keys that went into the block's
hash besides its tokens. The only one ferrolm has is the request's ``cache_salt``, which
vLLM mixes into the first block of a sequence, so it stands on block 0 when the stored run
starts a sequence (no parent) and every other entry is nil. Block hashes are ferrolm's
64-bit chained hashes (see ``ferrolm.kv_events``), unsigned, as vLLM sends the low 64 bits
of its own. ``lora_id`` and ``lora_name`` name the LoRA adapter of the blocks (their
cache namespace is the adapter's, its id in the hash seed), nil on the base model's.
"""

from __future__ import annotations

from typing import Any

from ferrolm import _core

MEDIUM_GPU = "GPU"  # vLLM's name for the engine's own KV pool, whatever the device
SPEC_KIND = "full_attention"


def wire_event(raw: tuple[Any, ...], medium: str = MEDIUM_GPU) -> dict[str, Any]:
    """One event from the tuple form ``_core.Engine.take_kv_events`` gives."""
    kind = raw[0]
    if kind == "stored":
        _, hashes, parent, tokens, block_size, namespace = raw
        extra: list[Any] = [None] * len(hashes)
        lora_id = lora_name = salt = None
        if namespace is not None:
            lora_id, lora_name, salt = _core.lora_namespace_parts(namespace)
        if salt is not None and parent is None and extra:
            extra[0] = [salt]
        return {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": tokens,
            "block_size": block_size,
            "lora_id": lora_id,
            "medium": medium,
            "lora_name": lora_name,
            "extra_keys": extra,
            "group_idx": 0,
            "kv_cache_spec_kind": SPEC_KIND,
        }
    if kind == "removed":
        return {"type": "BlockRemoved", "block_hashes": raw[1], "medium": medium, "group_idx": 0}
    if kind == "cleared":
        return {"type": "AllBlocksCleared"}
    raise ValueError(f"unknown raw KV event kind {kind!r}")


def encode_batch(ts: float, events: list[dict[str, Any]], data_parallel_rank: int = 0) -> bytes:
    """The payload frame of one batch."""
    import msgpack

    return msgpack.packb([float(ts), events, data_parallel_rank], use_bin_type=True)


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    """A payload frame back as ``(ts, events, data_parallel_rank)`` (consumers: the index,
    the bench). Raises ``ValueError`` for anything not shaped like a batch."""
    import msgpack

    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) not in (2, 3) or not isinstance(batch[1], list):
        raise ValueError("a KV event batch is [ts, events, data_parallel_rank]")
    return float(batch[0]), batch[1], batch[2] if len(batch) == 3 else None


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end marker
