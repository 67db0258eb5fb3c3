"""What the two OpenAI endpoints share: reading the body, turning it into
``SamplingParams``, and writing logprobs and ids the way OpenAI does."""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.errors import bad_request, from_invalid_input, from_validation_error
from ferrolm.server.protocol import U32_MAX, OpenAISampling
from ferrolm.server.state import ServerState
from ferrolm.server.structured_output import constraint_kwargs

Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise from_validation_error(e, model) from None


_DECIMAL = re.compile(r"[0-9]+", re.ASCII)


def parse_logit_bias(bias: dict[str, float] | None, param: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys, so as strings: plain ASCII decimals
    (not " 5", "+5", "1_000" or "٣", which Python's ``int`` would take), in u32 range."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        digits = key.lstrip("0") or "0"  # int() refuses over 4300 digits, leading zeros included
        if not _DECIMAL.fullmatch(key) or len(digits) > len(str(U32_MAX)) or int(digits) > U32_MAX:
            raise bad_request(f"{param}: key {key[:40]!r} is not a token id (a decimal number below 2**32)", param)
        token = int(digits)
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"{param}: bias {value} of token {token} is outside [-100, 100]", param)
        out[token] = float(value)
    return out


def sampling_params_from(req: OpenAISampling, *, max_tokens: int, logprobs: bool, top_logprobs: int,
                         field_names: dict[str, str]) -> SamplingParams:
    """Raises ``APIError`` 400 naming the field for values the engine would refuse.
    ``field_names`` (core field -> body field) gains the structured-output field used."""
    constraint, constraint_names = constraint_kwargs(
        regex=req.regex, json_schema=req.json_schema, ebnf=req.ebnf, response_format=req.response_format,
        guided_json=req.guided_json, guided_regex=req.guided_regex, guided_choice=req.guided_choice,
        guided_grammar=req.guided_grammar, grammar=req.grammar)
    field_names.update(constraint_names)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return SamplingParams(
            max_new_tokens=max_tokens,
            min_new_tokens=req.min_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None or req.top_k == -1 else req.top_k,  # -1: off, as in vLLM
            min_p=0.0 if req.min_p is None else req.min_p,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            logit_bias=parse_logit_bias(req.logit_bias),
            seed=req.seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            stop=stop,
            stop_token_ids=list(req.stop_token_ids or []),
            include_stop_str=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            ignore_eos=req.ignore_eos,
            n=req.n,
            **constraint,
        )
    except InvalidInputError as e:
        raise from_invalid_input(e, field_names) from None


def core_kwargs(priority: int | None, cache_salt: str | None) -> dict[str, Any]:
    """Engine-core arguments beyond sampling, per request: the scheduler's priority, and
    the prefix cache's namespace (a request reuses only what requests of the same
    ``cache_salt`` cached, so tenants with different salts never share a prefix)."""
    kw: dict[str, Any] = {}
    if priority is not None:
        kw["priority"] = priority
    if cache_salt is not None:
        kw["namespace"] = cache_salt
    return kw


def check_max_tokens(max_tokens: int, context_length: int, param: str) -> None:
    """A budget beyond the context can never be met; refused here, before the core adds it
    to the prompt's length."""
    if max_tokens > context_length:
        raise bad_request(f"{param}: {max_tokens} is more than the context length ({context_length})", param)


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finite(x: float) -> float | None:
    """JSON has no NaN: a logprob the engine did not compute is null."""
    return None if math.isnan(x) else x


def completion_logprobs(state: ServerState, token_ids: list[int], logprobs: list[float],
                        top: list[list[tuple[int, float]]], text_offset: int) -> dict[str, Any]:
    """The legacy completions shape: parallel lists, ``top_logprobs`` as {token: logprob}."""
    tokens = [state.token_text(t) for t in token_ids]
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [finite(x) for x in logprobs],
        "top_logprobs": [{state.token_text(t): finite(x) for t, x in alts} for alts in top],
        "text_offset": offsets,
    }


def chat_logprobs(state: ServerState, token_ids: list[int], logprobs: list[float],
                  top: list[list[tuple[int, float]]]) -> dict[str, Any]:
    """The chat shape: one entry per token with its bytes and its alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = state.token_bytes[token_id] if 0 <= token_id < len(state.token_bytes) else b""
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": finite(logprob), "bytes": list(raw)}

    return {"content": [{**entry(t, x), "top_logprobs": [entry(a, y) for a, y in alts]}
                        for t, x, alts in zip(token_ids, logprobs, top)]}
