"""``Engine.chat``: chat messages in, the assistant's answer out, with tools and reasoning
as over the OpenAI API (``ferrolm.tools``): tool calls come back parsed, and with
``required`` or a named function (or ``auto`` once the model opens a call) they are
generated under the functions' schemas, so they always parse.

    engine = ferrolm.Engine("tiny")
    [answer] = engine.chat([{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                           tool_choice="required")
    answer.tool_calls[0].name, json.loads(answer.tool_calls[0].arguments)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ferrolm.errors import InvalidInputError
from ferrolm.sampling_params import SamplingParams
from ferrolm.tools import (
    MessageBuilder, ToolCall, parse_tool_choice, parse_tools, plan_chat, reasoning_format, template_messages,
    tool_call_format,
)

if TYPE_CHECKING:
    from ferrolm.engine import Engine, GenerationResult

_RESERVED_TEMPLATE_VARIABLES = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}


@dataclass(slots=True)
class ChatResult:
    """One sample's answer: ``content`` (None when there are only calls), the thinking
    (with a reasoning parser), the calls, and the raw generation."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # as OpenAI: "tool_calls" when it ended with calls
    text: str = ""  # what the model wrote, unparsed
    token_ids: list[int] = field(default_factory=list)
    prompt: str = ""  # the rendered prompt, with what the tools added


def chat(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    params: SamplingParams | None = None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool = True,
    tool_call_parser: str = "auto",
    reasoning_parser: str | None = "auto",
    constrain_tool_calls: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[ChatResult]:
    """See ``Engine.chat``."""
    params = params or SamplingParams(max_new_tokens=256)
    parsed_tools = parse_tools(tools)
    choice = parse_tool_choice(tool_choice, parsed_tools)
    variables = dict(chat_template_kwargs or {})
    reserved = sorted(_RESERVED_TEMPLATE_VARIABLES & set(variables))
    if reserved:
        raise InvalidInputError(f"chat_template_kwargs: {reserved[0]!r} is set by chat()", "chat_template_kwargs")
    if parsed_tools:
        variables["tools"] = [t.as_template_tool() for t in parsed_tools]
    tokenizer = engine.tokenizer
    prompt = tokenizer.apply_chat_template(template_messages(messages), **variables)
    structured = _constraint_fields(params)
    plan = plan_chat(
        prompt, tools=parsed_tools, choice=choice, parallel=parallel_tool_calls,
        tool_format=tool_call_format(tool_call_parser, tokenizer.chat_template),
        reasoning=reasoning_format(reasoning_parser, tokenizer.chat_template), constrain=constrain_tool_calls,
        structured=structured, structured_names={k: k for k in structured},
        special_tokens=frozenset(tokenizer.hf.id_to_token(i) or "" for i in tokenizer.special_token_ids),
    )
    if plan.constraint or structured:
        params = dataclasses.replace(params, **{**_RESET, **plan.constraint})
    if plan.skip_special_tokens is False:
        params = dataclasses.replace(params, skip_special_tokens=False)
    try:
        results = engine.generate(tokenizer.encode(plan.prompt, add_special_tokens=False), params)
    except InvalidInputError as e:
        # the answer's format (structured_or) is the caller's own field
        if e.field == "structured_or" and "structured_or" in plan.field_names:
            raise InvalidInputError(str(e), plan.field_names["structured_or"]) from None
        raise
    return [_result(plan, r) for r in results]


# a plan's constraint replaces the caller's (which it took into account)
_RESET: dict[str, Any] = {"regex": None, "json_schema": None, "json_schema_strict": False, "json_object": False,
                          "choice": None, "structured_after": None, "structured_optional": False,
                          "structured_tags": None, "structured_or": None, "json_schema_parts": None}


def _constraint_fields(params: SamplingParams) -> dict[str, Any]:
    """The caller's structured-output fields that are set."""
    out: dict[str, Any] = {}
    for name in ("regex", "json_schema", "choice", "structured_after"):
        if getattr(params, name) is not None:
            out[name] = getattr(params, name)
    if params.json_object:
        out["json_object"] = True
    if params.json_schema_strict:
        out["json_schema_strict"] = True
    return out


def _result(plan: Any, r: GenerationResult) -> ChatResult:
    if not plan.parses:
        return ChatResult(r.text, None, [], r.finish_reason, r.text, list(r.token_ids), plan.prompt)
    parser = plan.output_parser()
    built = MessageBuilder()
    built.add(parser.feed(r.text))
    built.add(parser.finish())
    finish = "tool_calls" if built.calls and r.finish_reason == "stop" else r.finish_reason
    content = built.content or None
    reasoning = (built.reasoning or None) if plan.reasoning is not None else None
    return ChatResult(content, reasoning, built.calls, finish,
                      r.text, list(r.token_ids), plan.prompt)
