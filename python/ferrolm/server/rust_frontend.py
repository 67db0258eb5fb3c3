"""``ferrolm serve``: the Rust HTTP front end (``_core.Frontend``, axum and
tokio threads that never take the GIL) in the process that runs the step loop.

Requests go from the HTTP threads into the core's queue and the core's step outputs go
straight to each request's stream, all in Rust: the step loop (``ferrolm.step_loop``, the
one ``ferrolm.Engine`` runs too) only runs plan -> forward (or device sampling) -> commit.
``frontend.next_plan`` drains what arrived into the core and schedules, in one call;
``frontend.commit`` (and ``commit_tokens``, for tokens the runner drew on its device)
commits and hands the outputs to the streams. While there is no work the loop blocks in
``frontend.wait`` (no busy spin; a request wakes it at once). A step is two calls into the
core around the forward, with the core's plan given to the runner as its batch
(``ferrolm.model.runner.Batch``). ``--device-sampling`` / ``--device-greedy`` choose the
runner's device modes (on by default off the CPU).

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
from ferrolm import _core, step_loop
from ferrolm._memory import release_free_heap
from ferrolm.engine import Engine
from ferrolm.kv_events_config import describe_stream
from ferrolm.kv_publisher import KvEventPublisher
from ferrolm.model.loader import tokenizer_json_path
from ferrolm.server.args import ServerArgs, build_engine, kv_events_on
from ferrolm.server.prompt_bounds import max_input_chars_per_token

log = logging.getLogger("ferrolm.server")

IDLE_WAIT_S = step_loop.IDLE_WAIT_S
# the HTTP runtime's workers: one wakes for a step's streams and writes their frames (a
# second one, woken to steal, cost each token's wake again and saved no time at 64 streams)
HTTP_THREADS = 1
TOKENIZER_THREADS = 2  # chat templates and tokenizing, off the workers
GRAMMAR_THREADS = 2  # grammar compiles run here, never on an HTTP thread or the step loop


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


def start_frontend(engine: Engine, args: ServerArgs, loading: _core.FrontendLoading | None = None) -> _core.Frontend:
    """Binds the port (or takes over the one ``loading`` bound while the model loaded) and
    starts the HTTP threads over ``engine``'s vocabulary and tokenizer."""
    tokenizer = engine.tokenizer
    info = model_info(engine)
    return _core.Frontend(
        engine.vocabulary,
        str(tokenizer_json_path(args.model)),
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
        lora_registry=engine.loras,
    )


class StepLoop(step_loop.StepLoop):
    """The step loop (``ferrolm.step_loop``) over ``engine``'s core and runner, with its
    device modes, fed by the front end and committing through it."""

    def __init__(self, engine: Engine, frontend: _core.Frontend, kv_publisher: KvEventPublisher | None = None) -> None:
        super().__init__(
            engine.core,
            engine.runner,
            eos_token_ids=engine.config.eos_token_ids,
            device_greedy=engine.device_greedy,
            device_sampling=engine.device_sampling,
            frontend=frontend,
            kv_publisher=kv_publisher,
        )
        self.engine = engine


def print_try(args: ServerArgs, url: str) -> None:
    """A curl line to try the server with."""
    auth = ' -H "Authorization: Bearer $FERROLM_API_KEY"' if args.api_key else ""
    print(
        f"try:  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"""-d '{{"model": "{args.model_name}", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 16}}'""",
        flush=True,
    )


def run_server(args: ServerArgs) -> int:
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
        # from the moment /health says ready, SIGTERM and SIGINT stop the loop cleanly (a
        # stop asked before the loop exists is kept for it); while the model loads they
        # still end the process at once
        stopping = threading.Event()

        def stop(signum: int, _frame: Any) -> None:
            stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        frontend = start_frontend(engine, args, loading)
    finally:
        loading.stop()  # frees the port if the engine did not start (else a no-op)
    # the front end tokenizes with its own copy read from tokenizer.json: the Python one's
    # tables (about 10 MB for a 50k vocabulary) are not needed while serving
    engine.tokenizer.release()
    release_free_heap()
    loop = StepLoop(engine, frontend, kv_publisher)
    loop.stopping = stopping
    if kv_publisher is not None:
        kv_publisher.publish_cleared()  # batch 0: the cache starts empty
    url = f"http://{args.host}:{frontend.port}"
    print(f"ferrolm: serving {args.model_name!r} at {url} (OpenAI API under /v1)", flush=True)
    print_try(args, url)
    serve(loop)
    return 0


def serve(loop: StepLoop) -> None:
    """Runs the step loop until it is stopped or fails (a core panic: the core refuses
    further use). Either way the front end then stops, answering what still waits with 503
    (streams end with an error event), and the KV publisher shuts down; a failure goes on
    up, so ``ferrolm serve`` exits with it rather than linger half-alive."""
    assert loop.frontend is not None
    try:
        loop.run()
    finally:
        loop.frontend.stop(5.0)
        if loop.kv_publisher is not None:
            loop.kv_publisher.shutdown()
