"""One tool call written as a JSON object, ``{"name": "f", "arguments": {...}}``, read as
it is generated.

Once the name and then the arguments key have come (the order in which the families'
models write them, and the order the constrained output always has) the call is
announced and its arguments stream as the raw text the model writes, so the fragments
put together are exactly the arguments of the whole response. An object that starts
otherwise is kept until it is complete and then read whole: a call if it has a name and
arguments, else content (a JSON answer that is not a call stays text)."""

from __future__ import annotations

import json
from typing import Any

from ferrolm.tools.pieces import Sink

_WS = " \t\n\r"
_HEADER, _ARGUMENTS, _TAIL, _WHOLE = "header", "arguments", "tail", "whole"
_MORE, _NO = "more", "no"


class CallScanner:
    """Feed it the object's text (leading whitespace allowed); it stops taking text once
    the object is complete (``feed`` returns how much it took). ``close`` settles an
    object read whole, or one cut short."""

    def __init__(self, sink: Sink, arguments_keys: tuple[str, ...] = ("arguments",)) -> None:
        self.sink = sink
        self.keys = arguments_keys
        self.raw = ""  # everything taken
        self.mode = _HEADER
        self.index: int | None = None  # the call's, once announced (None: dropped)
        self.announced = False
        self.complete = False
        self.closed = False
        self.object = _Lexer()  # over the whole object: where it ends
        self.started = False
        # the arguments value, once the header is found: where it starts and ends in raw
        self.args = _Lexer()
        self.args_start = 0
        self.args_scanned = 0
        self.args_end: int | None = None
        self.sent = 0  # of raw: arguments text already written to the sink

    def feed(self, text: str) -> int:
        if self.complete or self.closed:
            return 0
        taken = len(text)
        for i, c in enumerate(text):
            if not self.started:
                if c in _WS:
                    continue
                self.started = True
                if c != "{":
                    self.mode = _WHOLE  # not an object: kept, and settled by close()
            self.object.step(c)
            if self.mode != _WHOLE and self.object.depth == 0 and not self.object.in_string:
                taken = i + 1
                self.complete = True
                break
        self.raw += text[:taken]
        if self.mode == _HEADER:
            self._try_header()
        if self.mode == _ARGUMENTS:
            self._scan_arguments()
        if self.complete:
            self._settle()
        return taken

    def close(self) -> None:
        """The call's text has ended (its closing tag came, or the output ended)."""
        if not self.closed:
            self._settle()

    def _try_header(self) -> None:
        found = match_header(self.raw, self.keys)
        if isinstance(found, str):
            if found == _NO:
                self.mode = _WHOLE
            return
        name, start = found
        self.index = self.sink.start_call(name)
        self.announced = True
        self.mode = _ARGUMENTS
        self.args_start = self.args_scanned = self.sent = start

    def _scan_arguments(self) -> None:
        """Finds where the arguments value ends, in what came since the last feed, and
        sends the part of it not sent yet."""
        first = self.raw[self.args_start]
        for j in range(self.args_scanned, len(self.raw)):
            c = self.raw[j]
            if first not in '{["':  # a number or literal: ends before a delimiter
                if c in ",}" + _WS:
                    self.args_end = j
                    break
                continue
            was_in_string = self.args.in_string
            self.args.step(c)
            if (first == '"' and was_in_string and not self.args.in_string) or (
                    first in "{[" and self.args.depth == 0 and not self.args.in_string):
                self.args_end = j + 1
                break
        self.args_scanned = len(self.raw)
        end = len(self.raw) if self.args_end is None else self.args_end
        if end > self.sent:
            self.sink.arguments(self.index, self.raw[self.sent:end])
            self.sent = end
        if self.args_end is not None:
            self.mode = _TAIL

    def _settle(self) -> None:
        self.closed = True
        if self.announced:
            return  # streamed: what came is the call
        if not self.raw.strip():
            return
        call = read_call(self.raw, self.keys)
        if call is None:
            self.sink.content(self.raw)
            return
        name, arguments = call
        index = self.sink.start_call(name)
        self.sink.arguments(index, arguments)


class _Lexer:
    """Just enough of JSON's lexing to follow nesting: strings (with escapes) and brackets."""

    __slots__ = ("depth", "in_string", "escape")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False

    def step(self, c: str) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1


def match_header(raw: str, keys: tuple[str, ...]) -> tuple[str, int] | str:
    """Whether ``raw`` begins ``{"name": "<name>", "<key>": <value...>`` (JSON whitespace
    anywhere between): ``(name, where the value starts)``; ``"more"`` if it may still;
    ``"no"`` if it cannot."""
    n = len(raw)
    pos = 0

    def ws(p: int) -> int:
        while p < n and raw[p] in _WS:
            p += 1
        return p

    def literal(p: int, lit: str) -> int | str:
        rest = raw[p:p + len(lit)]
        if rest == lit:
            return p + len(lit)
        return _MORE if lit.startswith(rest) else _NO

    for step in ("{", '"name"', ":"):
        pos = ws(pos)
        got = literal(pos, step)
        if isinstance(got, str):
            return got
        pos = got
    pos = ws(pos)
    if pos == n:
        return _MORE
    if raw[pos] != '"':
        return _NO
    j, escape = pos + 1, False
    while j < n:
        c = raw[j]
        if escape:
            escape = False
        elif c == "\\":
            escape = True
        elif c == '"':
            break
        j += 1
    if j >= n:
        return _MORE
    try:
        name = json.loads(raw[pos:j + 1])
    except ValueError:
        return _NO
    pos = ws(j + 1)
    got = literal(pos, ",")
    if isinstance(got, str):
        return got
    pos = ws(got)
    matches = [literal(pos, f'"{key}"') for key in keys]
    ends = [m for m in matches if isinstance(m, int)]
    if not ends:
        return _MORE if _MORE in matches else _NO
    pos = ws(ends[0])
    got = literal(pos, ":")
    if isinstance(got, str):
        return got
    pos = ws(got)
    if pos == n:
        return _MORE  # the value's first character decides how it ends
    return name, pos


def read_call(text: str, keys: tuple[str, ...]) -> tuple[str, str] | None:
    """A whole call object's name and arguments (as JSON text), or None if it is not one."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    for key in keys:
        if key in value:
            arguments = value[key]
            # some models write the arguments as a JSON string: kept as the text it is
            if isinstance(arguments, str):
                return value["name"], arguments
            return value["name"], json.dumps(arguments, ensure_ascii=False)
    return None
