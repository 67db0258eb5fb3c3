"""``POST /v1/completions``: text (or token ids) in, text out; ``n`` samples of each prompt,
streamed over SSE or answered at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ferrolm.server.errors import bad_request
from ferrolm.server.generation import Generation, Sample, error_of
from ferrolm.server.openai_common import (
    check_max_tokens, completion_id, completion_logprobs, core_kwargs, now, parse_body, sampling_params_from,
)
from ferrolm.server.protocol import CompletionRequest
from ferrolm.server.sse import DONE, sse_event
from ferrolm.server.state import ServerState, state_of

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
FIELD_NAMES = {"input_ids": "prompt", "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
               "top_logprobs": "logprobs"}


async def prompts_of(req: CompletionRequest, state: ServerState) -> list[Any]:
    """The prompts as token id sequences (the core checks ids against the vocabulary),
    every text checked for length before any is tokenized."""
    prompt = req.prompt
    prompts: list[Any] = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
    if not prompts:
        raise bad_request("prompt: no prompt given", "prompt")
    for p in prompts:
        if not p:
            raise bad_request("prompt: the prompt is empty", "prompt")
        if isinstance(p, str):
            state.check_text_length(p, "prompt")
    return [await state.encode(p, "prompt") if isinstance(p, str) else p for p in prompts]


async def create_completion(request: Request) -> Response:
    state = state_of(request)
    req = await parse_body(request, CompletionRequest)
    state.check_model(req.model)
    if req.echo:
        raise bad_request("echo: not supported yet", "echo")
    if req.suffix:
        raise bad_request("suffix: not supported yet", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of: not supported yet (other than equal to n)", "best_of")
    field_names = dict(FIELD_NAMES)
    params = sampling_params_from(
        req, max_tokens=req.max_tokens or DEFAULT_MAX_TOKENS, logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0, field_names=field_names,
    )
    await state.engine_ready()
    check_max_tokens(params.max_new_tokens, state.context_length, "max_tokens")
    prompts = await prompts_of(req, state)
    gen = Generation(state.client)
    try:
        for i, ids in enumerate(prompts):
            await gen.add(ids, params, i, field_names, **core_kwargs(req.priority, req.cache_salt))
    except BaseException:
        gen.close()
        raise
    response_id = completion_id("cmpl")
    meta = {"id": response_id, "object": "text_completion", "created": now(), "model": state.args.model_name}
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return state.stream(response_id, gen, _stream(state, gen, meta, req.logprobs is not None, include_usage))
    samples = await state.collect(request, response_id, gen)
    choices = [_choice(state, s, req.logprobs is not None) for s in samples]
    return JSONResponse({**meta, "choices": choices, "usage": gen.usage()})


def _choice(state: ServerState, s: Sample, with_logprobs: bool) -> dict[str, Any]:
    logprobs = completion_logprobs(state, s.token_ids, s.logprobs, s.top_logprobs, 0) if with_logprobs else None
    return {"index": s.index, "text": s.text, "logprobs": logprobs, "finish_reason": s.finish_reason}


async def _stream(state: ServerState, gen: Generation, meta: dict[str, Any], with_logprobs: bool,
                  include_usage: bool) -> AsyncIterator[bytes]:
    extra = {"usage": None} if include_usage else {}
    text_offsets: dict[int, int] = {}  # per choice: where its next token's text starts

    def chunk(index: int, text: str, logprobs: Any, finish_reason: str | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse_event({**meta, "choices": [choice], **extra})

    # no try/finally: EventStreamResponse releases the request however the stream ends
    async for batch in gen.updates():
        for sample, d in batch:
            if d.token_ids or d.text:
                logprobs = None
                if with_logprobs:
                    start = text_offsets.get(sample.index, 0)
                    logprobs = completion_logprobs(state, d.token_ids, d.logprobs, d.top_logprobs, start)
                    text_offsets[sample.index] = start + sum(len(t) for t in logprobs["tokens"])
                yield chunk(sample.index, d.text, logprobs, None)
            if d.finish_reason == "error":
                yield sse_event(error_of(d).envelope())
            if d.finish_reason is not None:
                yield chunk(sample.index, "", None, d.finish_reason)
    if include_usage:
        yield sse_event({**meta, "choices": [], "usage": gen.usage()})
    yield DONE

