"""Argument checks shared by the pure-Python code: the same rules and messages as the
Rust binding's ``convert.rs``, so both tree backends reject the same inputs alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ferrolm.errors import InvalidInputError

U32_MAX = 2**32 - 1
I32_MAX = 2**31 - 1


def as_ids(obj: Any, what: str, max_value: int = U32_MAX) -> list[int]:
    """``obj`` as a list of ints in ``0..=max_value``; ``what`` names it in errors."""
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1:
            raise InvalidInputError(f"{what} must be a 1-D array, got shape {list(obj.shape)}", what)
        if obj.dtype.kind not in "iu":
            raise InvalidInputError(f"{what} must be an integer array, got dtype {obj.dtype}", what)
        values = obj.tolist()
    elif isinstance(obj, (str, bytes)):
        raise InvalidInputError(f"{what} must be a sequence of integers, not a string", what)
    elif not isinstance(obj, (list, tuple)) and (
        isinstance(obj, dict) or not (isinstance(obj, Sequence) or hasattr(type(obj), "__getitem__"))
    ):
        # what the binding takes as a sequence (PySequence): not sets, dicts, iterators
        raise InvalidInputError(
            f"{what} must be a 1-D numpy integer array or a sequence of ints, got {type(obj).__name__}", what
        )
    else:
        try:
            values = [_as_int(v) for v in obj]
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"{what} must be a 1-D numpy integer array or a sequence of ints, got {type(obj).__name__}", what
            ) from None
    for i, v in enumerate(values):
        if v < 0 or v > max_value:
            raise InvalidInputError(f"{what}[{i}] is {v}; values must be in 0..={max_value}", what)
    return values


def _as_int(v: Any) -> int:
    if isinstance(v, (int, np.integer)):
        return int(v)
    raise TypeError


def as_count(obj: Any, what: str) -> int:
    if not isinstance(obj, (int, np.integer)):
        raise InvalidInputError(f"{what} must be an int, got {type(obj).__name__}", what)
    if obj < 0:
        raise InvalidInputError(f"{what} must be >= 0, got {obj}", what)
    return int(obj)


def as_handle(obj: Any) -> int:
    if not isinstance(obj, (int, np.integer)) or obj < 0:
        raise InvalidInputError(
            f"node must be a handle from match_prefix (a non-negative int), got {type(obj).__name__}", "node"
        )
    return int(obj)


def as_int_in_range(obj: Any, what: str, lo: int, hi: int) -> int:
    """An int in ``lo..=hi``; anything else is an ``InvalidInputError`` naming ``what``."""
    if not isinstance(obj, (int, np.integer)):
        raise InvalidInputError(f"{what} must be an int in {lo}..={hi}, got {type(obj).__name__}", what)
    if not lo <= obj <= hi:
        raise InvalidInputError(f"{what} must be in {lo}..={hi}, got {obj}", what)
    return int(obj)


def as_namespace(obj: Any) -> None:
    if obj is not None and not isinstance(obj, str):
        raise InvalidInputError(f"namespace must be a str, got {type(obj).__name__}", "namespace")
