"""``SamplingParams``: what a caller may ask of one generation, checked for types by the
request core (``_core.check_sampling``), for ranges by the engine core at submit, and its
structured-output fields by the request core (``_core.check_constraint``), each refusal
naming the field at fault."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ferrolm import _core


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    n: int = 1
    allowed_token_ids: list[int] | None = None
    # speculative decoding by lookup for this request (None: as the engine's
    # ``speculative`` says); the tokens are the ones drawn without it
    speculative: bool | None = None
    # vLLM's: once the output has thought this many tokens without closing its reasoning,
    # the core forces the reasoning format's end marker (e.g. "</think>") and the answer
    # follows; no effect where the output does not think (no reasoning format, or a
    # prompt that closed the thinking)
    thinking_token_budget: int | None = None
    # structured output: at most one of these
    regex: str | None = None
    json_schema: dict[str, Any] | str | None = None
    # OpenAI's strict mode: objects whose additionalProperties is absent get only their
    # declared members (by default, as JSON Schema says, any others may follow them)
    json_schema_strict: bool = False
    json_object: bool = False
    choice: list[str] | None = None
    # a grammar in GBNF / EBNF (llama.cpp's notation, which xgrammar also reads): rules
    # `name ::= ...`, the output matching `root`
    ebnf: str | None = None
    # free text until this string, then the structured part (e.g. "</think>"); a list:
    # free text until each in turn (["</think>", "<tool_call>"]: a call after the thinking)
    structured_after: str | list[str] | None = None
    # the structured part may never come: the output may also end in the free text before
    # the (last) trigger (tool_choice "auto": a plain answer or a call)
    structured_optional: bool = False
    # structural tags around the structured part: {"begin": "<tool_call>\n", "end":
    # "\n</tool_call>", "separator": "\n", "begun": "<tool_call>"}, one or more of them
    # (several tool calls in one answer); "begun" is the part of the first "begin" already
    # written (by the prompt, or by the last structured_after trigger)
    structured_tags: dict[str, Any] | None = None
    # or else the whole structured part is this (SamplingParams constraint fields, e.g.
    # {"json_schema": {...}}): tool_choice "auto" with response_format, an answer in the
    # format or the calls (their first characters tell them apart)
    structured_or: dict[str, Any] | None = None
    # the sub-schemas json_schema was assembled from, by the request field each came from
    # ("tools.1.function.parameters"): when json_schema does not compile, the first part
    # that does not compile alone is the field named in the error
    json_schema_parts: dict[str, Any] | None = None
    whitespace: str = "compact"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # each field's type, and what may be combined with what: the request core's rules,
        # the ones a submit applies (one copy, in Rust)
        _core.check_sampling({**self.core_kwargs(), "n": self.n, "thinking_token_budget": self.thinking_token_budget})
        constraint = self.constraint_fields()
        if constraint:
            _core.check_constraint(json.dumps(constraint))

    def constraint_fields(self) -> dict[str, Any]:
        """The structured-output fields that are set, as the request core
        (``_core.ChatCore.prepare``'s ``constraint_json``) takes them."""
        out: dict[str, Any] = {}
        for name in _CONSTRAINT_FIELDS:
            value = getattr(self, name)
            if value not in (None, False) and not (name == "whitespace" and value == "compact"):
                out[name] = value
        return out

    def without_constraint(self) -> SamplingParams:
        """The same parameters with no structured-output field set."""
        return replace(
            self,
            regex=None,
            json_schema=None,
            json_schema_strict=False,
            json_object=False,
            choice=None,
            ebnf=None,
            structured_after=None,
            structured_optional=False,
            structured_tags=None,
            structured_or=None,
            json_schema_parts=None,
            whitespace="compact",
        )

    def core_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``_core.Engine.submit`` (the thinking budget goes as the
        ``thinking`` the request core makes of it: ``Engine``)."""
        kw = asdict(self)
        for name in ("n", "thinking_token_budget", *_CONSTRAINT_FIELDS):
            del kw[name]
        return kw


# the fields that ask for structured output (a grammar), not of the core's submit
_CONSTRAINT_FIELDS = (
    "regex",
    "json_schema",
    "json_schema_strict",
    "json_object",
    "choice",
    "ebnf",
    "structured_after",
    "structured_optional",
    "structured_tags",
    "structured_or",
    "json_schema_parts",
    "whitespace",
)
