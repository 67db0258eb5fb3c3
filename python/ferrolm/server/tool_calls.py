"""Tool calls and reasoning where they meet the HTTP API: the server's parsers (from its
flags and the chat template), a request's plan applied to its ``SamplingParams``, and the
parsed output written as OpenAI writes it, whole (``message``) and streamed (``deltas``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ferrolm.errors import InvalidInputError
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.sampling_params import SamplingParams
from ferrolm.server.args import ServerArgs
from ferrolm.server.errors import from_invalid_input
from ferrolm.tools import ChatPlan, MessageBuilder, Piece, ReasoningFormat, ToolCallFormat
from ferrolm.tools import reasoning_format, tool_call_format
from ferrolm.tools.pieces import ARGUMENTS, CALL, CONTENT, REASONING

# what a plan may set: every constraint field is reset first, so the plan's is the only one
_CONSTRAINT_RESET: dict[str, Any] = {
    "regex": None, "json_schema": None, "json_schema_strict": False, "json_object": False, "choice": None,
    "structured_after": None, "structured_optional": False, "structured_tags": None, "structured_or": None,
    "json_schema_parts": None,
}


def server_formats(args: ServerArgs, tokenizer: Tokenizer) -> tuple[ToolCallFormat | None, ReasoningFormat | None]:
    """The tool-call format (``--tool-call-parser``, or the chat template's) and the
    reasoning format (``--reasoning-parser``) of this server."""
    template = tokenizer.chat_template
    return tool_call_format(args.tool_call_parser, template), reasoning_format(args.reasoning_parser, template)


@functools.lru_cache(maxsize=8)
def special_token_texts(tokenizer: Tokenizer) -> frozenset[str]:
    """The texts of the tokenizer's special tokens."""
    return frozenset(tokenizer.hf.id_to_token(i) or "" for i in tokenizer.special_token_ids)


def planned_params(params: SamplingParams, plan: ChatPlan, field_names: dict[str, str]) -> SamplingParams:
    """``params`` with the plan's constraint in place of the request's own (the plan took
    that into account); ``field_names`` gains the fields the plan's constraint came from."""
    changes: dict[str, Any] = {}
    if plan.constraint or params.grammar_source() is not None:
        changes = {**_CONSTRAINT_RESET, **plan.constraint}
    if plan.skip_special_tokens is False:
        changes["skip_special_tokens"] = False
    field_names.update(plan.field_names)
    if not changes:
        return params
    try:
        return dataclasses.replace(params, **changes)
    except InvalidInputError as e:
        raise from_invalid_input(e, field_names) from None


def parse_whole(plan: ChatPlan, text: str) -> MessageBuilder:
    parser = plan.output_parser()
    built = MessageBuilder()
    built.add(parser.feed(text))
    built.add(parser.finish())
    return built


def message(plan: ChatPlan, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message of one output, and its finish reason (``tool_calls`` when it
    ended by itself with calls)."""
    if not plan.parses:
        return {"role": "assistant", "content": text}, finish_reason
    built = parse_whole(plan, text)
    out: dict[str, Any] = {"role": "assistant", "content": built.content or None}
    if plan.reasoning is not None:
        out["reasoning_content"] = built.reasoning or None
    if built.calls:
        out["tool_calls"] = [c.as_openai() for c in built.calls]
    return out, final_reason(finish_reason, bool(built.calls))


def final_reason(finish_reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and finish_reason == "stop" else finish_reason


def deltas(pieces: list[Piece]) -> list[dict[str, Any]]:
    """OpenAI's chunk deltas for pieces: the call's id and name first (with empty
    arguments), then its argument fragments; runs of one kind merged."""
    out: list[dict[str, Any]] = []
    for p in pieces:
        last = out[-1] if out else None
        if p.kind in (REASONING, CONTENT):
            key = "reasoning_content" if p.kind == REASONING else "content"
            if last is not None and list(last) == [key]:
                last[key] += p.text
            else:
                out.append({key: p.text})
        elif p.kind == CALL:
            out.append({"tool_calls": [{"index": p.index, "id": p.call_id, "type": "function",
                                        "function": {"name": p.text, "arguments": ""}}]})
        elif p.kind == ARGUMENTS:
            if last is not None and list(last) == ["tool_calls"] and last["tool_calls"][0]["index"] == p.index \
                    and "id" not in last["tool_calls"][0]:
                last["tool_calls"][0]["function"]["arguments"] += p.text
            else:
                out.append({"tool_calls": [{"index": p.index, "function": {"arguments": p.text}}]})
    return out
