"""Exceptions raised by ferrolm.

Every error the Rust core reports arrives as one of these classes (the binding converts
them in one place, ``crates/ferrolm-py/src/errors.rs``). Each also derives from the
built-in class a caller would naturally catch (``ValueError`` for bad arguments, and so on).
"""

from __future__ import annotations


class FerrolmError(Exception):
    """Base class of every ferrolm error."""


class InvalidInputError(FerrolmError, ValueError):
    """An argument is malformed or out of range; the message names it, and ``field``
    does too where the core knows it (``None`` otherwise)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class LoraNotFoundError(FerrolmError, LookupError):
    """A request names a LoRA adapter that is not loaded (``load_lora_adapter`` it first)."""


class StaleHandleError(FerrolmError, LookupError):
    """A node handle refers to a node that no longer exists (evicted, or the tree was reset).

    Handles are never recycled, so a stale handle never silently points at another node.
    """


class NotLockedError(FerrolmError, ValueError):
    """``unlock`` of a node that holds no lock taken on it (more unlocks than locks)."""


class ProtocolError(FerrolmError, RuntimeError):
    """The engine's step protocol was broken: ``commit`` without ``schedule``, ``schedule``
    twice, or logits of the wrong shape."""


class InvariantViolation(FerrolmError, AssertionError):
    """An integrity check found the structure inconsistent (a bug in ferrolm)."""


class CorePanicError(FerrolmError, RuntimeError):
    """The Rust core hit an internal error.

    The object it happened in refuses every later call: state left half-changed is never
    reused. Create a new one.
    """


__all__ = [
    "CorePanicError",
    "FerrolmError",
    "InvalidInputError",
    "InvariantViolation",
    "LoraNotFoundError",
    "NotLockedError",
    "ProtocolError",
    "StaleHandleError",
]
