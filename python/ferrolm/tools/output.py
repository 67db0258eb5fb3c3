"""One chat output read as it streams: the thinking split off (``reasoning.py``), then tool
calls parsed out of the answer (``formats.py``), as ``Piece``s. With neither parser the
answer passes through untouched; with one, the reasoning and the content lose their
leading and trailing whitespace (the newlines around tags and between calls), streamed
and whole alike."""

from __future__ import annotations

from ferrolm.tools.formats import ToolCallFormat
from ferrolm.tools.pieces import CONTENT, REASONING, Piece, Sink
from ferrolm.tools.reasoning import ReasoningFormat

_WS = " \t\n\r"


class _Trimmed:
    """Text without its leading and trailing whitespace, as it streams: leading whitespace
    is dropped, trailing whitespace held until more text follows it."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip(_WS)
            if not text:
                return ""
            self.started = True
        body = text.rstrip(_WS)
        if not body:
            self.held += text
            return ""
        out = self.held + body
        self.held = text[len(body):]
        return out


class ChatOutputParser:
    """``feed`` each new piece of text, then ``finish``; each returns the pieces that are
    certain by then (text that may still be the start of a tag is held back)."""

    def __init__(self, *, tool_format: ToolCallFormat | None = None, primed: bool = False, parallel: bool = True,
                 reasoning: ReasoningFormat | None = None, prompt: str = "") -> None:
        self.thinking = reasoning.stream(prompt) if reasoning is not None else None
        self.tools = tool_format.stream(Sink(parallel), primed=primed) if tool_format is not None else None
        self.trim = self.thinking is not None or self.tools is not None
        self.reasoning_text = _Trimmed()
        self.content_text = _Trimmed()

    def feed(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.thinking is None:
            return self._answer(text)
        return self._route(self.thinking.feed(text))

    def finish(self) -> list[Piece]:
        pieces = self._route(self.thinking.finish()) if self.thinking is not None else []
        if self.tools is not None:
            pieces += self._trim_content(self.tools.finish())
        return pieces

    def _route(self, parts: list[tuple[str, str]]) -> list[Piece]:
        out: list[Piece] = []
        for kind, text in parts:
            if kind == "reasoning":
                kept = self.reasoning_text.feed(text)
                if kept:
                    out.append(Piece(REASONING, kept))
            elif kind == "content":
                out += self._answer(text)
        return out

    def _answer(self, text: str) -> list[Piece]:
        if self.tools is not None:
            return self._trim_content(self.tools.feed(text))
        if not self.trim:
            return [Piece(CONTENT, text)]
        kept = self.content_text.feed(text)
        return [Piece(CONTENT, kept)] if kept else []

    def _trim_content(self, pieces: list[Piece]) -> list[Piece]:
        out = []
        for p in pieces:
            if p.kind == CONTENT:
                p.text = self.content_text.feed(p.text)
                if not p.text:
                    continue
            out.append(p)
        return out
