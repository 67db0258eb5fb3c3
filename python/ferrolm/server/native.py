"""The native API, after SGLang's: ``/generate`` (text or ids in, text, ids and meta_info
out; SSE with the cumulative text when streamed) and ``/abort_request``.

``tools`` (with ``tool_choice`` and ``parallel_tool_calls``, as in chat completions) make
the output a tool call generated under the functions' schemas and parsed: the result gains
``content`` and ``tool_calls`` beside the raw ``text``; ``separate_reasoning`` (with
``--reasoning-parser``) adds ``reasoning_content``. The prompt is the caller's: the tools
are not written into it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.errors import bad_request, from_invalid_input
from ferrolm.server.generation import Generation, Sample, error_of
from ferrolm.server.openai_common import check_max_tokens, core_kwargs, finite, parse_body, parse_logit_bias
from ferrolm.server.protocol import AbortRequest, GenerateRequest, NativeSamplingParams
from ferrolm.server.sse import DONE, sse_event
from ferrolm.server.state import state_of
from ferrolm.server.structured_output import constraint_kwargs
from ferrolm.server.tool_calls import final_reason, parse_whole, planned_params, server_formats, special_token_texts
from ferrolm.tools import ChatPlan, parse_tool_choice, parse_tools, plan_chat

FIELD_NAMES = {name: f"sampling_params.{name}" for name in SamplingParams.__dataclass_fields__}
FIELD_NAMES |= {"input_ids": "input_ids", "logprobs": "return_logprob", "top_logprobs": "top_logprobs_num"}


def native_params(sp: NativeSamplingParams, req: GenerateRequest) -> SamplingParams:
    constraint, _ = constraint_kwargs(regex=sp.regex, json_schema=sp.json_schema, ebnf=sp.ebnf,
                                      prefix="sampling_params.")
    try:
        return SamplingParams(
            max_new_tokens=sp.max_new_tokens, min_new_tokens=sp.min_new_tokens, temperature=sp.temperature,
            top_p=sp.top_p, top_k=0 if sp.top_k == -1 else sp.top_k, min_p=sp.min_p,
            repetition_penalty=sp.repetition_penalty, frequency_penalty=sp.frequency_penalty,
            presence_penalty=sp.presence_penalty,
            logit_bias=parse_logit_bias(sp.logit_bias, "sampling_params.logit_bias"), seed=sp.seed,
            logprobs=req.return_logprob, top_logprobs=req.top_logprobs_num if req.return_logprob else 0,
            stop=[sp.stop] if isinstance(sp.stop, str) else list(sp.stop or []),
            stop_token_ids=list(sp.stop_token_ids or []), include_stop_str=sp.no_stop_trim,
            skip_special_tokens=sp.skip_special_tokens, ignore_eos=sp.ignore_eos, n=sp.n, **constraint,
        )
    except InvalidInputError as e:
        raise from_invalid_input(e, FIELD_NAMES) from None


async def generate(request: Request) -> Response:
    state = state_of(request)
    req = await parse_body(request, GenerateRequest)
    if (req.text is None) == (req.input_ids is None):
        raise bad_request("text: give exactly one of text and input_ids", "text")
    if req.text == "" or req.input_ids == []:
        field = "text" if req.text is not None else "input_ids"
        raise bad_request(f"{field}: the prompt is empty", field)
    params = native_params(req.sampling_params, req)
    if req.stream and params.n > 1:
        raise bad_request("stream: streaming is for n = 1", "stream")
    rid = req.rid
    if rid is not None and rid in state.named:
        raise bad_request(f"rid: {rid!r} is already in flight", "rid")
    await state.engine_ready()
    check_max_tokens(params.max_new_tokens, state.context_length, "sampling_params.max_new_tokens")
    field_names = {**FIELD_NAMES, "input_ids": "text" if req.text is not None else "input_ids"}
    plan = _plan(req, state, params)
    if plan is not None:
        params = planned_params(params, plan, field_names)
    ids = await state.encode(req.text, "text") if req.text is not None else req.input_ids
    if plan is not None and plan.primed and plan.tool_format is not None and plan.tool_format.opening:
        # the forced call's opening goes after the caller's prompt
        opening = await state.off_loop(lambda: state.tokenizer.encode(plan.tool_format.opening,  # type: ignore[union-attr]
                                                                      add_special_tokens=False))
        ids = [*map(int, ids if ids is not None else []), *map(int, opening)]
    gen = Generation(state.client)
    try:
        await gen.add(ids, params, 0, field_names, **core_kwargs(req.priority, req.cache_salt))
    except BaseException:
        gen.close()
        raise
    rid = rid or f"gen-{gen.handle.rids[0]}"
    if req.stream:
        return state.stream(rid, gen, _stream(gen, rid, req.return_logprob, plan))
    samples = await state.collect(request, rid, gen)
    out = [_result(s, rid, req.return_logprob, plan) for s in samples]
    return JSONResponse(out[0] if len(out) == 1 else out)


def _plan(req: GenerateRequest, state: Any, params: SamplingParams) -> ChatPlan | None:
    """What tools and reasoning change, for a request that asks for either."""
    if req.tools is None and req.tool_choice is None and not req.separate_reasoning:
        return None
    try:
        tools = parse_tools([t.model_dump(exclude_none=True) for t in req.tools] if req.tools is not None else None)
        choice = parse_tool_choice(req.tool_choice.model_dump() if req.tool_choice is not None
                                   and not isinstance(req.tool_choice, str) else req.tool_choice, tools)
        tool_format, reasoning = server_formats(state.args, state.tokenizer)
        if req.separate_reasoning and reasoning is None:
            raise InvalidInputError("separate_reasoning: the server runs without --reasoning-parser",
                                    "separate_reasoning")
        prompt = req.text if req.text is not None else state.tokenizer.decode(req.input_ids or [])
        sp = req.sampling_params
        structured, names = constraint_kwargs(regex=sp.regex, json_schema=sp.json_schema, ebnf=sp.ebnf,
                                              prefix="sampling_params.")
        return plan_chat(prompt, tools=tools, choice=choice, parallel=req.parallel_tool_calls is not False,
                         tool_format=tool_format, reasoning=reasoning if req.separate_reasoning else None,
                         constrain=not state.args.disable_tool_call_constraint, structured=structured,
                         structured_names=names, special_tokens=special_token_texts(state.tokenizer))
    except InvalidInputError as e:
        raise from_invalid_input(e) from None


def _parsed(plan: ChatPlan | None, s: Sample) -> dict[str, Any]:
    """The parsed output's fields (none without a plan)."""
    if plan is None:
        return {}
    built = parse_whole(plan, s.text)
    out: dict[str, Any] = {"content": built.content or None}
    if plan.reasoning is not None:
        out["reasoning_content"] = built.reasoning or None
    if plan.tool_format is not None:
        out["tool_calls"] = [c.as_openai() for c in built.calls]
    return out


