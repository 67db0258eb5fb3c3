"""ferrolm: an LLM serving runtime for Python whose hot paths run in Rust."""

from ferrolm import errors, kv_events
from ferrolm._core import __version__
from ferrolm.radix_cache import RadixCache, RustRadixCache
from ferrolm.radix_py import PyRadixCache

__all__ = ["PyRadixCache", "RadixCache", "RustRadixCache", "__version__", "errors", "kv_events"]
