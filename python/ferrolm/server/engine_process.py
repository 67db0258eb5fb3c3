"""The engine loop in its own process. The API process talks to it over one duplex pipe
(``multiprocessing.connection.Connection``); messages are plain tuples.

API -> engine:
  ("submit", rids, input_ids, params, core_kw)  rids: one per sample of the same prompt
  ("abort", rids)
  ("call", call_id, name)                       name: see ``EngineLoop.CALLS``
  ("shutdown",)
engine -> API:
  ("ready", info) | ("failed", message)         once, at start
  ("submitted", rid) | ("rejected", rid, message, field, bad_input)   answer to a submit
  ("deltas", [Delta, ...])                      one message per step
  ("reply", call_id, ok, value)
  ("alive",)                                    heartbeat, when nothing else was sent for
                                                HEARTBEAT_INTERVAL_S (idle, or between steps)

Messages arrive and leave in order, so a request's "submitted" always comes before its
first delta.

A request with a structured-output grammar is compiled on a worker thread (the Rust
compile releases the GIL), so the loop keeps stepping the others meanwhile; the request
is submitted to the core, and answered, when its compile ends. Requests without a
grammar are answered at once, so answers may come in another order than the submits.
An abort of a request still compiling answers "submitted" and then an abort delta for
each of its samples.

With ``--kv-events-config`` the loop hands each step's KV cache events to the publisher
thread (``ferrolm.kv_publisher``) before it sends the step's deltas, and sends a step's
deltas only once the earlier steps' events are on the socket (the thread normally has
them out while the step computes), so a router following the events never lags the
outputs by more than the step in flight.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import socket
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any

from ferrolm.engine import Delta, Engine, default_blas_threads
from ferrolm.errors import CorePanicError, FerrolmError, InvalidInputError
from ferrolm.kv_publisher import KvEventPublisher
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.args import ServerArgs

log = logging.getLogger("ferrolm.engine_process")

HEARTBEAT_INTERVAL_S = 0.5  # the API side counts the engine frozen after --engine-heartbeat-timeout
GRAMMAR_WORKERS = 2  # threads compiling grammars (each compile is bounded by the vocabulary's timeout)


@dataclasses.dataclass(slots=True)
class _Compiling:
    """A submit whose grammar compiles on a worker thread; the loop submits it to the
    core when the compile ends."""

    rids: list[int]
    input_ids: Any
    params: SamplingParams
    core_kw: dict[str, Any]
    future: Future[Any]
    started: float  # perf_counter() at arrival: the wait is reported as grammar_s


class EngineLoop:
    CALLS = ("stats", "metrics", "flush_cache", "abort_all", "info")

    def __init__(self, engine: Engine, conn: Connection, *, grammar_workers: int = GRAMMAR_WORKERS,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S, kv_publisher: KvEventPublisher | None = None) -> None:
        self.engine = engine
        self.kv_publisher = kv_publisher
        self.conn = conn
        self.running = True
        self.synthetic: list[Delta] = []  # aborts of requests that never reached the core (compiling)
        self.heartbeat_interval = heartbeat_interval
        self.last_sent = time.monotonic()
        # structured requests whose grammar compiles, by first rid, in arrival order
        self.compiling: dict[int, _Compiling] = {}
        self.compiled: queue.SimpleQueue[int] = queue.SimpleQueue()  # first rids whose compile ended
        self.grammar_seconds: list[float] = []  # each structured request's wait for its grammar
        self._pool = ThreadPoolExecutor(max_workers=grammar_workers, thread_name_prefix="ferrolm-grammar")
        # a compile that ends wakes the loop where it waits on the pipe
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full buffer already wakes the loop

    def run(self) -> None:
        try:
            while self.running:
                # block while idle (waking for compiles that end and for the heartbeat);
                # while requests run, take whatever arrived and step again
                timeout = 0.0 if self._busy() else self.heartbeat_interval
                if wait([self.conn, self._wake_r], timeout):
                    self._drain_wakeups()
                    while self.running and self.conn.poll(0.0):
                        self._handle(self.conn.recv())
                self._submit_compiled()
                if self.running and self._busy():
                    self._step()
                self._publish_kv_events()  # those of aborts and flushes, outside a step
                if time.monotonic() - self.last_sent >= self.heartbeat_interval:
                    self._send(("alive",))
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._wake_r.close()
        self._wake_w.close()

    def _send(self, msg: tuple[Any, ...]) -> None:
        self.conn.send(msg)
        self.last_sent = time.monotonic()

    def _busy(self) -> bool:
        return self.engine.has_work() or bool(self.synthetic)

    def _step(self) -> None:
        try:
            # a failed forward ends its step's requests with an error delta (error_kind
            # "step_failed") inside engine.step(), which keeps serving
            deltas = self.engine.step()
        except CorePanicError:
            raise  # the core refuses further use: end the process, the API fails its requests
        except Exception as e:
            # a failure outside the forward (a bug): every request of the step in flight,
            # if any, still gets its error delta, so none is lost
            log.error("step failed:\n%s", traceback.format_exc())
            deltas = self.engine.fail_step(f"{type(e).__name__}: {e}")
        for d in deltas:
            if d.error_kind == "step_failed":
                # the engine logged the cause; clients get no internals
                d.error = "the engine step failed (see the server log)"
        deltas += self.synthetic
        self.synthetic = []
        if self.kv_publisher is not None:
            earlier = self.kv_publisher.queued
            self._publish_kv_events()
            if deltas:
                self.kv_publisher.wait_earlier(earlier)
        if deltas:
            self._send(("deltas", deltas))

    def _publish_kv_events(self) -> None:
        """The cache's events since the last call, as one batch (none when empty)."""
        if self.kv_publisher is not None:
            self.kv_publisher.publish_from(self.engine.core)

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "submit":
            self._submit(*msg[1:])
        elif kind == "abort":
            self._abort(msg[1])
        elif kind == "call":
            self._call(msg[1], msg[2])
        elif kind == "shutdown":
            self.running = False

    def _submit(self, rids: list[int], input_ids: Any, params: SamplingParams, core_kw: dict[str, Any]) -> None:
        first = rids[0]
        compile_grammar = getattr(self.engine, "grammar", None)
        if compile_grammar is not None and "grammar" not in core_kw and params.grammar_source() is not None:
            # compiled off the loop: the running requests keep decoding meanwhile
            future = self._pool.submit(compile_grammar, params)
            self.compiling[first] = _Compiling(rids, input_ids, params, core_kw, future, time.perf_counter())
            future.add_done_callback(lambda _: self._compile_ended(first))
            return
        self._submit_now(rids, input_ids, params, core_kw)

    def _compile_ended(self, first: int) -> None:
        """On the worker thread: hand the request back to the loop and wake it."""
        self.compiled.put(first)
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # a wakeup is pending already, or the loop has closed

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _submit_compiled(self) -> None:
        """Submits the requests whose grammar compiled (or answers why it did not)."""
        while True:
            try:
                first = self.compiled.get_nowait()
            except queue.Empty:
                return
            c = self.compiling.pop(first, None)
            if c is None:
                continue  # aborted while it compiled: already answered
            self.grammar_seconds.append(time.perf_counter() - c.started)
            try:
                grammar = c.future.result()
            except (InvalidInputError, ValueError, TypeError) as e:  # the schema does not compile
                self._send(("rejected", first, str(e), getattr(e, "field", None), True))
                continue
            except Exception as e:
                log.error("grammar compile failed:\n%s", traceback.format_exc())
                self._send(("rejected", first, f"{type(e).__name__}: {e}", None, False))
                continue
            core_kw = c.core_kw if grammar is None else {**c.core_kw, "grammar": grammar}
            self._submit_now(c.rids, c.input_ids, c.params, core_kw)

    def _submit_now(self, rids: list[int], input_ids: Any, params: SamplingParams, core_kw: dict[str, Any]) -> None:
        first = rids[0]
        try:
            # all samples at once: the core runs the others once the first has cached the prompt
            self._core_submit(rids, input_ids, params, core_kw)
        except (InvalidInputError, ValueError, TypeError) as e:
            # bad input (the core checks ranges and ids; a grammar may not compile)
            self._send(("rejected", first, str(e), getattr(e, "field", None), True))
            return
        except Exception as e:  # a bug, not the client's fault: refuse this request, keep serving
            log.error("submit failed:\n%s", traceback.format_exc())
            self._send(("rejected", first, f"{type(e).__name__}: {e}", None, False))
            return
        self._send(("submitted", first))

    def _abort_compiling(self, rid: int) -> bool:
        """Ends a request (or one sample of it) whose grammar still compiles: its submit is
        answered and the samples get their abort deltas, so nothing waits for it."""
        c = self.compiling.get(rid)
        if c is None:
            for candidate in self.compiling.values():
                if rid in candidate.rids:
                    c = candidate
                    break
            else:
                return False
        if rid != c.rids[0]:  # one of its later samples: the others still go ahead
            c.rids.remove(rid)
            self.synthetic.append(Delta(rid, [], "", [], [], finish_reason="abort"))
            return True
        del self.compiling[rid]
        c.future.cancel()  # a compile already running ends by itself (bounded by its timeout)
        self._send(("submitted", rid))
        self.synthetic += [Delta(r, [], "", [], [], finish_reason="abort") for r in c.rids]
        return True

    def _core_submit(self, rid: int | list[int], input_ids: Any, params: SamplingParams, core_kw: dict[str, Any]) -> None:
        """``Engine.submit`` with the API process's rid (the rids of all requests come from
        there, so they are unique across the whole server). ``core_kw`` may hold the
        grammar compiled off the loop; else the engine compiles it here, where it can."""
        if "grammar" not in core_kw:
            compile_grammar = getattr(self.engine, "grammar", None)
            grammar = compile_grammar(params) if compile_grammar is not None else None
            if grammar is not None:
                core_kw = {**core_kw, "grammar": grammar}
        self.engine.core.submit(rid, input_ids, **params.core_kwargs(), **core_kw)
        note_submitted = getattr(self.engine, "note_submitted", None)
        if note_submitted is not None:
            note_submitted(rid, params)  # for greedy on the runner's device

    def _abort(self, rids: list[int]) -> None:
        for rid in rids:
            if not self.engine.abort(rid):
                self._abort_compiling(rid)
        # the core reports the aborts with the next step's outputs (has_work() says so)

    def _call(self, call_id: int, name: str) -> None:
        core = self.engine.core
        try:
            if name == "stats":
                value: Any = self._stats()
            elif name == "metrics":
                latencies = {k: v.tolist() for k, v in core.take_latencies().items()}
                # the loop measures each structured request's wait (queue for a worker
                # and compile); the engine's own record is dropped, it would count twice
                self.engine.take_grammar_seconds()
                latencies["grammar_s"], self.grammar_seconds = self.grammar_seconds, []
                value = {"stats": self._stats(), "latencies": latencies}
            elif name == "flush_cache":
                value = core.flush_cache()
                self._publish_kv_events()  # the clear is queued before the caller hears back
            elif name == "abort_all":
                value = core.abort_all()
                for first in list(self.compiling):
                    value += len(self.compiling[first].rids)
                    self._abort_compiling(first)
            elif name == "info":
                value = model_info(self.engine)
            else:
                raise ValueError(f"unknown call {name!r}")
        except Exception as e:  # answered, not fatal: the caller decides
            self._send(("reply", call_id, False, f"{type(e).__name__}: {e}"))
            return
        self._send(("reply", call_id, True, value))

    def _stats(self) -> dict[str, int]:
        stats = self.engine.core.stats()
        if self.kv_publisher is not None:
            stats |= self.kv_publisher.stats()
        return stats


