"""A cache-aware router's view of its replicas, rebuilt from their KV event streams alone
(what Dynamo's KV indexer and llm-d's prefix scorer do), and the routing rule on top.

The index never computes ferrolm's block hashes: it links blocks by the hashes the
events carry (``parent_block_hash`` -> ``block_hashes``) and finds a prompt's blocks by
their tokens, so it checks the stream's own consistency rather than trusting it. A
sequence starts at a root per ``cache_salt`` (the salt rides in ``extra_keys`` of a
sequence's first block, as vLLM sends it).

    index = KvIndex(block_size=16)
    index.apply("replica-a", events)          # decoded wire events, in sequence order
    index.overlap("replica-a", prompt_ids)    # cached tokens, whole blocks
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_Key = tuple[Hashable, tuple[int, ...]]  # (parent: a block hash or a root, the block's tokens)


def _root(cache_salt: str | None) -> tuple[str, str | None]:
    return ("root", cache_salt)


@dataclass
class _ReplicaBlocks:
    by_hash: dict[int, _Key] = field(default_factory=dict)
    by_key: dict[_Key, int] = field(default_factory=dict)

    def store(self, event: dict[str, Any], block_size: int) -> None:
        hashes, tokens = event["block_hashes"], event["token_ids"]
        if event["block_size"] != block_size:
            raise ValueError(f"block_size: the stream's is {event['block_size']}, the index's {block_size}")
        if len(tokens) != len(hashes) * block_size:
            raise ValueError("token_ids: BlockStored must carry whole blocks")
        parent: Hashable = event["parent_block_hash"]
        if parent is None:
            extra = event.get("extra_keys") or [None]
            salt = extra[0][0] if extra[0] else None
            parent = _root(salt)
        for i, h in enumerate(hashes):
            key = (parent, tuple(tokens[i * block_size : (i + 1) * block_size]))
            self.by_hash[h] = key
            self.by_key[key] = h
            parent = h

    def remove(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            key = self.by_hash.pop(h, None)
            if key is not None and self.by_key.get(key) == h:
                del self.by_key[key]

    def overlap_blocks(self, tokens: Sequence[int], block_size: int, cache_salt: str | None) -> int:
        parent: Hashable = _root(cache_salt)
        n = 0
        for start in range(0, len(tokens) - block_size + 1, block_size):
            h = self.by_key.get((parent, tuple(tokens[start : start + block_size])))
            if h is None:
                break
            parent, n = h, n + 1
        return n


class KvIndex:
    """Cached blocks per replica, from ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._replicas: dict[str, _ReplicaBlocks] = {}

    def add_replica(self, name: str) -> None:
        self._replicas.setdefault(name, _ReplicaBlocks())

    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    def apply(self, replica: str, events: Iterable[dict[str, Any]]) -> None:
        """Applies a batch's decoded events, in order. Raises ``ValueError`` for an event
        of unknown type or of another block size."""
        blocks = self._replicas.setdefault(replica, _ReplicaBlocks())
        for e in events:
            kind = e.get("type")
            if kind == "BlockStored":
                blocks.store(e, self.block_size)
            elif kind == "BlockRemoved":
                blocks.remove(e["block_hashes"])
            elif kind == "AllBlocksCleared":
                self._replicas[replica] = blocks = _ReplicaBlocks()
            else:
                raise ValueError(f"type: unknown KV event {kind!r}")

    def num_blocks(self, replica: str) -> int:
        return len(self._replicas[replica].by_hash)

    def overlap(self, replica: str, tokens: Sequence[int], cache_salt: str | None = None) -> int:
        """Leading tokens of ``tokens`` that ``replica`` holds, in whole blocks."""
        blocks = self._replicas.get(replica)
        if blocks is None:
            return 0
        return blocks.overlap_blocks(tokens, self.block_size, cache_salt) * self.block_size

    def predicted_cached_tokens(self, replica: str, prompt: Sequence[int], cache_salt: str | None = None) -> int:
        """What the replica will report as the prompt's cached tokens, rounded down to
        whole blocks: its overlap, less the prompt's last token (an engine always runs at
        least that one to get logits)."""
        usable = (len(prompt) - 1) // self.block_size * self.block_size
        return min(self.overlap(replica, prompt, cache_salt), usable)

    def best_replica(
        self, prompt: Sequence[int], cache_salt: str | None = None, load: dict[str, float] | None = None
    ) -> str:
        """The replica with the largest overlap; ties go to the least loaded (``load``,
        e.g. running requests), then to the first listed."""
        load = load or {}
        return max(self._replicas, key=lambda r: (self.overlap(r, prompt, cache_salt), -load.get(r, 0.0)))
