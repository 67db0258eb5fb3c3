"""What a chat request with tools (or a reasoning model) changes about its generation: the
text added to the prompt, the grammar the output is generated under, and the parser its
output is read with. Shared by the HTTP API and ``Engine.chat``.

Calls that always parse: with ``tool_choice`` ``required`` or a named function the prompt
ends with the format's opening (``<tool_call>\\n``) and the whole output is generated
under the JSON Schema of the call(s), built from the functions' schemas. With ``auto`` the
model writes freely, and may end so, until the format's trigger appears; from there the
call is constrained the same way (the engine's trigger segments, with an optional
trigger). Several calls in one answer (``parallel_tool_calls``, the default) are the
format's structural tags repeated (``<tool_call>\\n{...}\\n</tool_call>`` joined by
newlines); a trigger that the tokenizer has as a special token (``[TOOL_CALLS]``) is taken
as that token. A model that thinks first gets these constraints after its thinking
(``</think>``), and ``response_format`` too. With ``auto``, ``response_format`` shapes the
answer when there is no call (the output is one or the other); with ``required`` or a
named function it is ignored, as OpenAI does (a call has no content).
``constrain=False`` keeps only the parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferrolm.errors import InvalidInputError
from ferrolm.tools.definitions import FunctionTool, ToolChoice, all_strict, callable_tools, schema_parts
from ferrolm.tools.formats import ToolCallFormat
from ferrolm.tools.output import ChatOutputParser
from ferrolm.tools.reasoning import ReasoningFormat

# the SamplingParams fields that name a constraint's compile errors (the engine's parts
# at fault: a schema's pattern is a "regex", any size limit the "grammar")
_CONSTRAINT_FIELDS = ("json_schema", "regex", "grammar")


@dataclass(slots=True)
class ChatPlan:
    prompt: str  # the rendered prompt, with what the plan adds
    tool_format: ToolCallFormat | None  # the parser for calls; None: no calls to parse
    reasoning: ReasoningFormat | None
    primed: bool = False  # the prompt ends with the format's opening: the output is the call
    parallel: bool = True
    constraint: dict[str, Any] = field(default_factory=dict)  # SamplingParams keyword arguments
    field_names: dict[str, str] = field(default_factory=dict)  # SamplingParams field -> request field
    skip_special_tokens: bool | None = None  # False where the markers to parse are special tokens

    @property
    def parses(self) -> bool:
        """Whether outputs are read with ``output_parser`` (else they are plain text)."""
        return self.tool_format is not None or self.reasoning is not None

    def output_parser(self) -> ChatOutputParser:
        return ChatOutputParser(tool_format=self.tool_format, primed=self.primed, parallel=self.parallel,
                                reasoning=self.reasoning, prompt=self.prompt)


def plan_chat(
    prompt: str,
    *,
    tools: list[FunctionTool],
    choice: ToolChoice,
    parallel: bool = True,
    tool_format: ToolCallFormat | None,
    reasoning: ReasoningFormat | None = None,
    constrain: bool = True,
    structured: dict[str, Any] | None = None,
    structured_names: dict[str, str] | None = None,
    special_tokens: frozenset[str] | set[str] = frozenset(),
) -> ChatPlan:
    """``structured``: the request's own constraint (``response_format`` and the like) as
    SamplingParams keyword arguments, and ``structured_names`` the fields they came from.
    ``special_tokens``: the tokenizer's special tokens' texts (the constraint engine keeps
    them out of free text, and detokenizing may drop them). Raises ``InvalidInputError``
    naming the request field at fault."""
    structured = dict(structured or {})
    structured_names = dict(structured_names or {})
    # the tag that ends a thinking part the output is to have; None: no thinking first
    thinking_end = reasoning.end if reasoning is not None and reasoning.thinking_expected(prompt) else None
    reasoning_tags_special = reasoning is not None and (reasoning.start in special_tokens
                                                        or reasoning.end in special_tokens)
    plan = ChatPlan(prompt, None, reasoning, parallel=parallel,
                    skip_special_tokens=False if reasoning_tags_special else None)
    if not tools or choice.mode == "none":
        if structured and thinking_end is not None:
            # a special-token </think> is a trigger too: the engine takes the token itself
            structured["structured_after"] = thinking_end
        plan.constraint, plan.field_names = structured, structured_names
        return plan
    if tool_format is None:
        raise InvalidInputError("tools: the model's chat template shows no tool-call format this server knows; "
                                "start it with --tool-call-parser (hermes, llama3_json or mistral)", "tools")
    if structured and choice.calls_forced:
        # as OpenAI: response_format shapes the message's content, and a forced call has none
        structured, structured_names = {}, {}
    plan.tool_format = tool_format
    if structured:
        return _answer_or_calls(plan, tools, choice, parallel, tool_format, thinking_end, constrain, structured,
                                structured_names, special_tokens)
    trigger = tool_format.trigger
    if trigger is not None and trigger in special_tokens:
        # a special token: the engine lets free text write it (as the token), and the
        # parser must see it in the text
        plan.skip_special_tokens = False
    tool_constraint: dict[str, Any] = {}
    written = ""  # what the output's first call opens with that is already written
    if choice.calls_forced and thinking_end is None:
        # the output starts inside the call (even unconstrained: the model is told to call)
        plan.prompt += tool_format.opening
        plan.primed = True
        written = tool_format.opening
    elif trigger is not None:
        after: str | list[str] = trigger if thinking_end is None else [thinking_end, trigger]
        tool_constraint = {"structured_after": after, "structured_optional": choice.mode == "auto"}
        written = trigger
    else:
        return plan  # parsed only: no trigger that free text under a grammar can write
    if not constrain:
        return plan
    allowed = callable_tools(tools, choice)
    if parallel and tool_format.tags is not None and choice.function is None:
        # one or more calls, each between the format's tags (parallel_tool_calls false, or
        # a named function, which is called once as vLLM does: the single call's JSON)
        begun = written if tool_format.tags["begin"].startswith(written) else ""
        tool_constraint["structured_tags"] = {**tool_format.tags, "begun": begun}
    tool_constraint["json_schema"] = tool_format.body_schema(allowed, parallel)
    tool_constraint["json_schema_parts"] = schema_parts(allowed)
    if all_strict(allowed):
        tool_constraint["json_schema_strict"] = True
    plan.constraint = tool_constraint
    plan.field_names = {name: "tools" for name in _CONSTRAINT_FIELDS}
    return plan


def _answer_or_calls(plan: ChatPlan, tools: list[FunctionTool], choice: ToolChoice, parallel: bool,
                     tool_format: ToolCallFormat, thinking_end: str | None, constrain: bool,
                     structured: dict[str, Any], structured_names: dict[str, str],
                     special_tokens: frozenset[str] | set[str]) -> ChatPlan:
    """``tool_choice`` ``auto`` with ``response_format``: the output (after any thinking)
    is an answer in the format, or the calls, each from its first character on. Where the
    calls do not open with text of their own (Llama 3's may be bare JSON; a marker that is
    a special token), the two cannot be told apart: a 400 naming the format's field."""
    field_name = next(iter(structured_names.values()), "response_format")
    tags = tool_format.answer_or_calls_tags(parallel)
    if tags is None or (tool_format.trigger is not None and tool_format.trigger in special_tokens):
        raise InvalidInputError(f"{field_name}: with tools and tool_choice auto, {tool_format.name} calls cannot be "
                                "told apart from an answer in this format; use tool_choice none or required",
                                field_name)
    if not constrain:
        raise InvalidInputError(f"{field_name}: with tools and tool_choice auto it needs the tool-call "
                                "constraint, which this server turns off", field_name)
    allowed = callable_tools(tools, choice)
    constraint: dict[str, Any] = {"json_schema": tool_format.body_schema(allowed, parallel),
                                  "json_schema_parts": schema_parts(allowed), "structured_tags": tags,
                                  "structured_or": structured}
    if all_strict(allowed):
        constraint["json_schema_strict"] = True
    if thinking_end is not None:
        constraint["structured_after"] = thinking_end
    plan.constraint = constraint
    plan.field_names = {**{name: "tools" for name in _CONSTRAINT_FIELDS}, "structured_or": field_name}
    return plan
