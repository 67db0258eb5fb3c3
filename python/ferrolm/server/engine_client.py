"""The API process's side of the engine process: starts it, sends it requests, and routes
the deltas it streams back to one asyncio queue per HTTP request.

Two threads do the blocking pipe I/O so the event loop never waits on the engine: a
reader that hands each message to the loop (``call_soon_threadsafe``) and a writer that
sends what the loop queued.

The reader also watches the engine's liveness: the engine loop sends something (deltas,
answers, or its ``("alive",)`` heartbeat) at least every half second, between steps. When
nothing came for ``--engine-heartbeat-timeout`` seconds (a frozen process, a step stuck),
the engine counts as stalled: ``/health`` says 503, requests in flight end with 503 (and
are aborted, so a resumed engine frees their KV), new ones are refused with 503. When it
answers again it serves again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from typing import Any

from ferrolm.engine import Delta
from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.args import ServerArgs
from ferrolm.server.engine_process import engine_main

log = logging.getLogger("ferrolm.server")


class EngineUnavailable(RuntimeError):
    """The engine process is not (or no longer) serving."""


# The error of a request the engine can no longer serve (it died, or stopped answering):
# its deltas carry this message and ENGINE_UNAVAILABLE_KIND, which ``generation.error_of`` answers with 503.
ENGINE_UNAVAILABLE = "the engine is unavailable"
ENGINE_UNAVAILABLE_KIND = "engine_unavailable"  # the error kind of such deltas, beside the core's kinds


def unavailable_delta(rid: int, reason: str) -> Delta:
    """The last delta of a request that the engine cannot finish."""
    return Delta(rid, [], "", [], [], finish_reason="error", error=f"{ENGINE_UNAVAILABLE}: {reason}",
                 error_kind=ENGINE_UNAVAILABLE_KIND)


class EngineError(RuntimeError):
    """The engine failed on a request through no fault of the request (a bug)."""


class RequestHandle:
    """The samples of one HTTP request (several prompts, ``n`` samples each); their deltas
    arrive on one queue, in step order."""

    def __init__(self) -> None:
        self.rids: list[int] = []
        self.unfinished: set[int] = set()
        self.queue: asyncio.Queue[Delta] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return not self.unfinished

    async def next_deltas(self) -> list[Delta]:
        """Waits for at least one delta and returns all that are queued: a reader slower
        than the engine gets them merged into fewer frames, never dropped (a request's
        output is bounded by its max_tokens, so is what waits here)."""
        out = [await self.queue.get()]
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        for d in out:
            if d.finish_reason is not None:
                self.unfinished.discard(d.rid)
        return out


class EngineClient:
    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.info: dict[str, Any] = {}
        self.failure: str | None = None  # why the engine is not serving, once it is not
        self.stalled: str | None = None  # why the engine counts as frozen, while it does
        self._rids = itertools.count()
        self._calls = itertools.count()
        self._routes: dict[int, RequestHandle] = {}
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._outgoing: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.started = asyncio.Event()  # set once the engine is ready or has failed
        self.gone = asyncio.Event()  # set once the engine has failed or exited
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: multiprocessing.process.BaseProcess | None = None

    # ---- life cycle ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
        ours, theirs = ctx.Pipe(duplex=True)
        self._conn = ours
        self._process = ctx.Process(target=engine_main, args=(self.args, theirs), name="ferrolm-engine", daemon=True)
        self._process.start()
        theirs.close()
        threading.Thread(target=self._read_forever, name="ferrolm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write_forever, name="ferrolm-engine-writer", daemon=True).start()

    @property
    def ready(self) -> bool:
        return self.started.is_set() and self.failure is None and self.stalled is None

    @property
    def unavailable(self) -> str | None:
        """Why requests are refused now (it failed or stalled); None while it serves."""
        return self.failure or self.stalled

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.started.wait(), timeout)
        except TimeoutError:
            raise EngineUnavailable("the engine is still starting") from None
        if self.failure is not None:
            raise EngineUnavailable(self.failure)

    def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        self._outgoing.put(("shutdown",))
        self._outgoing.put(None)
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(timeout)

    # ---- requests ----

    @property
    def in_flight(self) -> int:
        """Samples submitted and not yet finished (running or waiting)."""
        return len(self._routes)

    def new_rids(self, n: int) -> list[int]:
        return [next(self._rids) for _ in range(n)]

    async def submit(self, handle: RequestHandle, input_ids: Any, params: SamplingParams, **core_kw: Any) -> list[int]:
        """Queues ``params.n`` samples of a prompt under ``handle``; returns their rids.
        Raises ``InvalidInputError`` (naming the field) when the core refuses the prompt,
        ``EngineUnavailable`` when there is no engine (or it does not answer)."""
        if self.unavailable is not None:
            raise EngineUnavailable(self.unavailable)
        rids = self.new_rids(params.n)
        for rid in rids:
            self._routes[rid] = handle
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[rids[0]] = ack
        self._outgoing.put(("submit", rids, input_ids, params, core_kw))
        try:
            await ack
        except BaseException:
            for rid in rids:
                self._routes.pop(rid, None)
            if not ack.done():  # cancelled while waiting: it may be queued all the same
                self.abort(rids)
            raise
        handle.rids += rids
        handle.unfinished.update(rids)
        return rids

    def abort(self, rids: list[int]) -> None:
        self._outgoing.put(("abort", list(rids)))

    def release(self, handle: RequestHandle) -> None:
        """The HTTP request is over: abort what still runs (a client that went away) and
        stop routing its deltas."""
        if not handle.finished:
            self.abort(sorted(handle.unfinished))
        for rid in handle.rids:
            self._routes.pop(rid, None)

    async def call(self, name: str, timeout: float = 30.0) -> Any:
        """A control call answered by the engine loop between steps (stats, flush_cache...)."""
        if self.unavailable is not None:
            raise EngineUnavailable(self.unavailable)
        call_id = next(self._calls)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[call_id] = reply
        self._outgoing.put(("call", call_id, name))
        try:
            return await asyncio.wait_for(reply, timeout)
        except TimeoutError:
            raise EngineUnavailable(f"the engine did not answer {name!r} within {timeout:g} s") from None
        finally:
            self._replies.pop(call_id, None)

    # ---- the pipe ----

    def _write_forever(self) -> None:
        while (msg := self._outgoing.get()) is not None:
            try:
                self._conn.send(msg)
            except (OSError, ValueError):
                return  # the engine is gone; the reader reports it

    def _read_forever(self) -> None:
        assert self._loop is not None
        timeout = self.args.engine_heartbeat_timeout or None  # 0: not watched
        watching = False  # from "ready" on (loading the model sends nothing)
        stalled = False
        last_heard = time.monotonic()
        while True:
            try:
                if watching and timeout is not None and not self._conn.poll(min(1.0, timeout / 4)):
                    silent = time.monotonic() - last_heard
                    if not stalled and silent > timeout:
                        stalled = True
                        reason = (f"the engine has not answered for {silent:.1f} s (frozen, or a step "
                                  f"longer than --engine-heartbeat-timeout {timeout:g})")
                        self._loop.call_soon_threadsafe(self._engine_stalled, reason)
                    continue
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            except RuntimeError:
                return  # the event loop is closed: the server is shutting down
            last_heard = time.monotonic()
            watching = watching or msg[0] == "ready"
            try:
                if stalled:
                    stalled = False
                    self._loop.call_soon_threadsafe(self._engine_back)
                if msg[0] != "alive":  # a heartbeat has done its part: it was heard
                    self._loop.call_soon_threadsafe(self._dispatch, msg)
            except RuntimeError:
                return  # the event loop is closed: the server is shutting down
        try:
            self._loop.call_soon_threadsafe(self._engine_gone)
        except RuntimeError:
            pass

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "deltas":
            for d in msg[1]:
                handle = self._routes.get(d.rid)
                if handle is not None:
                    handle.queue.put_nowait(d)
                    if d.finish_reason is not None:
                        del self._routes[d.rid]
        elif kind == "submitted":
            _resolve(self._acks.pop(msg[1], None), None)
        elif kind == "rejected":
            _, rid, message, field_name, bad_input = msg
            error = InvalidInputError(message, field_name) if bad_input else EngineError(message)
            _resolve(self._acks.pop(rid, None), error=error)
        elif kind == "reply":
            _, call_id, ok, value = msg
            _resolve(self._replies.get(call_id), value if ok else None, None if ok else RuntimeError(value))
        elif kind == "ready":
            self.info = msg[1]
            self.started.set()
        elif kind == "failed":
            self.failure = f"the engine failed to start: {msg[1]}"
            log.error(self.failure)
            self.started.set()
            self.gone.set()

    def _engine_gone(self) -> None:
        """The engine process ended: every waiter gets an error, nothing hangs."""
        if self.failure is None:
            self.failure = "the engine process exited"
            if not self._closing:
                log.error(self.failure)
        self.started.set()
        self.gone.set()
        self._fail_in_flight(self.failure)

    def _engine_stalled(self, reason: str) -> None:
        """No word from the engine for the heartbeat timeout: fail what waits on it (503),
        abort it there (a resumed engine frees its KV) and refuse new requests until it
        answers again."""
        if self.failure is not None or self._closing:
            return
        self.stalled = reason
        log.error("%s; failing %d requests in flight, refusing new ones until it answers", reason, len(self._routes))
        if self._routes:
            self.abort(sorted(self._routes))
        self._fail_in_flight(reason)

    def _engine_back(self) -> None:
        if self.stalled is not None and self.failure is None:
            log.warning("the engine answers again: serving")
        self.stalled = None

    def _fail_in_flight(self, reason: str) -> None:
        """Every waiter gets an error, nothing hangs: submits and calls raise
        ``EngineUnavailable``, requests get a last delta that ``error_of`` makes a 503."""
        error = EngineUnavailable(reason)
        for fut in [*self._acks.values(), *self._replies.values()]:
            _resolve(fut, error=error)
        self._acks.clear()
        for rid, handle in list(self._routes.items()):
            handle.queue.put_nowait(unavailable_delta(rid, reason))
        self._routes.clear()


def _resolve(fut: asyncio.Future[Any] | None, value: Any = None, error: BaseException | None = None) -> None:
    if fut is None or fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
