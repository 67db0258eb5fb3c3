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

Messages arrive and leave in order, so a request's "submitted" always comes before its
first delta.
"""

from __future__ import annotations

import logging
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

from ferrolm.engine import Engine, default_blas_threads
from ferrolm.errors import CorePanicError, FerrolmError, InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.args import ServerArgs

log = logging.getLogger("ferrolm.engine_process")


class EngineLoop:
    CALLS = ("stats", "metrics", "flush_cache", "abort_all", "info")

    def __init__(self, engine: Engine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.running = True

    def run(self) -> None:
        while self.running:
            # block while idle; while requests run, take whatever arrived and step again
            wait: float | None = 0.0 if self._busy() else None
            while self.running and self.conn.poll(wait):
                self._handle(self.conn.recv())
                wait = 0.0
            if self.running and self._busy():
                self._step()

    def _busy(self) -> bool:
        return self.engine.has_work()

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
        if deltas:
            self.conn.send(("deltas", deltas))

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
        try:
            # all samples at once: the core runs the others once the first has cached the prompt
            self._core_submit(rids, input_ids, params, core_kw)
        except (InvalidInputError, ValueError, TypeError) as e:
            # bad input (the core checks ranges and ids; a grammar may not compile)
            self.conn.send(("rejected", first, str(e), getattr(e, "field", None), True))
            return
        except Exception as e:  # a bug, not the client's fault: refuse this request, keep serving
            log.error("submit failed:\n%s", traceback.format_exc())
            self.conn.send(("rejected", first, f"{type(e).__name__}: {e}", None, False))
            return
        self.conn.send(("submitted", first))

    def _core_submit(self, rid: int | list[int], input_ids: Any, params: SamplingParams, core_kw: dict[str, Any]) -> None:
        """``Engine.submit`` with the API process's rid (the rids of all requests come from
        there, so they are unique across the whole server)."""
        # structured output: the engine compiles the request's grammar, where it can
        compile_grammar = getattr(self.engine, "grammar", None)
        grammar = compile_grammar(params) if compile_grammar is not None else None
        if grammar is not None:
            core_kw = {**core_kw, "grammar": grammar}
        self.engine.core.submit(rid, input_ids, **params.core_kwargs(), **core_kw)

    def _abort(self, rids: list[int]) -> None:
        for rid in rids:
            self.engine.abort(rid)
        # the core reports the aborts with the next step's outputs (has_work() says so)

    def _call(self, call_id: int, name: str) -> None:
        core = self.engine.core
        try:
            if name == "stats":
                value: Any = core.stats()
            elif name == "metrics":
                latencies = {k: v.tolist() for k, v in core.take_latencies().items()}
                latencies["grammar_s"] = self.engine.take_grammar_seconds()
                value = {"stats": core.stats(), "latencies": latencies}
            elif name == "flush_cache":
                value = core.flush_cache()
            elif name == "abort_all":
                value = core.abort_all()
            elif name == "info":
                value = model_info(self.engine)
            else:
                raise ValueError(f"unknown call {name!r}")
        except Exception as e:  # answered, not fatal: the caller decides
            self.conn.send(("reply", call_id, False, f"{type(e).__name__}: {e}"))
            return
        self.conn.send(("reply", call_id, True, value))


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
    try:
        engine = Engine(
            args.model,
            kv_capacity=args.max_total_tokens,
            max_running_requests=args.max_running_requests,
            max_prefill_tokens=args.chunked_prefill_size,
            schedule_policy=args.schedule_policy,
            enable_prefix_cache=not args.disable_radix_cache,
            seed=args.seed,
            blas_threads=args.blas_threads or default_blas_threads(),
        )
    except (FerrolmError, OSError) as e:
        conn.send(("failed", str(e)))
        return
    conn.send(("ready", model_info(engine)))
    loop = EngineLoop(engine, conn)
    try:
        loop.run()
    except (EOFError, BrokenPipeError):
        pass  # the API process is gone: nothing left to serve
    except BaseException:
        log.error("engine loop failed:\n%s", traceback.format_exc())
        raise
