"""``ferrolm.Engine``: offline generation. The step loop (``Engine.step``) is the whole
engine in Python: the Rust core schedules and commits, the runner computes logits.

    engine = ferrolm.Engine("tiny")
    [result] = engine.generate(["Hello"], ferrolm.SamplingParams(max_new_tokens=8))
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ferrolm import _core
from ferrolm._memory import release_free_heap
from ferrolm.errors import InvalidInputError, LoraNotFoundError
from ferrolm.kv_events import KvEvent, event_from_raw
from ferrolm.model import LoadedModel, ModelRunner, load_model
from ferrolm.model.gguf_file import is_gguf
from ferrolm.model.lora import parse_lora_module, registry_for
from ferrolm.model.runner_choice import build_runner, resolve_runner_kind
from ferrolm.sampling_params import SamplingParams
from ferrolm.step_loop import StepLoop

Prompt = str | Sequence[int] | np.ndarray

log = logging.getLogger("ferrolm.engine")

# the engine's defaults, as the core defines them (EngineConfig); the server's read them too
DEFAULTS = _core.EngineConfig.defaults()


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
    # with finish_reason "error", why, for programs to match: "queue_timeout",
    # "kv_capacity", "grammar", "step_failed", "sampling" (see _core.StepOutputs)
    error_kind: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class Output:
    """Everything a request's deltas have brought so far."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    error: str | None = None
    error_kind: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, d: Delta) -> None:
        self.token_ids += d.token_ids
        self.text += d.text
        self.logprobs += d.logprobs
        self.top_logprobs += d.top_logprobs
        if d.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = d.finish_reason, d.matched_stop, d.error
            self.error_kind = d.error_kind
            self.prompt_tokens, self.cached_tokens = d.prompt_tokens, d.cached_tokens


@dataclass(slots=True)
class GenerationResult(Output):
    rid: int = -1
    prompt_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ToolCall:
    """A call the model made: the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ChatResult:
    """One sample's answer: ``content`` (None when there are only calls), the thinking
    (with a reasoning parser), the calls, and the raw generation."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # as OpenAI: "tool_calls" when it ended with calls
    text: str = ""  # what the model wrote, unparsed
    token_ids: list[int] = field(default_factory=list)
    prompt: str = ""  # the rendered prompt, with what the tools added


def deltas_of(out: _core.StepOutputs) -> list[Delta]:
    """Columnar step outputs as one ``Delta`` per request."""
    offsets, ids = out.token_offsets.tolist(), out.token_ids.tolist()
    logprobs, top_offsets = out.logprobs.tolist(), out.top_offsets.tolist()
    top_ids, top_lps = out.top_ids.tolist(), out.top_logprobs.tolist()
    deltas = []
    for i, (rid, text, fin) in enumerate(zip(out.rids.tolist(), out.texts, out.finished)):
        a, b = offsets[i], offsets[i + 1]
        top = [
            list(zip(top_ids[top_offsets[j] : top_offsets[j + 1]], top_lps[top_offsets[j] : top_offsets[j + 1]]))
            for j in range(a, b)
        ]
        d = Delta(rid, ids[a:b], text, logprobs[a:b], top)
        if fin is not None:
            (
                d.finish_reason,
                d.matched_stop,
                d.error,
                d.prompt_tokens,
                d.cached_tokens,
                d.completion_tokens,
                d.error_kind,
            ) = fin
        deltas.append(d)
    return deltas


