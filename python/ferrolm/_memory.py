"""Freed memory handed back to the operating system."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's; musl and others lack it
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_heap() -> None:
    """Returns the free pages inside the C heaps to the OS (glibc's ``malloc_trim``).

    Loading a model frees much more than it keeps: a GGUF's parsed metadata (a numpy
    object per vocabulary entry, some 150 MB for a 49k-token vocabulary), staging copies of
    tensors, the tokenizer's JSON. glibc keeps such memory resident in its heaps, where
    later allocations can reuse it; where nothing will, ``malloc_trim`` gives it back. A
    no-op where the C library has no such call."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
