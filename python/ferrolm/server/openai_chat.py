"""``POST /v1/chat/completions``: messages rendered with the model's chat template, then
generated like a completion; streamed in OpenAI's chunk framing (the assistant role
first, then deltas, one finish chunk per choice).

With ``tools`` the functions go to the chat template as Hugging Face templates take them,
the output is generated under the plan of ``ferrolm.tools.plan`` (calls that always
parse) and read by the server's tool-call parser into ``message.tool_calls``; with
``--reasoning-parser`` the thinking comes apart as ``reasoning_content``."""

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
from ferrolm.server.structured_output import constraint_kwargs
from ferrolm.server.tool_calls import deltas, final_reason, message, planned_params, server_formats, special_token_texts
from ferrolm.tools import ChatPlan, parse_tool_choice, parse_tools, plan_chat, template_messages

# chat template variables a request may not set through chat_template_kwargs
_RESERVED_TEMPLATE_VARIABLES = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}


async def plan_of(req: ChatCompletionRequest, state: ServerState) -> ChatPlan:
    """The rendered prompt and what tools and reasoning change about the generation."""
    try:
        tools = parse_tools([t.model_dump(exclude_none=True) for t in req.tools] if req.tools is not None else None)
        choice = parse_tool_choice(req.tool_choice.model_dump() if req.tool_choice is not None
                                   and not isinstance(req.tool_choice, str) else req.tool_choice, tools)
        messages = template_messages([m.model_dump(exclude_none=True) for m in req.messages])
        tool_format, reasoning = server_formats(state.args, state.tokenizer)
    except InvalidInputError as e:
        raise from_invalid_input(e) from None
    variables = dict(req.chat_template_kwargs or {})
    reserved = sorted(_RESERVED_TEMPLATE_VARIABLES & set(variables))
    if reserved:
        raise bad_request(f"chat_template_kwargs: {reserved[0]!r} is set by the server", "chat_template_kwargs")
    if tools:
        variables["tools"] = [t.as_template_tool() for t in tools]
    try:
        prompt = await state.off_loop(lambda: state.tokenizer.apply_chat_template(messages, **variables))
    except InvalidInputError as e:
        raise from_invalid_input(e, {}) if e.field else bad_request(f"messages: {e}", "messages") from None
    structured, structured_names = constraint_kwargs(
        regex=req.regex, json_schema=req.json_schema, ebnf=req.ebnf, response_format=req.response_format,
        guided_json=req.guided_json, guided_regex=req.guided_regex, guided_choice=req.guided_choice)
    try:
        return plan_chat(prompt, tools=tools, choice=choice, parallel=req.parallel_tool_calls is not False,
                         tool_format=tool_format, reasoning=reasoning,
                         constrain=not state.args.disable_tool_call_constraint, structured=structured,
                         structured_names=structured_names, special_tokens=special_token_texts(state.tokenizer))
    except InvalidInputError as e:
        raise from_invalid_input(e) from None


async def create_chat_completion(request: Request) -> Response:
    state = state_of(request)
    req = await parse_body(request, ChatCompletionRequest)
    state.check_model(req.model)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs: requires logprobs to be true", "top_logprobs")
    await state.engine_ready()
    max_tokens_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is not None:
        check_max_tokens(max_tokens, state.context_length, max_tokens_field)
    plan = await plan_of(req, state)
    # the template writes its own BOS and markers
    ids = await state.encode(plan.prompt, "messages", add_special_tokens=False)
    if max_tokens is None:  # as OpenAI: up to the end of the context
        max_tokens = state.context_length - len(ids)
        if max_tokens < 1:
            raise bad_request(f"messages: the prompt has {len(ids)} tokens; the context holds {state.context_length}",
                              "messages")
    field_names = {"input_ids": "messages", "max_new_tokens": max_tokens_field, "min_new_tokens": "min_tokens"}
    params = sampling_params_from(req, max_tokens=max_tokens, logprobs=req.logprobs,
                                  top_logprobs=req.top_logprobs or 0, field_names=field_names)
    params = planned_params(params, plan, field_names)
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
        return state.stream(response_id, gen, _stream(state, gen, meta, req.n, req.logprobs, include_usage, plan))
    samples = await state.collect(request, response_id, gen)
    choices = [_choice(state, s, req.logprobs, plan) for s in samples]
    return JSONResponse({**meta, "object": "chat.completion", "choices": choices, "usage": gen.usage()})


def _choice(state: ServerState, s: Sample, with_logprobs: bool, plan: ChatPlan) -> dict[str, Any]:
    logprobs = chat_logprobs(state, s.token_ids, s.logprobs, s.top_logprobs) if with_logprobs else None
    msg, finish_reason = message(plan, s.text, s.finish_reason)
    return {"index": s.index, "message": msg, "logprobs": logprobs, "finish_reason": finish_reason}


async def _stream(state: ServerState, gen: Generation, meta: dict[str, Any], n: int, with_logprobs: bool,
                  include_usage: bool, plan: ChatPlan) -> AsyncIterator[bytes]:
    meta = {**meta, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    parsers = {index: plan.output_parser() for index in range(n)} if plan.parses else {}
    has_calls = dict.fromkeys(range(n), False)

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
                if plan.parses:
                    parser = parsers[sample.index]
                    pieces = parser.feed(d.text) + (parser.finish() if d.finish_reason is not None else [])
                    out = deltas(pieces) or ([{}] if logprobs is not None else [])
                    has_calls[sample.index] |= any("tool_calls" in delta for delta in out)
                    for k, delta in enumerate(out):
                        yield chunk(sample.index, delta, logprobs if k == 0 else None)
                else:
                    yield chunk(sample.index, {"content": d.text}, logprobs)
            elif plan.parses and d.finish_reason is not None:
                out = deltas(parsers[sample.index].finish())
                has_calls[sample.index] |= any("tool_calls" in delta for delta in out)
                for delta in out:
                    yield chunk(sample.index, delta)
            if d.finish_reason == "error":
                yield sse_event(error_of(d).envelope())
            if d.finish_reason is not None:
                yield chunk(sample.index, {}, None, final_reason(d.finish_reason, has_calls[sample.index]))
    if include_usage:
        yield sse_event({**meta, "choices": [], "usage": gen.usage()})
    yield DONE
