"""What a chat request with tools (or a reasoning model) changes about its generation: the
text added to the prompt, the grammar the output is generated under, and the parser its
output is read with. Shared by the HTTP API and ``Engine.chat``.

Calls that always parse: with ``tool_choice`` ``required`` or a named function the prompt
ends with the format's opening (``<tool_call>\\n``) and the whole output is generated
under the JSON Schema of the call(s), built from the functions' schemas. With ``auto`` the
model writes freely, and may end so, until the format's trigger appears; from there the
call is constrained the same way (the engine's trigger segments, with an optional
trigger). A model that thinks first gets these constraints after its thinking
(``</think>``), and ``response_format`` too. ``constrain=False`` keeps only the parser."""

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
            if reasoning_tags_special:
                field_name = next(iter(structured_names.values()), "response_format")
                raise InvalidInputError(f"{field_name}: cannot constrain the answer after the thinking: the "
                                        f"tokenizer has {thinking_end!r} as a special token", field_name)
            structured["structured_after"] = thinking_end
        plan.constraint, plan.field_names = structured, structured_names
        return plan
    if tool_format is None:
        raise InvalidInputError("tools: the model's chat template shows no tool-call format this server knows; "
                                "start it with --tool-call-parser (hermes, llama3_json or mistral)", "tools")
    if structured:
        field_name = next(iter(structured_names.values()), "response_format")
        raise InvalidInputError(f'{field_name}: cannot be combined with tools unless tool_choice is "none"',
                                field_name)
    plan.tool_format = tool_format
    trigger = tool_format.trigger if tool_format.trigger not in special_tokens else None
    if trigger is None and tool_format.trigger is not None and choice.mode == "auto":
        plan.skip_special_tokens = False  # the parser must see the marker in the text
    tool_constraint: dict[str, Any] = {}
    if choice.calls_forced and thinking_end is None:
        # the output starts inside the call (even unconstrained: the model is told to call)
        plan.prompt += tool_format.opening
        plan.primed = True
    elif trigger is not None and not (thinking_end is not None and reasoning_tags_special):
        after: str | list[str] = trigger if thinking_end is None else [thinking_end, trigger]
        tool_constraint = {"structured_after": after, "structured_optional": choice.mode == "auto"}
    else:
        return plan  # parsed only: no trigger that free text under a grammar can write
    if not constrain:
        return plan
    allowed = callable_tools(tools, choice)
    tool_constraint["json_schema"] = tool_format.body_schema(allowed, parallel)
    tool_constraint["json_schema_parts"] = schema_parts(allowed)
    if all_strict(allowed):
        tool_constraint["json_schema_strict"] = True
    plan.constraint = tool_constraint
    plan.field_names = {name: "tools" for name in _CONSTRAINT_FIELDS}
    return plan
