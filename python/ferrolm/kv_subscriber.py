"""The consumer end of one replica's KV event stream (vLLM's protocol, see
``ferrolm.kv_wire``): a SUB socket, plus the replica's replay socket to fill gaps. Used by
``ferrolm bench route`` and the tests; a real deployment uses its router's own
subscriber (Dynamo, llm-d).

Batches come out in sequence order. A gap (a batch missed because the subscriber joined
late or fell past the socket's high-water mark) is filled from the replay socket before
the batch after it is handed out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ferrolm.kv_wire import END_SEQ, decode_batch

log = logging.getLogger("ferrolm.kv_subscriber")

Batch = tuple[int, list[dict[str, Any]]]  # (seq, events)


class KvEventSubscriber:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        import zmq

        self._zmq = zmq
        self._ctx = zmq.Context()
        self.sub = self._ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.next_seq = 0  # the first batch not yet handed out
        self.missed = 0  # batches neither received nor replayed (gone from the replay buffer)

    def receive(self, timeout_s: float) -> list[Batch]:
        """The next batches in order (a gap before one is filled first); empty when
        nothing came within ``timeout_s``."""
        if not self.sub.poll(int(timeout_s * 1000)):
            return []
        _, seq_frame, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_frame, "big")
        out: list[Batch] = []
        if seq > self.next_seq:
            out += self.replay(self.next_seq, until=seq)
            if self.next_seq < seq:
                self.missed += seq - self.next_seq
                log.warning("KV events %d..%d are lost (not in the replay buffer)", self.next_seq, seq - 1)
        if seq >= self.next_seq:
            out.append((seq, decode_batch(payload)[1]))
            self.next_seq = seq + 1
        return out

    def catch_up(self, count: int, timeout_s: float = 30.0) -> list[Batch]:
        """Batches until the first ``count`` have been handed out (a replica tells how many
        it has queued). When the stream is quiet, the replay socket is asked: a batch sent
        before this socket's subscription took effect never arrives otherwise. Raises
        ``TimeoutError`` after ``timeout_s``."""
        out: list[Batch] = []
        deadline = time.monotonic() + timeout_s
        while self.next_seq < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"KV events: have {self.next_seq} of {count} batches after {timeout_s} s")
            got = self.receive(0.1)
            if not got and self.replay_endpoint is not None:
                got = self.replay(self.next_seq)
            out += got
        return out

    def replay(self, start: int, until: int | None = None) -> list[Batch]:
        """Asks the replay socket for the batches from ``start`` (those before ``until``
        are kept); advances ``next_seq`` past them."""
        if self.replay_endpoint is None:
            return []
        zmq = self._zmq
        # a DEALER: the answer is many messages, and a REQ socket takes only the first
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        out: list[Batch] = []
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while dealer.poll(5000):
                _, seq_frame, payload = dealer.recv_multipart()
                if seq_frame == END_SEQ:
                    break
                seq = int.from_bytes(seq_frame, "big")
                if seq >= self.next_seq and (until is None or seq < until):
                    if seq > self.next_seq:
                        self.missed += seq - self.next_seq
                    out.append((seq, decode_batch(payload)[1]))
                    self.next_seq = seq + 1
        finally:
            dealer.close(linger=0)
        return out

    def close(self) -> None:
        self._ctx.destroy(linger=0)