def model_info(engine: Engine) -> dict[str, Any]:
    c = engine.config
    return {
        "model_type": c.model_type,
        "vocab_size": engine.core.vocab_size,
        "max_context_length": c.max_position_embeddings,
        "hidden_size": c.hidden_size,
        "num_layers": c.num_layers,
        "eos_token_ids": list(c.eos_token_ids),
        "kv_capacity": engine.core.kv_capacity,
    }


def engine_main(args: ServerArgs, conn: Connection) -> None:
    """Entry point of the engine process (spawned: nothing is inherited but ``args``)."""
    # Ctrl+C reaches the whole process group: the API process stops this one in order
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level.upper() if args.log_level != "trace" else "DEBUG",
                        format="%(asctime)s engine %(levelname)s %(message)s")
    kv_config = args.kv_events_config if args.kv_events_config and args.kv_events_config.publishes else None
    try:
        engine = Engine(
            args.model,
            kv_capacity=args.max_total_tokens,
            max_running_requests=args.max_running_requests,
            max_prefill_tokens=args.chunked_prefill_size,
            schedule_policy=args.schedule_policy,
            enable_prefix_cache=not args.disable_radix_cache,
            eviction_policy=args.radix_eviction_policy,
            seed=args.seed,
            blas_threads=args.blas_threads or default_blas_threads(),
            runner=args.runner,
            device=args.device,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            mem_fraction_static=args.mem_fraction_static,
            enable_kv_events=kv_config is not None,
            kv_event_block_size=args.page_size,
            record_trace=args.record_trace,
        )
        kv_publisher = KvEventPublisher(kv_config) if kv_config is not None else None
    except (FerrolmError, OSError) as e:
        conn.send(("failed", str(e)))
        return
    conn.send(("ready", model_info(engine)))
    loop = EngineLoop(engine, conn, kv_publisher=kv_publisher)
    try:
        loop.run()
    except (EOFError, BrokenPipeError):
        pass  # the API process is gone: nothing left to serve
    except BaseException:
        log.error("engine loop failed:\n%s", traceback.format_exc())
        raise
    finally:
        if kv_publisher is not None:
            kv_publisher.shutdown()
