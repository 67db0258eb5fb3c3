"""``SamplingParams``: what a caller may ask of one generation, checked for types here and
for ranges by the Rust core (which names the field at fault)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ferrolm.errors import InvalidInputError


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    n: int = 1
    allowed_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "top_logprobs", "n"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"{name} must be a non-negative int, got {value!r}", name)
        if self.n < 1:
            raise InvalidInputError(f"n must be at least 1, got {self.n}", "n")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise InvalidInputError(f"{name} must be a number, got {value!r}", name)
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            raise InvalidInputError(f"seed must be an int in [0, 2**64), got {self.seed!r}", "seed")

    def core_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``_core.Engine.submit``."""
        kw = asdict(self)
        del kw["n"]
        return kw
