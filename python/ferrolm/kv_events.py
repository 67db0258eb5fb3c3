"""KV cache events, in the shape of vLLM's (what NVIDIA Dynamo's KV indexer and llm-d's
prefix scorer consume).

Events cover full blocks of ``block_size`` tokens aligned to position 0. Block hashes chain
(each covers its parent block's hash and its tokens; the first block's parent is a seed
derived from the namespace) and are xxh3-64 with no per-process seed, so every process and
replica computes the same values::

    seed(None)      = xxh3_64(b"ferrolm:kv:v1" + b"\\x00")
    seed(namespace) = xxh3_64(b"ferrolm:kv:v1" + b"\\x01" + namespace.encode())
    hash(block)     = xxh3_64(le_u64(parent_hash or seed) + b"".join(le_u32(t) for t in block))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Union

import xxhash

_DOMAIN = b"ferrolm:kv:v1"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks that became fully cached, in path order; ``block_hashes[i]`` covers
    ``token_ids[i * block_size:(i + 1) * block_size]``. The first chains from
    ``parent_block_hash`` (``None`` at the start of a sequence)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    namespace: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks no longer fully cached."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole cache was dropped (reset)."""


KvEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


def namespace_seed(namespace: str | None) -> int:
    tag = b"\x00" if namespace is None else b"\x01" + namespace.encode()
    return xxhash.xxh3_64_intdigest(_DOMAIN + tag)


def chain_hashes(parent: int, tokens: list[int], block_size: int) -> list[int]:
    """Hashes of consecutive full blocks of ``tokens``, chained from ``parent``."""
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        data = struct.pack(f"<Q{len(block)}I", parent, *block)
        parent = xxhash.xxh3_64_intdigest(data)
        hashes.append(parent)
    return hashes


def event_from_raw(raw: tuple) -> KvEvent:
    """Builds an event from the tuple form ``_core.RadixTree.take_raw_events`` returns."""
    kind = raw[0]
    if kind == "stored":
        _, hashes, parent, tokens, block_size, namespace = raw
        return BlockStored(tuple(hashes), parent, tuple(tokens), block_size, namespace)
    if kind == "removed":
        return BlockRemoved(tuple(raw[1]))
    if kind == "cleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown raw KV event kind {kind!r}")
