"""``ferrolm serve``: the Rust HTTP front end (``_core.Frontend``, axum and
tokio threads that never take the GIL) in the process that runs the step loop.

Requests go from the HTTP threads into the core's queue and the core's step outputs go
straight to each request's stream, all in Rust: this loop only runs schedule -> forward ->
commit. ``frontend.drain`` moves what arrived into the core at the start of a step;
``frontend.commit`` (and its siblings) commits and hands the outputs to the streams,
returning only the rids that finished. While there is no work the loop blocks in
``frontend.wait`` (no busy spin; a request wakes it at once). In the common case (a runner
that returns logits, no KV events) a step is two calls into the core around the forward:
``frontend.next_plan`` (drain and schedule) and ``frontend.commit``, with the core's plan
given to the runner as its batch (``ferrolm.model.runner.Batch``).

Structured output (``response_format``, ``regex``, ``json_schema``, ``ebnf``, ``guided_*``,
``grammar``) is read by the front end and compiled on its grammar
threads in the engine vocabulary's grammar cache (its compile timeout included); the core
takes the compiled grammar with the request.

The engine-heartbeat watch (``--engine-heartbeat-timeout``) watches this loop: it comes
round at least every ``IDLE_WAIT_S`` while idle and once a step while busy; when it has not
for the timeout (a step stuck in the forward, a frozen loop), ``/health`` and every request
are 503 until it does, and what waited on it is answered 503 and aborted.

The port is bound before the model loads (``_core.FrontendLoading``): until the front end
takes it over, ``/health`` and every route answer 503, "the engine is starting".

With ``--kv-events-config`` the loop publishes the prefix cache's KV events
(``ferrolm.kv_publisher``: its thread, vLLM's wire format and the replay socket): the events of each step as one batch after its commit, those of aborts and
flushes after the drain that ran them; and a step's outputs go to the streams only once the
earlier batches are on the socket (the thread normally has them out while the step
computes), so a router following the events never lags the outputs by more than the step
in flight. The publisher's counters reach ``/server_info`` and ``/metrics`` through
``frontend.note_kv_events``.

Tool calling and reasoning (``tools``, ``tool_choice``, ``parallel_tool_calls``,
``--tool-call-parser``, ``--reasoning-parser``) are the front end's
(``crates/ferrolm-frontend/src/tools``).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import Any

import ferrolm
from ferrolm import _core
from ferrolm.engine import Engine, default_blas_threads
from ferrolm.errors import CorePanicError
from ferrolm.kv_events_config import describe_stream
from ferrolm.kv_publisher import KvEventPublisher
from ferrolm.model import ForwardBatch
from ferrolm.model.loader import resolve_model_folder
from ferrolm.server.args import ServerArgs
from ferrolm.server.prompt_bounds import max_input_chars_per_token

log = logging.getLogger("ferrolm.server")

IDLE_WAIT_S = 0.25  # how long an idle loop blocks before it looks at its stop flag again
# the HTTP runtime's workers: one wakes for a step's streams and writes their frames (a
# second one, woken to steal, cost each token's wake again and saved no time at 64 streams)
HTTP_THREADS = 1
TOKENIZER_THREADS = 2  # chat templates and tokenizing, off the workers
GRAMMAR_THREADS = 2  # grammar compiles run here, never on an HTTP thread or the step loop


def build_engine(args: ServerArgs) -> Engine:
    return Engine(
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
        enable_kv_events=kv_events_on(args),
        kv_event_block_size=args.page_size,
        record_trace=args.record_trace,
    )


def model_info(engine: Engine) -> dict[str, Any]:
    """What ``/get_model_info`` and ``/server_info`` say of the model."""
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


def kv_events_on(args: ServerArgs) -> bool:
    return args.kv_events_config is not None and args.kv_events_config.publishes


def start_frontend(engine: Engine, args: ServerArgs, loading: _core.FrontendLoading | None = None) -> _core.Frontend:
    """Binds the port (or takes over the one ``loading`` bound while the model loaded) and
    starts the HTTP threads over ``engine``'s vocabulary and tokenizer."""
    tokenizer = engine.tokenizer
    info = model_info(engine)
    return _core.Frontend(
        engine.vocabulary,
        str(resolve_model_folder(args.model) / "tokenizer.json"),
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        model_path=args.model,
        context_length=int(info["max_context_length"]),
        kv_capacity=int(info["kv_capacity"]),
        max_running_requests=args.max_running_requests,
        max_request_bytes=args.max_request_bytes,
        version=ferrolm.__version__,
        model_info_json=json.dumps(info),
        settings_json=json.dumps(args.public_dict()),
        api_key=args.api_key,
        chat_template=tokenizer.chat_template,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        max_queued_requests=args.max_queued_requests,
        queue_timeout=args.queue_timeout,
        chars_per_token=max_input_chars_per_token(tokenizer, tokenizer.token_bytes()),
        http_threads=HTTP_THREADS,
        tokenizer_threads=TOKENIZER_THREADS,
        grammar_threads=GRAMMAR_THREADS,
        engine_heartbeat_timeout=args.engine_heartbeat_timeout,
        loading=loading,
        kv_events_json=json.dumps(describe_stream(args.kv_events_config, args.page_size)),
    )