def _result(s: Sample, rid: str, with_logprobs: bool, plan: ChatPlan | None = None) -> dict[str, Any]:
    finish = None if s.finish_reason is None else {"type": s.finish_reason, "matched": s.matched_stop}
    if s.error is not None and finish is not None:
        finish["message"] = s.error
    meta: dict[str, Any] = {
        "id": rid, "finish_reason": finish, "prompt_tokens": s.prompt_tokens,
        "completion_tokens": len(s.token_ids), "cached_tokens": s.cached_tokens,
    }
    if with_logprobs:
        meta["output_token_logprobs"] = [[finite(x), t] for x, t in zip(s.logprobs, s.token_ids)]
        meta["output_top_logprobs"] = [[[finite(y), a] for a, y in alts] for alts in s.top_logprobs]
    parsed = _parsed(plan, s)
    if parsed.get("tool_calls") and finish is not None and s.finish_reason is not None:
        finish["type"] = final_reason(s.finish_reason, True)
    return {"text": s.text, "output_ids": s.token_ids, "meta_info": meta, **parsed}


async def _stream(gen: Generation, rid: str, with_logprobs: bool, plan: ChatPlan | None) -> AsyncIterator[bytes]:
    async for batch in gen.updates():
        for sample, d in batch:
            if d.finish_reason == "error":
                yield sse_event(error_of(d).envelope())
            yield sse_event(_result(sample, rid, with_logprobs, plan))
    yield DONE


async def abort_request(request: Request) -> Response:
    """Aborts one request by its id (a /generate rid or an OpenAI response id), or every
    request of the engine."""
    state = state_of(request)
    req = await parse_body(request, AbortRequest)
    if req.abort_all:
        await state.engine_ready()
        count = await state.client.call("abort_all")
        return JSONResponse({"aborted": count})
    if req.rid is None:
        raise bad_request("rid: give a rid, or abort_all: true", "rid")
    gen = state.named.get(req.rid)
    if gen is None:
        return JSONResponse({"aborted": 0})
    unfinished = sorted(gen.handle.unfinished)
    state.client.abort(unfinished)
    return JSONResponse({"aborted": len(unfinished)})
