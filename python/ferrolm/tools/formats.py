"""How model families write tool calls, one class each, and how to tell them from a chat
template.

- ``hermes`` (Qwen 2.5 and 3, Hermes, and ferrolm's ``tiny``): ``<tool_call>\\n{"name": "f",
  "arguments": {...}}\\n</tool_call>``, once per call, text allowed around them.
- ``llama3_json`` (Llama 3.1 to 3.3 with JSON tool calling): the whole answer is the call,
  ``{"name": "f", "parameters": {...}}``, optionally after ``<|python_tag|>``; several are
  separated by ``;``.
- ``mistral`` (Mistral's v3 tokenizers): ``[TOOL_CALLS][{"name": "f", "arguments": {...}},
  ...]``, a JSON array of calls after the marker.

Each format says where a call starts in free text (``trigger``, for a constrained
``auto``), what a forced call opens with (``opening``, written into the prompt so that
the whole output is the call's JSON), the JSON Schema of what follows, and parses an
output as it streams (``stream``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferrolm.errors import InvalidInputError
from ferrolm.tools.call_scanner import CallScanner
from ferrolm.tools.definitions import FunctionTool, call_array_schema, call_object_schema
from ferrolm.tools.pieces import Piece, Sink

_WS = " \t\n\r"


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag`` (held back
    from the output until the next text says whether the tag came)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolStream:
    """One output's parse, fed text as it is generated; ``finish`` at the end."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def feed(self, text: str) -> list[Piece]:
        self._feed(text)
        return self.sink.take()

    def finish(self) -> list[Piece]:
        self._finish()
        return self.sink.take()

    def _feed(self, text: str) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError


class ToolCallFormat:
    name = ""
    trigger: str | None = None  # where a call starts in free text
    opening = ""  # what a forced call begins with, given in the prompt
    arguments_keys: tuple[str, ...] = ("arguments",)

    # several calls in one answer: each call's JSON between these (structural tags); None:
    # the body schema holds them all (Mistral's array)
    tags: dict[str, str] | None = None

    def body_schema(self, tools: Sequence[FunctionTool], parallel: bool) -> dict[str, Any]:
        """The JSON Schema of one call (of all of them where ``tags`` is None), what
        follows ``trigger`` (or ``opening``)."""
        return call_object_schema(tools, self.arguments_keys[0])

    def answer_or_calls_tags(self, parallel: bool) -> dict[str, Any] | None:
        """The tags around the calls (opening included) where an answer in a response
        format may come instead; None where the calls' first characters cannot tell them
        from such an answer."""
        return None

    def stream(self, sink: Sink, *, primed: bool) -> ToolStream:
        """A parser of one output; ``primed``: the prompt ended with ``opening``."""
        raise NotImplementedError


# ---- Hermes ----

class HermesFormat(ToolCallFormat):
    name = "hermes"
    trigger = "<tool_call>"
    opening = "<tool_call>\n"
    close = "</tool_call>"
    # as Qwen's chat templates write a turn's calls
    tags = {"begin": "<tool_call>\n", "end": "\n</tool_call>", "separator": "\n"}

    def answer_or_calls_tags(self, parallel: bool) -> dict[str, Any] | None:
        return {**self.tags, "repeated": parallel} if self.tags is not None else None

    def stream(self, sink: Sink, *, primed: bool) -> ToolStream:
        return _HermesStream(sink, primed)


class _HermesStream(ToolStream):
    def __init__(self, sink: Sink, primed: bool) -> None:
        super().__init__(sink)
        self.buf = ""
        self.call: CallScanner | None = CallScanner(sink) if primed else None

    def _feed(self, text: str) -> None:
        self.buf += text
        while True:
            if self.call is None:
                i = self.buf.find(HermesFormat.trigger)
                if i < 0:
                    keep = held_back(self.buf, HermesFormat.trigger)
                    self.sink.content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.sink.content(self.buf[:i])
                self.buf = self.buf[i + len(HermesFormat.trigger):]
                self.call = CallScanner(self.sink)
            else:
                j = self.buf.find(HermesFormat.close)
                if j < 0:
                    keep = held_back(self.buf, HermesFormat.close)
                    self.call.feed(self.buf[:len(self.buf) - keep])  # past the object: whitespace, dropped
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.call.feed(self.buf[:j])
                self.call.close()
                self.buf = self.buf[j + len(HermesFormat.close):]
                self.call = None

    def _finish(self) -> None:
        if self.call is None:
            self.sink.content(self.buf)
        else:
            self.call.feed(self.buf)
            self.call.close()
        self.buf = ""


# ---- Llama 3 JSON ----

class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    # a special token in Llama 3's tokenizer, which the constraint engine allows in free
    # text as the trigger (calls without it are parsed, not constrained, under auto);
    # forced calls are the answer itself
    trigger = "<|python_tag|>"
    opening = ""
    python_tag = "<|python_tag|>"
    arguments_keys = ("parameters", "arguments")
    tags = {"begin": "", "end": "", "separator": "; "}

    def stream(self, sink: Sink, *, primed: bool) -> ToolStream:
        return _Llama3Stream(sink)


