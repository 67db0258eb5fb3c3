"""``ferrolm serve``: the Rust front end (``rust_frontend``, the default), or the FastAPI app
under uvicorn, on one event loop in this process, with the engine in a child process
(``--frontend python``)."""

from __future__ import annotations

import logging

import uvicorn

from ferrolm.server.app import create_app
from ferrolm.server.args import ServerArgs


def print_try(args: ServerArgs, url: str) -> None:
    """A curl line to try the server with."""
    auth = f' -H "Authorization: Bearer $FERROLM_API_KEY"' if args.api_key else ""
    print(
        f"try:  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"""-d '{{"model": "{args.model_name}", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 16}}'""",
        flush=True,
    )


def run_server(args: ServerArgs) -> int:
    if args.frontend == "rust":
        from ferrolm.server.rust_frontend import run_rust_server

        return run_rust_server(args)
    level = "DEBUG" if args.log_level == "trace" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(args, exit_on_engine_failure=True)
    url = f"http://{args.host}:{args.port}"
    print(f"ferrolm: serving {args.model_name!r} at {url} (OpenAI API under /v1; Python front end)", flush=True)
    print_try(args, url)
    # one worker: the engine process holds the model; more API processes would need a router
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.log_level in ("debug", "trace"),
                timeout_graceful_shutdown=5)
    return 0
