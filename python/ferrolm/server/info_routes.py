"""Routes that describe the server: health, models, settings and load, model info, and
the cache flush."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

import ferrolm
from ferrolm.kv_events_config import describe_stream
from ferrolm.server.engine_client import EngineUnavailable
from ferrolm.server.errors import APIError
from ferrolm.server.openai_common import parse_body
from ferrolm.server.protocol import FlushCacheRequest
from ferrolm.server.state import state_of


async def health(request: Request) -> Response:
    """200 once the engine serves; 503 while it starts, after it failed, and while it
    does not answer (its heartbeat is late: frozen, or a step stuck)."""
    state = state_of(request)
    if state.client.ready:
        return JSONResponse({"status": "ok"})
    reason = state.client.unavailable or "the engine is starting"
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)


def _model_card(request: Request) -> dict[str, Any]:
    state = state_of(request)
    card: dict[str, Any] = {"id": state.args.model_name, "object": "model", "created": int(state.started_at),
                            "owned_by": "ferrolm", "root": state.args.model}
    if state.client.info:
        card["max_model_len"] = state.client.info["max_context_length"]
    return card


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(request)]})


async def retrieve_model(request: Request) -> Response:
    model_id = request.path_params["model_id"]
    card = _model_card(request)
    if model_id != card["id"]:
        raise APIError(404, f"model: {model_id!r} is not served here", "model", "model_not_found")
    return JSONResponse(card)


async def get_model_info(request: Request) -> Response:
    state = state_of(request)
    await state.engine_ready()
    return JSONResponse({"model_path": state.args.model, "served_model_name": state.args.model_name,
                         "is_generation": True, **state.client.info})


async def server_info(request: Request) -> Response:
    """Settings (the API key only as set / not set) and the engine's current load."""
    state = state_of(request)
    load: dict[str, Any] | None = None
    if state.client.ready:
        try:
            load = await state.client.call("stats")
        except EngineUnavailable:
            load = None
    return JSONResponse({"version": ferrolm.__version__, "settings": state.args.public_dict(),
                         "ready": state.client.ready, "load": load, "model": state.client.info,
                         "kv_events": kv_events_info(state.args, load)})


def kv_events_info(args: Any, load: dict[str, Any] | None) -> dict[str, Any]:
    """How a router follows this replica's KV events (vLLM's stream; ``enabled`` false
    when off): where to subscribe and ask for replays, the topic, the block size its
    index must use, and the publisher's counters (``queued`` batches so far: a subscriber
    that has the sequence numbers below it has everything up to the last step)."""
    info = describe_stream(args.kv_events_config, args.page_size)
    if not info["enabled"]:
        return info
    if load is not None:
        info |= {"queued_batches": load.get("kv_events_queued"), "published_batches": load.get("kv_events_sent"),
                 "dropped_batches": load.get("kv_events_dropped"), "late_steps": load.get("kv_events_late")}
    return info


async def flush_cache(request: Request) -> Response:
    """Drops the prefix cache; refused while requests run (their KV is in use). A POST in
    JSON, like every POST (no GET: a web page could trigger one with an image tag)."""
    state = state_of(request)
    if await request.body():
        await parse_body(request, FlushCacheRequest)
    await state.engine_ready()
    if not await state.client.call("flush_cache"):
        raise APIError(400, "the cache cannot be flushed while requests are running; try again when idle")
    return JSONResponse({"success": True, "message": "cache flushed"})
