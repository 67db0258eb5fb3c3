"""ferrolm: an LLM serving runtime for Python whose hot paths run in Rust."""

from typing import Any

from ferrolm import errors, kv_events
from ferrolm._core import __version__
from ferrolm.radix_cache import RadixCache, RustRadixCache
from ferrolm.radix_py import PyRadixCache
from ferrolm.sampling_params import SamplingParams

__all__ = [
    "Engine",
    "PyRadixCache",
    "RadixCache",
    "RustRadixCache",
    "SamplingParams",
    "__version__",
    "errors",
    "kv_events",
]


def __getattr__(name: str) -> Any:
    # the engine pulls in the model stack (safetensors, tokenizers): load it on first use
    if name == "Engine":
        from ferrolm.engine import Engine

        return Engine
    raise AttributeError(f"module 'ferrolm' has no attribute {name!r}")