class StepLoop:
    """schedule -> forward -> commit, fed and drained by the Rust front end."""

    def __init__(self, engine: Engine, frontend: _core.Frontend, kv_publisher: KvEventPublisher | None = None) -> None:
        self.engine = engine
        self.frontend = frontend
        self.stopping = threading.Event()
        self.kv_publisher = kv_publisher
        if kv_publisher is not None:
            kv_publisher.on_change = self.note_kv_events

    def run(self) -> None:
        if self.kv_publisher is None and not self.engine.device_greedy:
            self.run_plain()
            return
        # with KV events (a batch after the drain, another after the commit) or a runner
        # that picks greedy tokens itself (the drain's greedy rids)
        engine, frontend, core = self.engine, self.frontend, self.engine.core
        kv = self.kv_publisher is not None
        while not self.stopping.is_set():
            greedy = frontend.drain(core)
            if greedy is not None:
                engine.note_greedy(*greedy)
            if kv:
                self.publish_kv_events()  # those of aborts and flushes, outside a step
            if not core.has_work():
                frontend.wait(IDLE_WAIT_S)
                continue
            self.step()

    def run_plain(self) -> None:
        """``run`` for a runner that returns logits (no device greedy) without KV events:
        one call into the core before the forward (``next_plan``: drain and schedule) and
        one after (``commit``), and the plan goes to the runner as its batch. At low
        concurrency the Python work between forwards is most of what a token costs the
        server outside the forward, and it runs on caches the forward has just flushed, so
        nothing else is done per step."""
        engine, frontend, core = self.engine, self.frontend, self.engine.core
        next_plan, forward, commit = frontend.next_plan, engine.runner.forward, frontend.commit
        stopping = self.stopping
        while not stopping.is_set():
            plan = next_plan(core)
            if plan is None:
                frontend.wait(IDLE_WAIT_S)
                continue
            if not plan:
                frontend.take_outputs(core)  # aborts and timeouts of waiting requests
                continue
            try:
                commit(core, forward(plan))
            except CorePanicError:
                raise  # the core refuses further use: the server ends
            except Exception as e:
                log.error("a step of %d requests failed; they end with an error", len(plan), exc_info=True)
                frontend.fail_step(core, f"the model forward failed: {type(e).__name__}: {e}")

    def step(self) -> None:
        engine, frontend, core = self.engine, self.frontend, self.engine.core
        plan = core.schedule()
        if len(plan) == 0:
            finished = frontend.take_outputs(core)  # aborts and timeouts of waiting requests
        else:
            try:
                batch = ForwardBatch.from_plan(plan)
                ignore_eos = engine.device_greedy_rows(plan)
                if ignore_eos is not None:
                    ids = engine.runner.forward_greedy(  # type: ignore[attr-defined]
                        batch, engine.config.eos_token_ids, ignore_eos, vocab_size=core.vocab_size)
                    self.wait_kv_events()
                    finished = frontend.commit_tokens(core, ids)
                    engine.device_greedy_steps += 1
                else:
                    logits = engine.runner.forward(batch)
                    self.wait_kv_events()
                    finished = frontend.commit(core, logits)
            except CorePanicError:
                raise  # the core refuses further use: the server ends
            except Exception as e:
                # the step's requests end with an error (error_kind "step_failed"; clients
                # get no internals), the loop keeps serving
                log.error("a step of %d requests failed; they end with an error", len(plan), exc_info=True)
                finished = frontend.fail_step(core, f"the model forward failed: {type(e).__name__}: {e}")
        if self.kv_publisher is not None:
            self.publish_kv_events()
        if len(finished):
            engine.forget_greedy(finished)

    # ---- KV events (--kv-events-config) ----

    def wait_kv_events(self) -> None:
        """Before a step's outputs go out: the earlier steps' events are on the socket."""
        if self.kv_publisher is not None:
            self.kv_publisher.wait_earlier()

    def publish_kv_events(self) -> None:
        """The cache's events since the last call, as one batch (none when empty)."""
        assert self.kv_publisher is not None
        self.kv_publisher.publish_from(self.engine.core)

    def note_kv_events(self) -> None:
        p = self.kv_publisher
        if p is not None:
            self.frontend.note_kv_events(p.queued, p.sent, p.dropped, p.replays, p.late)


def run_rust_server(args: ServerArgs) -> int:
    level = "DEBUG" if args.log_level == "trace" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the port answers at once: /health is 503 ("the engine is starting") while the model loads
    loading = _core.FrontendLoading(args.host, args.port)
    kv_publisher = None
    try:
        engine = build_engine(args)
        if args.kv_events_config is not None and kv_events_on(args):
            try:
                kv_publisher = KvEventPublisher(args.kv_events_config)
            except OSError as e:  # the endpoint is taken or not an address
                print(f"ferrolm serve: {e}", file=sys.stderr, flush=True)
                return 1
        frontend = start_frontend(engine, args, loading)
    finally:
        loading.stop()  # frees the port if the engine did not start (else a no-op)
    loop = StepLoop(engine, frontend, kv_publisher)

    def stop(signum: int, _frame: Any) -> None:
        loop.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    url = f"http://{args.host}:{frontend.port}"
    print(f"ferrolm: serving {args.model_name!r} at {url} (OpenAI API under /v1)", flush=True)
    from ferrolm.server.launch import print_try

    print_try(args, url)
    serve(loop)
    return 0


def serve(loop: StepLoop) -> None:
    """Runs the step loop until it is stopped or fails (a core panic: the core refuses
    further use). Either way the front end then stops, answering what still waits with 503
    (streams end with an error event), and the KV publisher shuts down; a failure goes on
    up, so ``ferrolm serve`` exits with it rather than linger half-alive."""
    try:
        loop.run()
    finally:
        loop.frontend.stop(5.0)
        if loop.kv_publisher is not None:
            loop.kv_publisher.shutdown()
