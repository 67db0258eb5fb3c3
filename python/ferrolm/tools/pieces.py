"""What parsing a chat output yields, piece by piece as the text arrives: reasoning text,
content text, the start of a tool call (its id and name) and fragments of its
arguments. A streamed response sends the pieces as they come; a whole response is the
same pieces put together (``MessageBuilder``), so both always say the same."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

REASONING, CONTENT, CALL, ARGUMENTS = "reasoning", "content", "call", "arguments"


@dataclass(slots=True)
class Piece:
    """``kind`` is reasoning or content (``text``), call (``text`` is the function's name,
    ``call_id`` its id) or arguments (``text`` a fragment); ``index`` is the call's place
    among the message's calls."""

    kind: str
    text: str
    index: int = 0
    call_id: str = ""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Sink:
    """Where a tool-call parser writes its pieces. With ``parallel`` off only the first
    call is kept (OpenAI's ``parallel_tool_calls: false`` promises at most one); the
    others are dropped whole."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.pieces: list[Piece] = []
        self.num_calls = 0
        self.num_dropped = 0

    def content(self, text: str) -> None:
        if text:
            self.pieces.append(Piece(CONTENT, text))

    def start_call(self, name: str) -> int | None:
        """Announces a call; its index, or None when it is dropped."""
        if not self.parallel and self.num_calls >= 1:
            self.num_dropped += 1
            return None
        index = self.num_calls
        self.num_calls += 1
        self.pieces.append(Piece(CALL, name, index, new_call_id()))
        return index

    def arguments(self, index: int | None, text: str) -> None:
        if index is not None and text:
            self.pieces.append(Piece(ARGUMENTS, text, index))

    def take(self) -> list[Piece]:
        out, self.pieces = self.pieces, []
        return out


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class MessageBuilder:
    """The pieces of one output put together."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if p.kind == REASONING:
                self.reasoning += p.text
            elif p.kind == CONTENT:
                self.content += p.text
            elif p.kind == CALL:
                self.calls.append(ToolCall(p.call_id, p.text))
            else:
                self.calls[p.index].arguments += p.text
