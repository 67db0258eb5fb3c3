"""``ferrolm.Engine``: offline generation. The step loop (``Engine.step``) is the whole
engine in Python: the Rust core schedules and commits, the runner computes logits.

    engine = ferrolm.Engine("tiny")
    [result] = engine.generate(["Hello"], ferrolm.SamplingParams(max_new_tokens=8))
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model import ForwardBatch, ModelRunner, NumpyRunner, load_model
from ferrolm.sampling_params import SamplingParams

Prompt = str | Sequence[int] | np.ndarray


@dataclass(slots=True)
class Delta:
    """What one request produced in one step."""

    rid: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    matched_stop: str | int | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class GenerationResult:
    rid: int
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    error: str | None = None
    cached_tokens: int = 0

    def add(self, d: Delta) -> None:
        self.token_ids += d.token_ids
        self.text += d.text
        self.logprobs += d.logprobs
        self.top_logprobs += d.top_logprobs
        if d.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = d.finish_reason, d.matched_stop, d.error
            self.cached_tokens = d.cached_tokens


def deltas_of(out: _core.StepOutputs) -> list[Delta]:
    """Columnar step outputs as one ``Delta`` per request."""
    offsets, ids = out.token_offsets.tolist(), out.token_ids.tolist()
    logprobs, top_offsets = out.logprobs.tolist(), out.top_offsets.tolist()
    top_ids, top_lps = out.top_ids.tolist(), out.top_logprobs.tolist()
    deltas = []
    for i, (rid, text, fin) in enumerate(zip(out.rids.tolist(), out.texts, out.finished)):
        a, b = offsets[i], offsets[i + 1]
        top = [list(zip(top_ids[top_offsets[j] : top_offsets[j + 1]], top_lps[top_offsets[j] : top_offsets[j + 1]]))
               for j in range(a, b)]
        d = Delta(rid, ids[a:b], text, logprobs[a:b], top)
        if fin is not None:
            d.finish_reason, d.matched_stop, d.error, d.prompt_tokens, d.cached_tokens, d.completion_tokens = fin
        deltas.append(d)
    return deltas


class Engine:
    """A model, its tokenizer, a runner with a paged KV pool, and the Rust engine core."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        kv_capacity: int = 32_768,
        max_running_requests: int = 64,
        max_prefill_tokens: int = 2048,
        schedule_policy: str = "fcfs",
        enable_prefix_cache: bool = True,
        eviction_policy: str = "lru",
        seed: int = 0,
        runner: ModelRunner | None = None,
    ) -> None:
        self.config, weights, self.tokenizer = load_model(model)
        self.runner = runner or NumpyRunner(self.config, weights, kv_capacity)
        self.core = _core.Engine(
            self.tokenizer.token_bytes(),
            special_token_ids=self.tokenizer.special_token_ids,
            eos_token_ids=list(self.config.eos_token_ids),
            kv_capacity=kv_capacity,
            max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens,
            schedule_policy=schedule_policy,
            enable_prefix_cache=enable_prefix_cache,
            eviction_policy=eviction_policy,
            max_context=self.config.max_position_embeddings,
            seed=seed,
        )
        self._rids = itertools.count()

    # ---- the loop ----

    def step(self) -> list[Delta]:
        """One engine step: schedule, forward, commit."""
        plan = self.core.schedule()
        if len(plan) == 0:
            return deltas_of(self.core.take_outputs())
        try:
            logits = self.runner.forward(ForwardBatch.from_plan(plan))
        except BaseException:
            # the core still waits for this step's commit: end its requests cleanly
            self.core.commit(np.zeros((len(plan), self.core.vocab_size), np.float32))
            self.core.abort_all()
            raise
        return deltas_of(self.core.commit(logits))

    def has_work(self) -> bool:
        return self.core.has_work()

    # ---- requests ----

    def encode(self, prompt: Prompt) -> np.ndarray:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInputError("prompt: the prompt is empty", "prompt")
            return self.tokenizer.encode(prompt)
        return np.asarray(prompt)

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, **core_kw: Any) -> int:
        """Queues one sample of ``prompt`` (``params.n`` is for ``generate``); returns its rid.
        ``core_kw``: further ``_core.Engine.submit`` arguments (priority, namespace, ...)."""
        params = params or SamplingParams()
        rid = next(self._rids)
        self.core.submit(rid, self.encode(prompt), **params.core_kwargs(), **core_kw)
        return rid

    def abort(self, rid: int) -> bool:
        return self.core.abort(rid)

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None
    ) -> list[GenerationResult]:
        """Runs prompts to completion, ``params.n`` samples each, in one batch."""
        params = params or SamplingParams()
        if isinstance(prompts, (str, np.ndarray)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        results: dict[int, GenerationResult] = {}
        first_samples = []
        for prompt in prompts:  # type: ignore[union-attr]
            ids = self.encode(prompt)
            rid = self.submit(ids, params)
            results[rid] = GenerationResult(rid, [int(i) for i in ids])
            first_samples.append((rid, ids))
        pending = list(first_samples) if params.n > 1 else []
        while self.has_work():
            for d in self.step():
                results[d.rid].add(d)
                # the other samples of a prompt start once its first has cached the prefill
                for k, (rid, ids) in enumerate(pending):
                    if rid == d.rid:
                        del pending[k]
                        for j in range(1, params.n):
                            seed = None if params.seed is None else (params.seed + j) % 2**64
                            sib = self.submit(ids, dataclasses.replace(params, seed=seed))
                            results[sib] = GenerationResult(sib, [int(i) for i in ids])
                        break
        return [results[r] for r in sorted(results)]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[Delta]:
        """One sample of ``prompt``, delta by delta (other requests keep running)."""
        rid = self.submit(prompt, params)
        try:
            while True:
                for d in self.step():
                    if d.rid == rid:
                        yield d
                        if d.finish_reason is not None:
                            return
        finally:
            self.core.abort(rid)
