"""Publishes KV cache events over ZMQ the way vLLM does (see ``ferrolm.kv_wire``), from
a thread of its own so that the step loop never waits on a socket.

The step loop hands each step's raw events to ``publish``, which only puts them on a
bounded queue (a full queue drops the batch and counts it: the loop never blocks). The
thread turns them into vLLM's wire events, encodes them, sends them on the PUB socket with
the next sequence number and keeps the last ``buffer_steps`` batches for replay. A
subscriber that missed batches (it joined late, or fell past the socket's high-water mark)
sends a start sequence number (8 bytes, big-endian) to the ROUTER ``replay_endpoint`` and
gets every buffered batch from there as ``[b"", seq, payload]``, then the end marker
``[b"", seq = -1, b""]``, as vLLM answers (a DEALER reads them all; a REQ socket would
take only the first).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ferrolm.kv_events_config import KvEventsConfig
from ferrolm.kv_wire import END_SEQ, MEDIUM_GPU, encode_batch, seq_frame, wire_event

log = logging.getLogger("ferrolm.kv_events")

STOP_TIMEOUT_S = 1.0  # what shutdown gives the thread to send what is queued
# how long the idle thread sleeps on the queue before it looks at the replay socket again
# (vLLM's figure): a replay waits at most this long, and an idle thread wakes 10 times a second
IDLE_POLL_S = 0.1
# how long a step loop holds a step's outputs for the earlier batches (``wait_earlier``)
OUTPUTS_WAIT_S = 0.5


class KvEventPublisher:
    """ZMQ PUB (+ ROUTER replay) publisher of KV event batches; see the module doc.

    Counters (read from any thread): ``queued`` batches accepted by ``publish``,
    ``handled`` batches the thread is done with (``sent`` of them on the socket),
    ``dropped`` batches refused because the queue was full, ``late`` steps whose outputs
    went out before the earlier batches were handled. ``on_change``, when given, is called
    each time a counter moved: on the thread for ``handled``, ``sent`` and ``replays``, on
    the step loop for what ``publish_from`` and ``wait_earlier`` move (the Rust front end
    copies the counters to where its routes read them).

    The step loop (``ferrolm.server.rust_frontend.StepLoop``) calls
    ``publish_from(core)`` after each commit and after whatever else changes the cache
    (aborts, flushes), and ``wait_earlier`` before a step's outputs go out, so that a
    router following the events never lags the outputs by more than the step in flight."""

    def __init__(
        self,
        config: KvEventsConfig,
        *,
        data_parallel_rank: int = 0,
        medium: str = MEDIUM_GPU,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.on_change = on_change
        self.data_parallel_rank = data_parallel_rank
        self.medium = medium
        self.queued = self.handled = self.sent = self.dropped = self.replays = self.late = 0
        self.busy_s = 0.0  # the thread's CPU time on batches (turning, encoding, sending)
        self._queue: queue.Queue[tuple[float, list[Any]] | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=config.buffer_steps)
        self._handled = threading.Condition()
        self._stopping = False
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        # the sockets live on the thread that uses them (ZMQ sockets are not thread-safe)
        self._thread = threading.Thread(target=self._run, name="ferrolm-kv-events", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise OSError(
                f"kv_events_config: cannot open {config.endpoint!r}"
                f"{' / ' + repr(config.replay_endpoint) if config.replay_endpoint else ''}: "
                f"{self._start_error}"
            ) from self._start_error

    # ---- the step loop's side ----

    def publish(self, raw_events: list[Any], ts: float | None = None) -> bool:
        """Queues one step's events (``_core.Engine.take_kv_events`` tuples) as one batch;
        never blocks. False when the queue was full and the batch was dropped."""
        try:
            self._queue.put_nowait((time.time() if ts is None else ts, raw_events))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "KV event queue full (%d batches): %d batches dropped so far; routers following "
                    "this replica see a stale cache",
                    self.config.max_queue_size,
                    self.dropped,
                )
            return False
        self.queued += 1
        return True

    def publish_cleared(self) -> bool:
        """Queues one ``AllBlocksCleared``: at start, so that a router still holding blocks
        of an earlier process at this endpoint (a replica restarted after a crash) drops
        them; a flush publishes its own from the cache."""
        queued = self.publish([("cleared",)])
        if self.on_change is not None:
            self.on_change()
        return queued

    def wait_handled(self, count: int, timeout: float) -> bool:
        """Waits until the thread is done with the first ``count`` batches (at once when it
        is; the thread normally keeps up within a step). False on timeout."""
        if self.handled >= count:
            return True
        with self._handled:
            return self._handled.wait_for(lambda: self.handled >= count, timeout)

    def publish_from(self, core: Any) -> bool:
        """Queues the core's events since the last call (``take_kv_events``) as one batch;
        none when there are none. True when a batch was queued."""
        events = core.take_kv_events()
        if not events:
            return False
        queued = self.publish(events)
        if self.on_change is not None:
            self.on_change()
        return queued

    def wait_earlier(self, count: int | None = None, timeout: float = OUTPUTS_WAIT_S) -> bool:
        """Before a step's outputs go out: waits until the first ``count`` batches (all those
        queued so far when None) are handled. False on timeout, and the step counts in
        ``late``."""
        if self.wait_handled(self.queued if count is None else count, timeout):
            return True
        self.late += 1
        if self.on_change is not None:
            self.on_change()
        return False

    def stats(self) -> dict[str, int]:
        return {
            "kv_events_queued": self.queued,
            "kv_events_sent": self.sent,
            "kv_events_dropped": self.dropped,
            "kv_events_replays": self.replays,
            "kv_events_late": self.late,
        }

    def shutdown(self) -> None:
        """Sends what is queued (for up to ``STOP_TIMEOUT_S``), then closes the sockets."""
        self._stopping = True
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread sees _stopping after the queue drains
        self._thread.join(timeout=STOP_TIMEOUT_S + 1.0)

    # ---- the publisher thread ----

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        pub = replay = None
        try:
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.SNDHWM, self.config.hwm)
            pub.setsockopt(zmq.LINGER, 0)
            if self.config.binds:
                pub.bind(self.config.endpoint)
            else:
                pub.connect(self.config.endpoint)
            if self.config.replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.config.replay_endpoint)
        except zmq.ZMQError as e:
            self._start_error = e
            for s in (pub, replay):
                if s is not None:
                    s.close(linger=0)
            ctx.term()
            self._started.set()
            return
        self._started.set()
        try:
            self._loop(pub, replay)
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            ctx.term()

    def _loop(self, pub: Any, replay: Any) -> None:
        topic = self.config.topic.encode()
        seq = 0
        deadline: float | None = None
        while True:
            if replay is not None and replay.poll(0):
                self._serve_replay(replay)
            if self._stopping and deadline is None:
                deadline = time.monotonic() + STOP_TIMEOUT_S
            if deadline is not None and time.monotonic() > deadline:
                return
            try:
                item = self._queue.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if self._stopping:
                    return
                continue
            if item is None:
                if self._queue.empty():
                    return
                continue
            ts, raw = item
            started = time.thread_time()
            try:
                payload = encode_batch(ts, [wire_event(r, self.medium) for r in raw], self.data_parallel_rank)
                # a PUB socket never blocks: past the high-water mark ZMQ drops for that
                # subscriber, which sees the gap in sequence numbers and asks for a replay
                pub.send_multipart((topic, seq_frame(seq), payload))
                self._buffer.append((seq, payload))
                seq += 1
                self.sent += 1
            except Exception:
                log.exception("publishing a KV event batch failed")
            self.busy_s += time.thread_time() - started
            self._changed()
            with self._handled:
                self.handled += 1
                self._handled.notify_all()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("the KV event counters' callback failed")

    def _serve_replay(self, replay: Any) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("malformed KV event replay request (%d frames): answered with the end marker", len(frames))
            if len(frames) >= 2:
                replay.send_multipart((frames[0], b"", END_SEQ, b""))  # a REQ client is not left waiting
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        self.replays += 1
        for seq, payload in list(self._buffer):
            if seq >= first:
                replay.send_multipart((client, b"", seq_frame(seq), payload))
        replay.send_multipart((client, b"", END_SEQ, b""))
        self._changed()
