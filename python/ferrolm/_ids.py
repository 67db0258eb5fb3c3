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
            raise InvalidInputError(f"{what} must be a 1-D array, got shape {list(obj.shape)}")
        if obj.dtype.kind not in "iu":
            raise InvalidInputError(f"{what} must be an integer array, got dtype {obj.dtype}")
        values = obj.tolist()
    elif isinstance(obj, (str, bytes)):
        raise InvalidInputError(f"{what} must be a sequence of integers, not a string")
    elif not isinstance(obj, (list, tuple)) and (
        isinstance(obj, dict) or not (isinstance(obj, Sequence) or hasattr(type(obj), "__getitem__"))
    ):
        # what the binding takes as a sequence (PySequence): not sets, dicts, iterators
        raise InvalidInputError(
            f"{what} must be a 1-D numpy integer array or a sequence of ints, "
            f"got {type(obj).__name__}"
        )
    else:
        try:
            values = [_as_int(v) for v in obj]
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"{what} must be a 1-D numpy integer array or a sequence of ints, "
                f"got {type(obj).__name__}"
            ) from None
    for i, v in enumerate(values):
        if v < 0 or v > max_value:
            raise InvalidInputError(f"{what}[{i}] is {v}; values must be in 0..={max_value}")
    return values


def _as_int(v: Any) -> int:
    if isinstance(v, (int, np.integer)):
        return int(v)
    raise TypeError


def as_count(obj: Any, what: str) -> int:
    if not isinstance(obj, (int, np.integer)):
        raise InvalidInputError(f"{what} must be an int, got {type(obj).__name__}")
    if obj < 0:
        raise InvalidInputError(f"{what} must be >= 0, got {obj}")
    return int(obj)


def as_handle(obj: Any) -> int:
    if not isinstance(obj, (int, np.integer)) or obj < 0:
        raise InvalidInputError(
            f"node must be a handle from match_prefix (a non-negative int), got {type(obj).__name__}"
        )
    return int(obj)
