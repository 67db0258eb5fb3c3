"""The FastAPI application: routes, error envelopes, and the engine process's life
tied to the server's (started at startup, stopped at shutdown)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from ferrolm.model.loader import resolve_model_folder
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.server import info_routes, metrics, native, openai_chat, openai_completions
from ferrolm.server.args import ServerArgs
from ferrolm.server.auth import APIKeyMiddleware
from ferrolm.server.engine_client import EngineClient, EngineUnavailable
from ferrolm.server.errors import APIError, error_envelope
from ferrolm.server.guard import RequestGuard
from ferrolm.server.generation import ClientGone
from ferrolm.server.metrics import ServerMetrics
from ferrolm.server.state import ServerState

log = logging.getLogger("ferrolm.server")


def create_app(args: ServerArgs, *, exit_on_engine_failure: bool = False) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the tokenizer lives here too: requests are tokenized before they reach the engine
        tokenizer = Tokenizer.from_folder(resolve_model_folder(args.model))
        client = EngineClient(args)
        client.start()
        app.state.ferrolm = state = ServerState(args, client, tokenizer)
        # the token table (for logprobs, and the prompt length bound) takes a moment on a
        # large vocabulary: not on the loop
        asyncio.get_running_loop().run_in_executor(state.executor, lambda: state.chars_per_token)
        watcher = asyncio.create_task(_watch_engine(client, exit_on_engine_failure))
        try:
            yield
        finally:
            watcher.cancel()
            await asyncio.to_thread(client.close)
            state.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ferrolm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = ServerMetrics()
    _add_routes(app)
    _add_error_handlers(app)
    # the last added runs first: the key is checked before a body is read
    app.add_middleware(RequestGuard, max_body_bytes=args.max_request_bytes)
    if args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=args.api_key)
    return app


class _Anything(PathConvertor):
    """Starlette's ``path`` without its one gap: a newline (a model id may hold "%0A")."""

    regex = r"[\s\S]*"


register_url_convertor("anything", _Anything())


def _add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/completions", openai_completions.create_completion, methods=["POST"])
    app.add_api_route("/v1/chat/completions", openai_chat.create_chat_completion, methods=["POST"])
    app.add_api_route("/v1/models", info_routes.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:anything}", info_routes.retrieve_model, methods=["GET"])
    app.add_api_route("/generate", native.generate, methods=["POST"])
    app.add_api_route("/abort_request", native.abort_request, methods=["POST"])
    app.add_api_route("/health", info_routes.health, methods=["GET"])
    app.add_api_route("/server_info", info_routes.server_info, methods=["GET"])
    app.add_api_route("/get_server_info", info_routes.server_info, methods=["GET"])  # SGLang's older name
    app.add_api_route("/get_model_info", info_routes.get_model_info, methods=["GET"])
    app.add_api_route("/flush_cache", info_routes.flush_cache, methods=["POST"])
    app.add_api_route("/metrics", metrics.metrics, methods=["GET"])


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> Response:
        return e.response()

    @app.exception_handler(EngineUnavailable)
    async def engine_unavailable(_: Request, e: EngineUnavailable) -> Response:
        return JSONResponse(error_envelope(503, str(e)), status_code=503)

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed"

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, e: RequestValidationError) -> Response:
        return JSONResponse(error_envelope(400, str(e)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> Response:
        return JSONResponse(error_envelope(e.status_code, str(e.detail)), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception) -> Response:
        log.exception("unexpected error")
        return JSONResponse(error_envelope(500, f"internal error: {type(e).__name__}"), status_code=500)


async def _watch_engine(client: EngineClient, exit_on_failure: bool) -> None:
    """Logs readiness; a server whose engine cannot start (or died) exits rather than
    answer 503 forever, when run from the command line."""
    await client.started.wait()
    if client.failure is None:
        log.info("the engine is ready: %s", client.info)
    await client.gone.wait()
    if exit_on_failure:
        log.error("shutting down: %s", client.failure)
        os.kill(os.getpid(), signal.SIGTERM)