class _Llama3Stream(ToolStream):
    """Calls at the start of the answer, or after ``<|python_tag|>`` (where a constrained
    ``auto`` lets them start); text that is not a call is content."""

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self.state = "start"  # start -> calls -> text
        self.buf = ""
        self.call: CallScanner | None = None

    def _feed(self, text: str) -> None:
        self.buf += text
        while self.buf:
            if self.state == "text":
                tag = Llama3JsonFormat.python_tag
                i = self.buf.find(tag)
                if i < 0:
                    keep = held_back(self.buf, tag)
                    self.sink.content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.sink.content(self.buf[:i])
                self.buf = self.buf[i + len(tag):]
                self.state = "calls"
            elif self.state == "start":
                head = self.buf.lstrip(_WS)
                tag = Llama3JsonFormat.python_tag
                if not head or (len(head) < len(tag) and tag.startswith(head)):
                    return  # not decided yet
                if head.startswith(tag):
                    self.buf = head[len(tag):]
                    self.state = "calls"
                elif head.startswith("{"):
                    self.state = "calls"
                else:
                    self.state = "text"
            elif self.call is not None:
                taken = self.call.feed(self.buf)
                self.buf = self.buf[taken:]
                if not self.call.complete:
                    return
                self.call = None
            else:  # between calls
                head = self.buf.lstrip(_WS + ";")
                if not head:
                    return
                if head.startswith("{"):
                    self.buf = head
                    self.call = CallScanner(self.sink, Llama3JsonFormat.arguments_keys)
                else:
                    self.state = "text"

    def _finish(self) -> None:
        if self.call is not None:
            self.call.feed(self.buf)
            self.call.close()
        elif self.state in ("text", "start") or self.buf.strip(_WS + ";"):
            self.sink.content(self.buf)
        self.buf = ""


# ---- Mistral ----

class MistralFormat(ToolCallFormat):
    name = "mistral"
    # a special token in Mistral's tokenizers (see Llama3JsonFormat.trigger): the planner
    # drops the trigger where the tokenizer has it as one
    trigger = "[TOOL_CALLS]"
    opening = "[TOOL_CALLS]"

    def body_schema(self, tools: Sequence[FunctionTool], parallel: bool) -> dict[str, Any]:
        return call_array_schema(tools, self.arguments_keys[0], parallel=parallel)

    def answer_or_calls_tags(self, parallel: bool) -> dict[str, Any] | None:
        return {"begin": "[TOOL_CALLS]", "end": "", "repeated": False}  # the array holds the calls

    def stream(self, sink: Sink, *, primed: bool) -> ToolStream:
        return _MistralStream(sink, primed)


class _MistralStream(ToolStream):
    def __init__(self, sink: Sink, primed: bool) -> None:
        super().__init__(sink)
        self.state = "array" if primed else "text"  # text -> array (calls) -> text
        self.buf = ""
        self.call: CallScanner | None = None

    def _feed(self, text: str) -> None:
        self.buf += text
        while self.buf:
            if self.state == "text":
                i = self.buf.find(MistralFormat.trigger)
                if i < 0:
                    keep = held_back(self.buf, MistralFormat.trigger)
                    self.sink.content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.sink.content(self.buf[:i])
                self.buf = self.buf[i + len(MistralFormat.trigger):]
                self.state = "array"
            elif self.call is not None:
                taken = self.call.feed(self.buf)
                self.buf = self.buf[taken:]
                if not self.call.complete:
                    return
                self.call = None
            else:  # in the array, between calls: "[", ",", "]" and whitespace
                head = self.buf.lstrip(_WS + "[,")
                if not head:
                    self.buf = ""
                    return
                if head.startswith("{"):
                    self.buf = head
                    self.call = CallScanner(self.sink, MistralFormat.arguments_keys)
                else:
                    self.buf = head[1:] if head.startswith("]") else head
                    self.state = "text"

    def _finish(self) -> None:
        if self.call is not None:
            self.call.feed(self.buf)
            self.call.close()
        elif self.state == "text":
            self.sink.content(self.buf)
        self.buf = ""


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (HermesFormat(), Llama3JsonFormat(), MistralFormat())}
# the names other servers use for the same formats
ALIASES = {"qwen25": "hermes", "qwen": "hermes", "qwen3": "hermes", "llama3": "llama3_json", "llama": "llama3_json"}
PARSER_CHOICES = ("auto", "none", *FORMATS, *ALIASES)


def tool_call_format(name: str, chat_template: str | None) -> ToolCallFormat | None:
    """The format ``--tool-call-parser`` names; ``auto``: the one the chat template shows,
    if exactly one does; ``none``: no parsing."""
    if name == "none":
        return None
    if name == "auto":
        return detect_format(chat_template)
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise InvalidInputError(f"tool_call_parser: {name!r} is not one of {', '.join(PARSER_CHOICES)}",
                                "tool_call_parser")
    return FORMATS[name]


def detect_format(chat_template: str | None) -> ToolCallFormat | None:
    """The format whose markers the chat template writes; None when it shows none, or the
    markers of more than one."""
    if not chat_template:
        return None
    found = []
    if "<tool_call>" in chat_template:
        found.append(FORMATS["hermes"])
    if "[TOOL_CALLS]" in chat_template:
        found.append(FORMATS["mistral"])
    if "<|python_tag|>" in chat_template or ("ipython" in chat_template and '"parameters"' in chat_template):
        found.append(FORMATS["llama3_json"])
    return found[0] if len(found) == 1 else None
