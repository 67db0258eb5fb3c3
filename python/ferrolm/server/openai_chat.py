"""``POST /v1/chat/completions``: messages rendered with the model's chat template, then
generated like a completion; streamed in OpenAI's chunk framing (the assistant role
first, content deltas, one finish chunk per choice)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ferrolm.errors import InvalidInputError
from ferrolm.server.errors import bad_request, from_invalid_input
from ferrolm.server.generation import Generation, Sample, error_of
from ferrolm.server.openai_common import (
    chat_logprobs, check_max_tokens, completion_id, core_kwargs, now, parse_body, sampling_params_from,
)
from ferrolm.server.protocol import ChatCompletionRequest
from ferrolm.server.sse import DONE, sse_event
from ferrolm.server.state import ServerState, state_of


async def prompt_ids_of(req: ChatCompletionRequest, state: ServerState) -> Any:
    messages = []
    for m in req.messages:
        content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
        message: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    try:
        return await state.chat_prompt(messages, "messages")
    except InvalidInputError as e:
        raise from_invalid_input(e, {}) if e.field else bad_request(f"messages: {e}", "messages") from None


async def create_chat_completion(request: Request) -> Response:
    state = state_of(request)
    req = await parse_body(request, ChatCompletionRequest)
    state.check_model(req.model)
    if req.tools:
        raise bad_request("tools: tool calling is not supported yet", "tools")
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs: requires logprobs to be true", "top_logprobs")
    await state.engine_ready()
    max_tokens_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is not None:
        check_max_tokens(max_tokens, state.context_length, max_tokens_field)
    ids = await prompt_ids_of(req, state)
    if max_tokens is None:  # as OpenAI: up to the end of the context
        max_tokens = state.context_length - len(ids)
        if max_tokens < 1:
            raise bad_request(f"messages: the prompt has {len(ids)} tokens; the context holds {state.context_length}",
                              "messages")
    field_names = {"input_ids": "messages", "max_new_tokens": max_tokens_field, "min_new_tokens": "min_tokens"}
    params = sampling_params_from(req, max_tokens=max_tokens, logprobs=req.logprobs,
                                  top_logprobs=req.top_logprobs or 0, field_names=field_names)
    gen = Generation(state.client)
    try:
        await gen.add(ids, params, 0, field_names, **core_kwargs(req.priority, req.cache_salt))
    except BaseException:
        gen.close()
        raise
    response_id = completion_id("chatcmpl")
    meta = {"id": response_id, "created": now(), "model": state.args.model_name}
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return state.stream(response_id, gen, _stream(state, gen, meta, req.n, req.logprobs, include_usage))
    samples = await state.collect(request, response_id, gen)
    choices = [_choice(state, s, req.logprobs) for s in samples]
    return JSONResponse({**meta, "object": "chat.completion", "choices": choices, "usage": gen.usage()})


def _choice(state: ServerState, s: Sample, with_logprobs: bool) -> dict[str, Any]:
    logprobs = chat_logprobs(state, s.token_ids, s.logprobs, s.top_logprobs) if with_logprobs else None
    return {"index": s.index, "message": {"role": "assistant", "content": s.text}, "logprobs": logprobs,
            "finish_reason": s.finish_reason}


async def _stream(state: ServerState, gen: Generation, meta: dict[str, Any], n: int, with_logprobs: bool,
                  include_usage: bool) -> AsyncIterator[bytes]:
    meta = {**meta, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse_event({**meta, "choices": [choice], **extra})

    # no try/finally: EventStreamResponse releases the request however the stream ends
    for index in range(n):
        yield chunk(index, {"role": "assistant", "content": ""})
    async for batch in gen.updates():
        for sample, d in batch:
            if d.token_ids or d.text:
                logprobs = chat_logprobs(state, d.token_ids, d.logprobs, d.top_logprobs) if with_logprobs else None
                yield chunk(sample.index, {"content": d.text}, logprobs)
            if d.finish_reason == "error":
                yield sse_event(error_of(d).envelope())
            if d.finish_reason is not None:
                yield chunk(sample.index, {}, None, d.finish_reason)
    if include_usage:
        yield sse_event({**meta, "choices": [], "usage": gen.usage()})
    yield DONE