class Engine:
    """A model, its tokenizer, a runner with a paged KV pool, and the Rust engine core.

    Outputs are routed: ``generate`` and ``stream`` take the deltas of their own requests;
    those of requests queued with ``submit`` wait in an outbox and come out of the next
    ``step()``, so nothing is lost whichever way requests were made.
    """

    def __init__(
        self,
        model: str | LoadedModel = "tiny",
        *,
        kv_capacity: int = DEFAULTS.kv_capacity,
        max_running_requests: int = DEFAULTS.max_running_requests,
        max_prefill_tokens: int = DEFAULTS.max_prefill_tokens,
        schedule_policy: str = DEFAULTS.schedule_policy,
        enable_prefix_cache: bool = DEFAULTS.enable_prefix_cache,
        eviction_policy: str = DEFAULTS.eviction_policy,
        seed: int = DEFAULTS.seed,
        runner: ModelRunner | str | None = None,
        blas_threads: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
        device_greedy: bool | None = None,
        mem_fraction_static: float | None = None,
        enable_kv_events: bool = DEFAULTS.enable_kv_events,
        kv_event_block_size: int = DEFAULTS.kv_event_block_size,
        device_sampling: bool | None = None,
        speculative: bool = DEFAULTS.speculative,
        speculative_max_draft: int = DEFAULTS.speculative_max_draft,
        speculative_row_cost: float | None = None,
        enable_lora: bool = False,
        lora_modules: Mapping[str, str] | Sequence[str] | None = None,
        max_loras: int = DEFAULTS.max_loras,
        max_cpu_loras: int | None = None,
        record_trace: str | os.PathLike[str] | None = None,
    ) -> None:
        """``runner``: a ``ModelRunner`` to use, or ``"auto"`` / ``"numpy"`` / ``"torch"``
        (``None`` is ``"auto"``: the torch runner where CUDA is present or a half
        precision ``dtype`` is asked for, else the numpy one), built with ``device``
        (``auto``/``cpu``/``cuda``) and ``dtype`` (``auto``/``bfloat16``/``float16``/
        ``float32``; ``auto`` is the checkpoint's on CUDA, float32 on the CPU; a half
        ``dtype`` on the CPU runs a float checkpoint on the quant runner, its matrices in
        that type, unless ``runner`` says otherwise).
        ``kv_cache_dtype`` (``auto``/``float32``/``float16``/``bfloat16``/``q8_0``): the KV
        pool's element type (``q8_0``, ggml's 8-bit blocks, on the quant runner only); ``auto`` is float16 on the CPU (the core's attention kernel reads
        half the bytes; attention computes in float32) unless ``FERROLM_KV_CACHE_DTYPE``
        says otherwise, and the runner's ``dtype`` on CUDA.
        ``quantization`` (``q8_0``/``q4_k``): run a float checkpoint on the quantized runner
        (``"quant"``, the default for a GGUF file), its matrices quantized at load.
        ``device_greedy``: let a runner that can (the torch runner) pick greedy tokens on
        its device in steps where every sampling request is plain greedy; ``None``: where
        its device is not the CPU.
        ``mem_fraction_static`` (the torch runner on CUDA): size the KV pool so that
        weights and pool take that fraction of the device's memory, instead of
        ``kv_capacity``. ``enable_kv_events``: the prefix cache records vLLM-shaped KV
        events over blocks of ``kv_event_block_size`` tokens (``take_kv_events``; the
        server publishes them, see ``--kv-events-config``). ``device_sampling``: let a
        runner that can (the torch runner) draw every token on its device (penalties, bias,
        grammar masks, seeds and logprobs included; only ids and logprobs reach the host);
        ``None``: where its device is not the CPU (on the CPU the core's sampler reads the
        logits in place, at no copy).
        ``speculative``: speculative decoding by lookup for requests that do not say
        otherwise (``SamplingParams.speculative``): each step drafts up to
        ``speculative_max_draft`` tokens that followed the request's latest suffix earlier
        in its prompt or output, and one forward verifies them; the tokens are the ones
        drawn without it (greedy exactly; seeded alike, up to rounding). A draft is as
        long as its tokens are likely to pay for their rows, a verified row costing
        ``speculative_row_cost`` of a one-token step (``None``: the core's CPU figure,
        ``EngineConfig.defaults()``, or a twentieth of it where the runner's device is a
        GPU, whose extra rows cost next to nothing).
        ``enable_lora``: serve LoRA adapters (PEFT folders) beside the base model;
        ``lora_modules`` (``{name: folder}``, or ``"name=folder"`` strings) loads some at
        start and turns it on. A request runs with one by ``lora="name"`` (``generate``,
        ``chat``, ``stream``, ``submit``); ``load_lora_adapter`` / ``unload_lora_adapter``
        change the set. A step mixes at most ``max_loras`` adapters (a request with one
        more waits); ``max_cpu_loras`` (default ``max_loras``) keep their weights in
        memory, the least recently used idle one dropped (and read again when asked for).
        ``record_trace``: a file to record every call to the core in (submits, aborts,
        each step's plan and tokens), replayable without the model: ``ferrolm replay``,
        the ``ferrolm-replay`` binary (README, "Traces, logs, the wheel")."""
        given = runner is not None and not isinstance(runner, str)  # a runner object (any with forward)
        kind = (
            None
            if given
            else resolve_runner_kind(
                runner if isinstance(runner, str) else "auto",
                device,
                dtype,
                model=model.gguf if isinstance(model, LoadedModel) else model,
                quantization=quantization,
            )
        )
        if isinstance(model, LoadedModel):
            loaded = model
        else:
            # the torch runner reads a checkpoint folder itself, in its own dtype, and the
            # quant runner a GGUF's blocks as stored, or a folder one tensor at a time
            reads_own = kind == "quant" or (kind == "torch" and not is_gguf(model))
            loaded = load_model(model, with_weights=not reads_own)
        self.config, self.tokenizer = loaded.config, loaded.tokenizer
        if given:
            assert runner is not None and not isinstance(runner, str)
            if runner.num_slots < kv_capacity:
                raise InvalidInputError(
                    f"kv_capacity: {kv_capacity} slots, but the runner's KV pool has only {runner.num_slots}",
                    "kv_capacity",
                )
            self.runner = runner
        else:
            self.runner = build_runner(
                loaded,
                kv_capacity,
                runner=kind or "auto",
                device=device,
                dtype=dtype,
                kv_cache_dtype=kv_cache_dtype,
                quantization=quantization,
                mem_fraction_static=mem_fraction_static,
            )
            kv_capacity = self.runner.num_slots  # the same, unless sized from memory
        if blas_threads is not None:
            limit_blas_threads(blas_threads)  # once the runner is built: torch's threads too, if it loaded torch
        # one vocabulary for detokenization and for every request's grammar
        self.vocabulary = _core.Vocabulary(
            self.tokenizer.token_bytes(),
            special_token_ids=self.tokenizer.special_token_ids,
            eos_token_ids=list(self.config.eos_token_ids),
        )
        self.core = _core.Engine(
            self.vocabulary,
            kv_capacity=kv_capacity,
            max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens,
            schedule_policy=schedule_policy,
            enable_prefix_cache=enable_prefix_cache,
            eviction_policy=eviction_policy,
            max_context=self.config.max_position_embeddings,
            seed=seed,
            enable_kv_events=enable_kv_events,
            kv_event_block_size=kv_event_block_size,
            speculative=speculative,
            speculative_max_draft=speculative_max_draft,
            speculative_row_cost=speculative_row_cost
            if speculative_row_cost is not None
            else DEFAULTS.speculative_row_cost / (20 if str(getattr(self.runner, "device", "cpu")) != "cpu" else 1),
            max_loras=max_loras,
            record_trace=None if record_trace is None else os.fspath(record_trace),
        )
        self.loras: _core.LoraRegistry | None = None
        if enable_lora or lora_modules:
            self.loras = registry_for(self.config, max_cpu_loras if max_cpu_loras is not None else max_loras)
            modules = (
                lora_modules.items()
                if isinstance(lora_modules, Mapping)
                else map(parse_lora_module, lora_modules or ())
            )
            for name, path in modules:
                self.load_lora_adapter(name, path)
        release_free_heap()  # what loading freed (parsed metadata, staging copies)
        # the step loop (ferrolm.step_loop): the runner's best mode each step, device greedy
        # and device sampling on where asked for (None: where the runner's device is not
        # the CPU) and the runner has them
        self.loop = StepLoop(
            self.core,
            self.runner,
            eos_token_ids=self.config.eos_token_ids,
            device_greedy=device_greedy,
            device_sampling=device_sampling,
            on_interrupt=lambda out: self._route(deltas_of(out)),
        )
        self._rids = itertools.count()
        self._claimed: set[int] = set()  # rids whose deltas a generate/stream call takes
        self._outbox: list[Delta] = []  # deltas of the other requests, for the next step()
        self._abandoned: set[int] = set()  # aborted by a generate/stream that is gone
        self._held: dict[int, list[Delta]] = {}  # claimed deltas another caller's step made

    # ---- the loop ----

    def step(self) -> list[Delta]:
        """One engine step (schedule, forward, commit); returns the deltas of requests
        queued with ``submit``."""
        mine, _ = self._sort(self._step(), set())
        out, self._outbox = self._outbox + mine, []
        return out

    def _step(self) -> list[Delta]:
        plan = self.core.schedule()
        if len(plan) == 0:
            return deltas_of(self.core.take_outputs())
        return deltas_of(self.loop.step(plan))

    @property
    def device_greedy(self) -> bool:
        """Whether the runner picks greedy tokens on its device (steps whose sampling
        requests are all plain greedy)."""
        return self.loop.device_greedy

    @property
    def device_sampling(self) -> bool:
        """Whether the runner draws every token on its device."""
        return self.loop.device_sampling

    @property
    def device_greedy_steps(self) -> int:
        return self.loop.greedy_steps

    @property
    def device_sampling_steps(self) -> int:
        return self.loop.sampling_steps

    def fail_step(self, message: str) -> list[Delta]:
        """Ends the requests of a step in flight with an error (for a loop whose step
        failed outside the forward); returns the deltas of ``submit``-ed requests, as
        ``step()`` does."""
        self._route(deltas_of(self.core.fail_step(message)))
        out, self._outbox = self._outbox, []
        return out

    def _route(self, deltas: list[Delta]) -> None:
        """Deltas that no caller is waiting for right now: to the outbox, or held for
        their claimant."""
        unclaimed, _ = self._sort(deltas, set())
        self._outbox += unclaimed

    def _sort(self, deltas: list[Delta], rids: set[int]) -> tuple[list[Delta], list[Delta]]:
        """Splits a step's deltas into those of ``submit``-ed requests and those of
        ``rids``; deltas of other claimed requests were taken by their own caller's step,
        and those of abandoned requests are dropped."""
        unclaimed, wanted = [], []
        for d in deltas:
            if d.rid in rids:
                wanted.append(d)
            elif d.rid in self._abandoned:
                if d.finish_reason is not None:
                    self._abandoned.discard(d.rid)
            elif d.rid in self._claimed:
                self._held.setdefault(d.rid, []).append(d)
            else:
                unclaimed.append(d)
        return unclaimed, wanted

    def _step_claimed(self, rids: set[int]) -> list[Delta]:
        """A step on behalf of generate/stream: their deltas back (first any that another
        caller's step already made), the rest to the outbox."""
        held = [d for rid in rids if rid in self._held for d in self._held.pop(rid)]
        if held:
            return held
        unclaimed, wanted = self._sort(self._step(), rids)
        self._outbox += unclaimed
        return wanted

    def has_work(self) -> bool:
        return self.core.has_work() or bool(self._outbox)

    def take_kv_events(self) -> list[KvEvent]:
        """The prefix cache's KV events since the last call (``enable_kv_events``)."""
        return [event_from_raw(raw) for raw in self.core.take_kv_events()]

    # ---- LoRA adapters ----

    def load_lora_adapter(self, name: str, path: str | os.PathLike[str]) -> int:
        """Reads the PEFT adapter in folder ``path`` and serves it as ``name``; its id.
        A bad adapter raises ``InvalidInputError`` naming the file."""
        if self.loras is None:
            raise InvalidInputError("LoRA adapters are off: make the Engine with enable_lora=True", "enable_lora")
        return self.loras.load(name, os.fspath(path))

    def unload_lora_adapter(self, name: str) -> None:
        """Stops serving ``name`` (requests running with it finish with it)."""
        if self.loras is None:
            raise LoraNotFoundError(f"the LoRA adapter {name!r} is not loaded")
        self.loras.unload(name)

    def _adapter(self, lora: Any) -> Any:
        """``lora`` as the core takes it: an adapter name becomes its weights."""
        if lora is None or isinstance(lora, _core.LoraAdapter):
            return lora
        if self.loras is None:
            raise LoraNotFoundError(f"the LoRA adapter {lora!r} is not loaded (LoRA adapters are off)")
        return self.loras.acquire(str(lora))

    # ---- requests ----

    def encode(self, prompt: Prompt) -> Any:
        """Text becomes token ids; ids pass through (the core checks them)."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInputError("prompt: the prompt is empty", "prompt")
            return self.tokenizer.encode(prompt)
        return prompt

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, **core_kw: Any) -> int:
        """Queues one sample of ``prompt`` (``params.n`` is for ``generate``); returns its
        rid. ``core_kw``: further ``_core.Engine.submit`` arguments (priority, namespace, ...)."""
        [rid] = self._submit(self.encode(prompt), params or SamplingParams(), core_kw)
        return rid

    def grammar(self, params: SamplingParams) -> _core.Grammar | None:
        """The compiled grammar of a request's structured-output fields: the body, after
        its triggers, between its tags or beside its alternative answer, composed by the
        request core (``_core.request_grammar``, as a chat's) and cached by source.
        Errors name the field at fault (``structured_or``, a ``json_schema_parts`` key)."""
        fields = params.constraint_fields()
        if not fields:
            return None
        return _core.request_grammar(self.vocabulary, json.dumps(fields))

    def _submit(
        self, ids: Any, params: SamplingParams, core_kw: dict[str, Any], claim: bool = False, n: int = 1
    ) -> list[int]:
        """Queues ``n`` samples of ``ids`` (the core seeds sample j with ``seed + j`` and
        runs the others once the first has cached the prompt); their rids."""
        grammar = self.grammar(params)
        if grammar is not None:
            core_kw = {**core_kw, "grammar": grammar}
        if core_kw.get("lora") is not None:
            core_kw = {**core_kw, "lora": self._adapter(core_kw["lora"])}
        if params.thinking_token_budget is not None and "thinking" not in core_kw:
            # the markers of the chat template's reasoning format, where the prompt leaves
            # the output to think (the request core's rule, as the server's /generate)
            core_kw = {**core_kw, "thinking": self.chat_core.thinking(ids, params.thinking_token_budget)}
        rids = [next(self._rids) for _ in range(n)]
        if claim:
            self._claimed.update(rids)
        try:
            self.core.submit(rids, ids, **params.core_kwargs(), **core_kw)
        except BaseException:
            self._claimed.difference_update(rids)
            raise
        return rids

    def abort(self, rid: int) -> bool:
        return self.core.abort(rid)

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None, **core_kw: Any
    ) -> list[GenerationResult]:
        """Runs prompts to completion, ``params.n`` samples each, in one batch; results
        by prompt, then by sample. Every prompt is checked before any is queued; the
        other samples of a prompt start once its first has cached the prompt, so they
        share it. ``core_kw``: further ``_core.Engine.submit`` arguments (``grammar``...)."""
        params = params or SamplingParams()
        batch: list[Prompt] = [prompts] if _is_single_prompt(prompts) else list(prompts)  # type: ignore[list-item,arg-type]
        encoded = [self.encode(p) for p in batch]
        results: dict[int, GenerationResult] = {}
        try:
            for ids in encoded:
                for rid in self._submit(ids, params, core_kw, claim=True, n=params.n):
                    results[rid] = GenerationResult(rid=rid, prompt_ids=[int(i) for i in ids])
            while any(r.finish_reason is None for r in results.values()):
                for d in self._step_claimed(set(results)):
                    results[d.rid].add(d)
        finally:
            self._release(results)
        return [results[r] for r in sorted(results)]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        tool_call_parser: str = "auto",
        reasoning_parser: str | None = "auto",
        constrain_tool_calls: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        lora: str | None = None,
    ) -> list[ChatResult]:
        """Chat messages (OpenAI's: ``tool_calls`` and ``tool`` messages included) rendered
        with the model's chat template, ``params.n`` answers. ``tools`` and ``tool_choice``
        as in OpenAI's API; calls come back parsed (``ChatResult.tool_calls``) in the format
        ``tool_call_parser`` names (``auto``: the chat template's), generated under the
        functions' schemas unless ``constrain_tool_calls`` is off. ``reasoning_parser``
        (``qwen3``, ``deepseek_r1``; ``auto``: the chat template's, if it writes
        ``</think>``; ``none``) splits off the thinking. Bad input raises
        ``InvalidInputError`` naming the field (``tools.0.function.parameters``, ...).

        The request core is the server's (``_core.ChatCore``): template, tool plan,
        grammar and output parser are the same as ``/v1/chat/completions``'s."""
        params = params or SamplingParams(max_new_tokens=256)
        request: dict[str, Any] = {
            "messages": list(messages),
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "chat_template_kwargs": chat_template_kwargs,
            "thinking_token_budget": params.thinking_token_budget,
        }
        constraint = params.constraint_fields()
        prepared = self.chat_core.prepare(
            json.dumps(request),
            constraint_json=json.dumps(constraint) if constraint else None,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser or "none",
            constrain_tool_calls=constrain_tool_calls,
        )
        # the prepared grammar stands for the caller's constraint (which the plan took in)
        run = params.without_constraint()
        if prepared.skip_special_tokens is not None:
            run = dataclasses.replace(run, skip_special_tokens=prepared.skip_special_tokens)
        grammar = prepared.grammar
        kw: dict[str, Any] = {} if grammar is None else {"grammar": grammar}
        if lora is not None:
            kw["lora"] = lora  # the adapter's name: ``_submit`` takes its weights
        if params.thinking_token_budget is not None:
            kw["thinking"] = prepared.thinking  # this chat's reasoning format
        results = self.generate(prepared.prompt_ids, run, **kw)
        answers = []
        for r in results:
            content, reasoning, calls, finish = prepared.parse(r.text, r.finish_reason)
            answers.append(
                ChatResult(
                    content,
                    reasoning,
                    [ToolCall(*c) for c in calls],
                    finish,
                    r.text,
                    list(r.token_ids),
                    prepared.prompt,
                )
            )
        return answers

    @functools.cached_property
    def chat_core(self) -> _core.ChatCore:
        """The request core of ``chat``, over this engine's vocabulary and tokenizer."""
        tok = self.tokenizer
        return _core.ChatCore(
            self.vocabulary, tok.hf.to_str(), tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token
        )

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, *, lora: str | None = None
    ) -> Iterator[Delta]:
        """One sample of ``prompt``, delta by delta; requests queued with ``submit`` keep
        running and their deltas wait for ``step()``. Bad input raises here, not at the
        first ``next()``. ``lora``: the adapter to run with."""
        [rid] = self._submit(self.encode(prompt), params or SamplingParams(), {"lora": lora}, claim=True)
        return self._stream(rid)

    def _stream(self, rid: int) -> Iterator[Delta]:
        try:
            while True:
                for d in self._step_claimed({rid}):
                    yield d
                    if d.finish_reason is not None:
                        return
        finally:
            self._release({rid: None})

    def _release(self, rids: Any) -> None:
        """Aborts whatever of these is still running (an exception, a closed stream) and
        drops the claims; an aborted request's last delta is not needed by anyone."""
        aborted = False
        for rid in rids:
            if self.core.abort(rid):
                self._abandoned.add(rid)
                aborted = True
            self._claimed.discard(rid)
            self._held.pop(rid, None)
        if aborted:
            # collect the aborts' outputs now (routing any others'), so no work is left behind
            self._route(deltas_of(self.core.take_outputs()))


def default_blas_threads() -> int:
    """Half the cores (at least 1): on a small machine BLAS threads that outnumber the
    free cores spin against each other and the engine loop (5-7x slower steps on 2 cores)."""
    return max(1, (os.cpu_count() or 2) // 2)


def limit_blas_threads(n: int) -> None:
    """Caps the process's BLAS thread pools (numpy's OpenBLAS/MKL) at ``n``, and torch's
    intra-op threads where torch is loaded; process-wide."""
    import sys

    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


def _is_single_prompt(prompts: Any) -> bool:
    if isinstance(prompts, (str, np.ndarray)):
        return True
    return len(prompts) > 0 and isinstance(prompts[0], (int, np.integer))
