"""A small msgpack decoder written from the specification (github.com/msgpack/msgpack,
spec.md), independent of the ``msgpack`` package the publisher encodes with, that keeps
what a typed consumer (a Rust or Go router) sees: whether an integer came as unsigned or
signed and in which width, a float's width, str versus bin. Refuses trailing bytes,
duplicate map keys, non-string map keys and the ext types vLLM never sends."""

from __future__ import annotations

import struct
from typing import Any


class Int(int):
    """An integer with the format it came in: ``positive fixint``, ``uint8``..``uint64``,
    ``negative fixint``, ``int8``..``int64``."""

    fmt: str

    @property
    def unsigned(self) -> bool:
        return self.fmt in ("positive fixint", "uint8", "uint16", "uint32", "uint64")


class Float(float):
    bits: int


def _int(value: int, fmt: str) -> Int:
    i = Int(value)
    i.fmt = fmt
    return i


def decode(data: bytes) -> Any:
    value, end = _decode(data, 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} trailing bytes")
    return value


def _take(data: bytes, pos: int, n: int) -> tuple[bytes, int]:
    if pos + n > len(data):
        raise ValueError("truncated")
    return data[pos : pos + n], pos + n


_UINTS = {0xCC: ("uint8", ">B"), 0xCD: ("uint16", ">H"), 0xCE: ("uint32", ">I"), 0xCF: ("uint64", ">Q")}
_SINTS = {0xD0: ("int8", ">b"), 0xD1: ("int16", ">h"), 0xD2: ("int32", ">i"), 0xD3: ("int64", ">q")}
_LENS = {1: ">B", 2: ">H", 4: ">I"}


def _decode(data: bytes, pos: int) -> tuple[Any, int]:
    raw, pos = _take(data, pos, 1)
    b = raw[0]
    if b <= 0x7F:
        return _int(b, "positive fixint"), pos
    if b >= 0xE0:
        return _int(b - 0x100, "negative fixint"), pos
    if 0x80 <= b <= 0x8F:
        return _map(data, pos, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _array(data, pos, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        return _str(data, pos, b & 0x1F)
    if b == 0xC0:
        return None, pos
    if b in (0xC2, 0xC3):
        return b == 0xC3, pos
    if b in _UINTS or b in _SINTS:
        fmt, code = _UINTS.get(b) or _SINTS[b]
        chunk, pos = _take(data, pos, struct.calcsize(code))
        return _int(struct.unpack(code, chunk)[0], fmt), pos
    if b in (0xCA, 0xCB):
        code = ">f" if b == 0xCA else ">d"
        chunk, pos = _take(data, pos, struct.calcsize(code))
        f = Float(struct.unpack(code, chunk)[0])
        f.bits = 32 if b == 0xCA else 64
        return f, pos
    for first, kind in ((0xD9, "str"), (0xC4, "bin"), (0xDC, "array"), (0xDE, "map")):
        widths = (1, 2, 4) if kind in ("str", "bin") else (2, 4)
        for i, width in enumerate(widths):
            if b == first + i:
                chunk, pos = _take(data, pos, width)
                n = struct.unpack(_LENS[width], chunk)[0]
                if kind == "str":
                    return _str(data, pos, n)
                if kind == "bin":
                    return _take(data, pos, n)
                return (_array if kind == "array" else _map)(data, pos, n)
    raise ValueError(f"format byte 0x{b:02x} is not one vLLM's stream uses (ext, or reserved)")


def _str(data: bytes, pos: int, n: int) -> tuple[str, int]:
    chunk, pos = _take(data, pos, n)
    return chunk.decode("utf-8"), pos


def _array(data: bytes, pos: int, n: int) -> tuple[list[Any], int]:
    items = []
    for _ in range(n):
        item, pos = _decode(data, pos)
        items.append(item)
    return items, pos


def _map(data: bytes, pos: int, n: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    for _ in range(n):
        key, pos = _decode(data, pos)
        if not isinstance(key, str):
            raise ValueError(f"map key {key!r} is not a string")
        if key in out:
            raise ValueError(f"duplicate map key {key!r}")
        out[key], pos = _decode(data, pos)
    return out, pos
