"""ferrolm's Rust core (``crates/ferrolm-py`` over ``crates/ferrolm-core``).

Every method releases the GIL while it works on core data. Errors are the classes of
``ferrolm.errors``. If the core ever panics, the object it happened in raises
``CorePanicError`` from then on: state left half-changed is never reused.

Integer sequences (``tokens``, ``kv_slots``) may be numpy arrays (``int32``/``uint32`` are
read in place when contiguous; other integer dtypes are converted once) or sequences of
ints. Anything else, a value out of range, or an array that is not 1-D raises
``InvalidInputError`` naming the argument.
"""

import os
from typing import Any, Iterator, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

__all__ = [
    "__version__",
    "RadixTree",
    "ManualClock",
    "MatchResult",
    "Engine",
    "EngineConfig",
    "BatchPlan",
    "StepOutputs",
    "SamplingBatch",
    "ThinkingBudget",
    "Vocabulary",
    "Grammar",
    "Matcher",
    "fill_next_token_bitmask_batch",
    "json_schema_normalized",
    "replay_trace",
    "write_kv",
    "paged_attention",
    "Frontend",
    "FrontendLoading",
    "render_chat_template",
    "ChatCore",
    "PreparedChat",
    "ChatOutputParser",
    "request_grammar",
    "check_constraint",
    "check_sampling",
    "TOOL_CALL_PARSERS",
    "REASONING_PARSERS",
    "frontend_encode",
    "rms_norm",
    "dequantize",
    "quant_matmul",
    "quant_types",
    "quantize",
    "read_bandwidth",
    "QuantModel",
    "LoraRegistry",
    "LoraAdapter",
    "StepLoras",
    "lora_namespace_parts",
]
__version__: str

@final
class MatchResult:
    """What ``RadixTree.match_prefix`` found. Unpacks as ``length, kv_slots, node``."""

    @property
    def length(self) -> int:
        """Cached tokens at the start of the query, a whole number of pages."""
    @property
    def kv_slots(self) -> npt.NDArray[np.int32]:
        """The KV slot of each of those tokens."""
    @property
    def node(self) -> int:
        """Handle of the node where the match ends (``RadixTree.root_node`` when nothing
        matched). Lock it to keep the prefix cached while a request uses it."""
    def __iter__(self) -> Iterator[object]: ...

@disjoint_base
class RadixTree:
    """Radix prefix cache: token sequences whose KV is cached, with the KV slot of every
    token, found by longest-prefix match.

    Matching and inserting work on whole pages of ``page_size`` tokens. A ``namespace``
    (a LoRA id, a ``cache_salt``) keeps sequences apart: different namespaces never share
    a prefix; ``None`` is the default namespace.

    Node handles are plain ints that are never recycled: once a node is evicted (or the
    tree reset) every call with its handle raises ``StaleHandleError``.
    """

    def __new__(
        cls,
        page_size: int = 1,
        eviction_policy: str = "lru",
        enable_kv_events: bool = False,
        kv_event_block_size: int | None = None,
        *,
        slru_protected_share: float = 0.8,
        ttl_seconds: float = 300.0,
        clock: ManualClock | None = None,
    ) -> Self:
        """``eviction_policy`` is one of ``lru``, ``lfu``, ``fifo``, ``mru``, ``filo``,
        ``priority``, ``slru``, ``tlru``. With ``enable_kv_events`` inserts and evictions
        queue events for ``take_raw_events``, over blocks of ``kv_event_block_size`` tokens
        (default: one page; it must be a whole number of pages, or two branches could share
        a block).

        ``slru`` (segmented LRU): nodes start probationary and become protected on their
        second hit by ``match_prefix``; probationary nodes are evicted first, each segment
        in LRU order. The protected segment holds at most ``slru_protected_share`` of the
        cached tokens (default 0.8, Caffeine's split); after each ``match_prefix`` its
        least recently used nodes move back to the probationary segment, as just used,
        until it fits.

        ``tlru`` (LRU with a time-to-live): a node expires ``ttl_seconds`` (default 300,
        the prompt-cache lifetime of the OpenAI and Anthropic APIs; ``insert`` may give its
        own) after its last use; expired leaves are evicted first, earliest expired first,
        then the others in LRU order. ``clock``: a ``ManualClock`` to read the time from
        (tests); default the machine's monotonic clock.

        Raises ``InvalidInputError`` for a page size or block size outside 1..=2**20, an
        unknown policy (the message lists the known ones), a share outside 0..=1, a TTL
        not in (0, 1e9] seconds, or a ``clock`` that is not a ``ManualClock``."""
    def match_prefix(self, tokens: object, namespace: str | None = None) -> MatchResult:
        """The longest cached prefix of ``tokens`` in ``namespace``.

        Mutates: the matched nodes' use statistics (last access, hit count), and splits
        the last matched node when the match ends inside it, so that the returned node
        covers exactly the matched prefix. Sizes do not change.

        Raises ``InvalidInputError`` for bad ``tokens``."""
    def insert(
        self,
        tokens: object,
        kv_slots: object,
        namespace: str | None = None,
        priority: int = 0,
        *,
        ttl_seconds: float | None = None,
    ) -> int:
        """Caches ``tokens`` (truncated to whole pages) with the KV slot of each token.
        ``ttl_seconds`` (``tlru`` only): the new nodes' time-to-live, which the walked
        nodes' is raised to; default the tree's.

        Returns how many leading tokens were already cached. The tree keeps its own slots
        for those: the caller frees its copies among ``kv_slots[:returned]`` that it did
        not get from ``match_prefix``, and the slots past the last whole page.

        Mutates: adds a leaf for the uncached rest (splitting a node where the sequence
        diverges inside it), marks the walked nodes used and raises their priority to at
        least ``priority``; queues a ``stored`` event when events are on.

        Raises ``InvalidInputError``, changing nothing, when the lengths differ, a token
        is outside 0..=2**32-1 or a slot outside 0..=2**31-1, or ``ttl_seconds`` is bad
        or given to a tree whose policy is not ``tlru``."""
    def lock(self, node: int) -> int:
        """Protects the path from ``node`` to the root from eviction. Locks nest. Locking
        the root does nothing. Returns how many tokens became protected.

        Raises ``StaleHandleError`` if the node is gone."""
    def unlock(self, node: int) -> int:
        """Gives back one ``lock`` taken on this same node. Returns how many tokens became
        evictable again.

        Raises ``StaleHandleError`` if the node is gone, ``NotLockedError`` (changing
        nothing) if the node holds no lock taken on it."""
    def evict(self, num_tokens: int) -> npt.NDArray[np.int32]:
        """Frees unlocked leaves in policy order, and parents that become unlocked leaves,
        until at least ``num_tokens`` tokens are freed or nothing evictable is left.
        Returns the freed KV slots (whole nodes go, so possibly more than asked); they are
        the caller's again. Queues a ``removed`` event when events are on.

        Raises ``InvalidInputError`` for a negative count."""
    def reset(self) -> None:
        """Drops everything cached; every handle but the root's goes stale. Queues a
        ``cleared`` event when events are on. The caller owns all slots again."""
    def evictable_size(self) -> int:
        """Cached tokens on no locked path: what ``evict`` can free."""
    def protected_size(self) -> int:
        """Cached tokens on a locked path."""
    def total_size(self) -> int:
        """All cached tokens (``evictable_size() + protected_size()``)."""
    def num_nodes(self) -> int:
        """Nodes, roots excluded."""
    def memory_bytes(self) -> int:
        """Bytes the tree holds (nodes, token and slot arrays, indexes), by capacity."""
    def all_kv_slots(self) -> npt.NDArray[np.int32]:
        """Every KV slot the tree holds, in no particular order (integrity checks)."""
    def check_invariants(self) -> None:
        """Checks the tree's structure and accounting: O(cached tokens).

        Raises ``InvariantViolation`` naming the first problem found."""
    def take_raw_events(self) -> list[tuple[object, ...]]:
        """Queued KV events, oldest first, as tuples, and clears the queue:
        ``("stored", block_hashes, parent_block_hash, token_ids, block_size, namespace)``,
        ``("removed", block_hashes)``, ``("cleared",)``. ``ferrolm.RadixCache`` objects
        offer ``take_events()``, which returns ``ferrolm.kv_events`` objects."""
    @property
    def page_size(self) -> int: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def slru_protected_share(self) -> float: ...
    @property
    def ttl_seconds(self) -> float: ...
    @property
    def kv_events_enabled(self) -> bool: ...
    @property
    def kv_event_block_size(self) -> int: ...
    @property
    def root_node(self) -> int:
        """The root's handle: what ``match_prefix`` returns when nothing matched."""
    def _read_tokens(self, tokens: object) -> int:
        """Bench hook: reads ``tokens`` as ``match_prefix`` does (in place, checked) without
        touching the tree; returns their count. ``ferrolm bench tree`` times it for the
        cold-read floor under a match. Raises ``InvalidInputError`` as ``match_prefix``."""
    def _inject_panic(self) -> None:
        """Test hook: panics inside the core. Raises ``CorePanicError``, after which this
        object refuses every call."""

@final
class ManualClock:
    """A clock for ``tlru`` trees that moves only when told to, so that tests of
    time-to-live never sleep. One clock can drive several trees and the Python twin."""

    def __new__(cls, start_ns: int = 0) -> Self: ...
    def advance(self, seconds: float) -> None:
        """Moves the time forward (saturating). Raises ``InvalidInputError`` for a
        negative, non-finite or non-numeric ``seconds``."""
    def now_ns(self) -> int:
        """The time in nanoseconds."""

@final
class ThinkingBudget:
    """How many tokens a request may think (``Engine.submit(thinking=...)``): once it
    has generated ``budget`` tokens inside its reasoning without closing it, the core
    forces ``end_ids`` (the reasoning format's end marker, e.g. ``</think>``), one token per
    step, and generation goes on. The reasoning opens at ``start_ids`` in the output, or
    at once where ``open`` (the prompt opened it, or the model thinks without the opening
    marker). Marker tokens do not count. ``ChatCore.thinking`` and
    ``PreparedChat.thinking`` make one from the model's reasoning format."""

    budget: int
    start_ids: list[int]
    end_ids: list[int]
    open: bool
    def __new__(cls, budget: int, end_ids: list[int], *, start_ids: list[int] = ..., open: bool = False) -> Self: ...

@final
class BatchPlan:
    """One step's work, in columns (all ``int32`` unless noted). Request ``b``'s new tokens
    are ``input_ids[qo_offsets[b]:qo_offsets[b+1]]`` at ``positions[...]``; their K/V go to
    ``out_slots[...]``; it attends to ``kv_slots[kv_offsets[b]:kv_offsets[b+1]]``, every slot
    of its sequence up to and including the new tokens, in position order. The runner
    returns one row of logits per entry of ``logit_rows``: each request's last new token,
    and before it one per draft token of a request that verifies a draft (speculative
    decoding: its last ``drafted[b]`` new tokens are the draft). The columns are
    read-only numpy arrays: ``ForwardBatch.from_plan`` uses them as they are, unchecked.
    ``rids``, ``samples``, ``is_prefill``, ``plain_greedy`` and ``ignore_eos`` are made when
    first read (a loop that leaves the step's outputs to the core, as the Rust front end's
    does, seldom reads them); each read after returns the same array."""

    @property
    def rids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def input_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def positions(self) -> npt.NDArray[np.int32]: ...
    @property
    def out_slots(self) -> npt.NDArray[np.int32]: ...
    @property
    def qo_offsets(self) -> npt.NDArray[np.int32]: ...
    @property
    def kv_slots(self) -> npt.NDArray[np.int32]: ...
    @property
    def kv_offsets(self) -> npt.NDArray[np.int32]: ...
    @property
    def logit_rows(self) -> npt.NDArray[np.int32]:
        """The new tokens (indices into ``input_ids``) whose logits the runner returns, in order."""
    @property
    def drafted(self) -> npt.NDArray[np.uint32]:
        """How many of request ``b``'s new tokens are draft tokens to verify (made when first read)."""
    @property
    def has_drafts(self) -> bool:
        """Whether any entry verifies a draft: the core's sampler then reads the rows (no device mode)."""
    @property
    def loras(self) -> StepLoras | None:
        """Each request's LoRA adapter, or ``None`` when no request of the step has one."""
    @property
    def samples(self) -> npt.NDArray[np.bool_]:
        """Whether request ``b`` samples a token after this step (false for a prompt chunk
        that does not reach the end of its prompt)."""
    @property
    def is_prefill(self) -> npt.NDArray[np.bool_]: ...
    @property
    def plain_greedy(self) -> npt.NDArray[np.bool_]:
        """Whether request ``b``'s next token is the bare argmax of its logits (greedy, and
        no bias, penalty, ``min_new_tokens``, grammar, allow list or logprobs): a runner
        may pick it on its device. The rule is the core's, read from the request's params."""
    @property
    def ignore_eos(self) -> npt.NDArray[np.bool_]:
        """Whether request ``b`` ignores EOS: a runner picking its greedy token never picks
        an EOS id."""
    @property
    def all_plain_greedy(self) -> bool:
        """Whether every entry that samples this step is plain greedy (true when none
        samples) and none verifies a draft: the runner may pick the whole step's tokens
        (``forward_greedy``)."""
    @property
    def num_requests(self) -> int: ...
    @property
    def batch_size(self) -> int:
        """``num_requests`` under ``ForwardBatch``'s name: a runner's ``forward`` takes the
        plan as its batch."""
    @property
    def num_tokens(self) -> int: ...
    def __len__(self) -> int: ...

@final
class SamplingBatch:
    """The sampling side of the step in flight, in columns, for a runner that draws the
    tokens on its own device (``Engine.sampling_batch``). Row ``b`` is plan entry ``b``;
    an entry that does not sample this step has a neutral greedy row. A device sampler
    applies, in this order: ``logit_bias``; the penalties (the repetition penalty to every
    listed token: ``l / p`` where ``l > 0``, else ``l * p``; then ``l -= frequency * count
    + presence`` where ``count > 0``); ``-inf`` at the banned ids; the grammar mask. Logprobs
    are of that row. Then argmax (``greedy``) or: weights ``exp((l - max) / temperature)``,
    kept where ``>= min_p`` (relative to the best), the ``top_k`` heaviest (lowest id on
    ties), the fewest heaviest whose sum reaches ``top_p`` of what is left; the token is
    the inverse CDF of the kept weights, in token order, at ``uniforms[b]``."""

    @property
    def greedy(self) -> npt.NDArray[np.bool_]: ...
    @property
    def temperature(self) -> npt.NDArray[np.float32]:
        """1 on greedy rows."""
    @property
    def top_k(self) -> npt.NDArray[np.int32]:
        """0: no limit."""
    @property
    def top_p(self) -> npt.NDArray[np.float32]: ...
    @property
    def min_p(self) -> npt.NDArray[np.float32]: ...
    @property
    def repetition_penalty(self) -> npt.NDArray[np.float32]: ...
    @property
    def frequency_penalty(self) -> npt.NDArray[np.float32]: ...
    @property
    def presence_penalty(self) -> npt.NDArray[np.float32]: ...
    @property
    def uniforms(self) -> npt.NDArray[np.float64]:
        """The row's uniform in [0, 1) from the request's own random stream (the one the
        core's sampler would use; it advances when the token is committed): same seed,
        same draws, whatever else is in the batch."""
    @property
    def logprobs(self) -> npt.NDArray[np.bool_]: ...
    @property
    def top_logprobs(self) -> npt.NDArray[np.int32]: ...
    @property
    def bias_offsets(self) -> npt.NDArray[np.int32]:
        """Row ``b``'s bias: ``bias_ids/bias_values[bias_offsets[b]:bias_offsets[b+1]]``."""
    @property
    def bias_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def bias_values(self) -> npt.NDArray[np.float32]: ...
    @property
    def penalty_offsets(self) -> npt.NDArray[np.int32]:
        """Row ``b``'s penalized tokens (distinct) ``penalty_ids[penalty_offsets[b]:...]``
        and their counts in the output (0: only in the prompt, for the repetition penalty)."""
    @property
    def penalty_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def penalty_counts(self) -> npt.NDArray[np.int32]: ...
    @property
    def banned_offsets(self) -> npt.NDArray[np.int32]:
        """Row ``b``'s banned ids ``banned_ids[banned_offsets[b]:...]``: EOS and stop tokens
        before ``min_new_tokens``, EOS under ``ignore_eos``."""
    @property
    def banned_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def mask_rows(self) -> npt.NDArray[np.int32]:
        """The row of ``masks`` with row ``b``'s grammar mask, or -1."""
    @property
    def masks(self) -> npt.NDArray[np.int32]:
        """``[num masks, ceil(vocab / 32)]`` packed masks: bit ``t % 32`` of word ``t // 32``
        set where token ``t`` is allowed (the ``uint32`` words' bits as ``int32``)."""
    @property
    def num_rows(self) -> int: ...
    def __len__(self) -> int: ...

@final
class StepOutputs:
    """What a step produced, in columns. Entry ``i`` is request ``rids[i]``: its new tokens
    ``token_ids[token_offsets[i]:token_offsets[i+1]]`` (with ``logprobs``, NaN where not
    asked for; token ``j``'s alternatives are ``top_ids/top_logprobs[top_offsets[j]:top_offsets[j+1]]``),
    its text delta ``texts[i]``, and ``finished[i]``: ``None`` while it runs, else
    ``(reason, matched, message, prompt_tokens, cached_tokens, completion_tokens, error_kind)``
    with reason ``"stop"`` (``matched``: the stop string or token id), ``"length"``,
    ``"abort"`` or ``"error"``. For an error, ``message`` says why in words and
    ``error_kind`` in one a program can match: ``"queue_timeout"`` (waited longer than its
    ``queue_timeout``), ``"kv_capacity"`` (can never fit in the KV pool), ``"grammar"`` (its
    grammar or ``allowed_token_ids`` left no token, or refused a given one),
    ``"step_failed"`` (its step's forward failed: ``Engine.fail_step``), ``"sampling"`` (no
    token could be drawn); ``None`` for the other reasons."""

    @property
    def rids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def token_offsets(self) -> npt.NDArray[np.int32]: ...
    @property
    def token_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def top_offsets(self) -> npt.NDArray[np.int32]: ...
    @property
    def top_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def top_logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def texts(self) -> list[str]: ...
    @property
    def finished(self) -> list[tuple[str, str | int | None, str | None, int, int, int, str | None] | None]: ...
    def __len__(self) -> int: ...

@final
class EngineConfig:
    """The engine's settings as the core defines them; ``defaults()`` is the one statement
    of the defaults, which ``Engine`` takes for what is not given."""

    @staticmethod
    def defaults() -> EngineConfig: ...
    @property
    def kv_capacity(self) -> int:
        """Token slots in the KV pool."""
    @property
    def max_running_requests(self) -> int: ...
    @property
    def max_prefill_tokens(self) -> int:
        """Prompt tokens per step (the chunked-prefill budget)."""
    @property
    def schedule_policy(self) -> str: ...
    @property
    def enable_prefix_cache(self) -> bool: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def new_token_ratio(self) -> float: ...
    @property
    def fast_lane_tokens(self) -> int: ...
    @property
    def max_context(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def enable_kv_events(self) -> bool: ...
    @property
    def kv_event_block_size(self) -> int: ...
    @property
    def speculative(self) -> bool: ...
    @property
    def speculative_max_draft(self) -> int: ...
    @property
    def speculative_row_cost(self) -> float: ...
    @property
    def max_loras(self) -> int: ...

@final
class Engine:
    """The engine core: everything a step needs but the forward pass. One call per step
    crosses the boundary: ``schedule()`` gives a ``BatchPlan``, the runner computes logits,
    ``commit(logits)`` samples, detokenizes, checks stops and finishes requests. Every call
    releases the GIL. Not for concurrent use from several threads (a second concurrent
    call raises ``RuntimeError``)."""

    def __new__(
        cls,
        vocabulary: Vocabulary,
        *,
        kv_capacity: int | None = None,
        max_running_requests: int | None = None,
        max_prefill_tokens: int | None = None,
        schedule_policy: str | None = None,
        enable_prefix_cache: bool | None = None,
        eviction_policy: str | None = None,
        new_token_ratio: float | None = None,
        fast_lane_tokens: int | None = None,
        max_context: int | None = None,
        seed: int | None = None,
        enable_kv_events: bool | None = None,
        kv_event_block_size: int | None = None,
        speculative: bool | None = None,
        speculative_max_draft: int | None = None,
        speculative_row_cost: float | None = None,
        max_loras: int | None = None,
        record_trace: str | os.PathLike[str] | None = None,
    ) -> Self:
        """``vocabulary`` gives the token bytes the engine detokenizes with, its special
        and EOS ids, and the vocabulary size; request grammars must be compiled from this
        same object. A setting not given (``None``) is the core's default
        (``EngineConfig.defaults()``, which ``ferrolm.Engine`` and the server's arguments
        show too). ``schedule_policy``:
        ``fcfs``, ``lpm`` (longest cached prefix first), ``priority``. ``max_prefill_tokens`` is the chunked-prefill budget per
        step. ``new_token_ratio`` of each running request's remaining ``max_new_tokens``
        is kept free when admitting others. With ``enable_kv_events`` the prefix cache
        queues KV events (vLLM's shape, over blocks of ``kv_event_block_size`` tokens) for
        ``take_kv_events``. ``speculative``: requests that do not say otherwise draft up to
        ``speculative_max_draft`` tokens a step by lookup in their own text, verified in the
        step's forward (``BatchPlan.logit_rows``), each draft as long as its tokens are
        likely to pay for their rows, a row costing ``speculative_row_cost`` of a step. ``record_trace``: a file (created, or truncated) in which every
        call is recorded as JSON lines for ``replay_trace`` (the format is documented in
        the core's ``trace`` module); a write that fails stops the recording, never the
        engine. Raises ``InvalidInputError`` naming a bad setting, ``OSError`` when the
        trace file cannot be created."""
    def submit(
        self,
        rid: int | list[int],
        input_ids: object,
        *,
        max_new_tokens: int = 16,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        seed: int | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        stop: list[str] = ...,
        stop_token_ids: list[int] = ...,
        include_stop_str: bool = False,
        skip_special_tokens: bool = True,
        ignore_eos: bool = False,
        priority: int = 0,
        namespace: str | None = None,
        queue_timeout: float | None = None,
        allowed_token_ids: list[int] | None = None,
        grammar: Grammar | None = None,
        speculative: bool | None = None,
        thinking: ThinkingBudget | None = None,
        lora: LoraAdapter | None = None,
    ) -> None:
        """Queues a request (with ``lora``: run with that adapter, its prefixes cached in
        the adapter's own namespace within ``namespace``; a step mixes at most
        ``max_loras`` adapters, a request with one more waiting); with a list of rids, one sample of the prompt per rid (``n``
        = ``len(rid)``), sample ``j`` seeded ``seed + j`` when ``seed`` is given. The first
        sample prefills the prompt; the others wait until it is cached, then share it. If
        the first ends before that, the next leads in its place: each sample runs, or
        ends, on its own, and each can be aborted by its rid. ``grammar`` (compiled from the engine's own vocabulary) or
        ``allowed_token_ids`` constrains every sampled token; EOS then comes only where
        the grammar's document may end. Mutates: the waiting queue. Raises ``InvalidInputError`` with
        ``field`` set (changing nothing) for an empty prompt, ids outside the vocabulary, a
        prompt or prompt + ``max_new_tokens`` beyond the context, a prompt larger than the
        KV pool, out-of-range sampling values, an empty stop string, an empty or
        out-of-vocabulary ``allowed_token_ids``, a grammar of another vocabulary, both a
        grammar and ``allowed_token_ids``, no rid, or a rid already in use, a ``thinking``
        budget without end marker tokens or with marker ids outside the vocabulary.
        ``temperature=0`` is greedy. ``thinking``: once a sample has thought
        ``thinking.budget`` tokens without closing its reasoning, its next tokens are the
        end marker's (forced through the grammar, stops and detokenizer as sampled ones;
        on a runner's own draws, through the step's sampling batch, whose mask for the
        entry allows the forced token alone, and the plan says the entry is not plain
        greedy)."""
    def schedule(self) -> BatchPlan:
        """Picks this step's work (evicting from the cache and retracting running requests
        under KV pressure). Raises ``ProtocolError`` if the last plan was not committed."""
    def commit(self, logits: object) -> StepOutputs:
        """Advances every request of the last plan with its rows of ``logits``
        (``float32[len(plan.logit_rows), >= vocab]``: one per request, and one per draft
        token, whose tokens it keeps while its own draws agree with them; a writable C-contiguous float32 array is
        modified in place, anything else is copied once). Raises ``ProtocolError`` for a
        wrong shape (nothing changes then)."""
    def commit_tokens(
        self,
        tokens: object,
        *,
        logprobs: object | None = None,
        top_ids: object | None = None,
        top_logprobs: object | None = None,
    ) -> StepOutputs:
        """As ``commit``, with the tokens a runner drew itself: one per plan entry (ignored
        for entries that do not sample), -1 where nothing could be drawn (the entry then
        ends as the core's sampler would end it: error kind ``grammar`` under a grammar,
        else ``sampling``). Each token is checked against the entry's grammar mask (those
        of ``sampling_batch`` when it was called for this step); a masked one ends the
        entry with error kind ``grammar``. Where a request samples (not greedy), its
        random stream advances by one draw. ``logprobs`` (``float32[B]``) and ``top_ids`` /
        ``top_logprobs`` (``[B, K]``, best first) are kept for requests that asked for them
        (their first ``top_logprobs`` finite entries). Raises ``ProtocolError`` for wrong
        lengths or shapes or an id outside the vocabulary (nothing changes then)."""
    def sampling_batch(self) -> SamplingBatch:
        """The step in flight's sampling columns, for a runner that draws on its device
        and then calls ``commit_tokens``. Fills the constrained entries' grammar masks
        (kept to check the drawn tokens). Changes no request. Raises ``ProtocolError``
        without a step in flight."""
    def fail_step(self, message: str) -> StepOutputs:
        """Drops the last plan after its forward failed, instead of ``commit``: no KV
        advances (the step's own slots go back to the pool, nothing unwritten reaches
        the prefix cache) and every request in the plan finishes with reason ``"error"``,
        ``error_kind`` ``"step_failed"`` and ``message`` (one aborted meanwhile with
        ``"abort"``). Returns those outputs after any pending ones; with no plan in
        flight, only the pending ones."""
    def abort(self, rid: int) -> bool:
        """Ends the request wherever it is (its output comes with the next commit or
        ``take_outputs``); False for an unknown rid."""
    def abort_all(self) -> int: ...
    def take_outputs(self) -> StepOutputs:
        """Outputs produced outside a step (aborts, timeouts, refusals)."""
    def has_work(self) -> bool: ...
    def flush_cache(self) -> bool:
        """Drops the prefix cache; refused (False) while requests run. Queues one
        ``cleared`` event when KV events are on."""
    def take_kv_events(self) -> list[tuple[object, ...]]:
        """The prefix cache's KV events since the last call, oldest first, as
        ``RadixTree.take_raw_events`` gives them (``ferrolm.kv_events.event_from_raw``
        makes objects of them); empty when events are off. Mutates: clears the queue."""
    def check_invariants(self) -> None:
        """KV conservation and the cache's invariants; raises ``InvariantViolation``."""
    def stats(self) -> dict[str, Any]:
        """Counters (steps, prompt/generation/cache-hit tokens, retractions, finished,
        errors, failed_steps; speculation: spec_drafts, spec_draft_tokens,
        spec_accepted_tokens, and spec_accepted_histogram, a list of drafts by tokens kept)
        and load (waiting, running, kv_used, kv_capacity, cached/evictable tokens)."""
    def take_latencies(self) -> dict[str, npt.NDArray[np.float64]]:
        """Latency samples in seconds since the last call: ttft_s, itl_s, e2e_s, queue_s."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def kv_capacity(self) -> int: ...
    @property
    def kv_events_enabled(self) -> bool: ...
    @property
    def kv_event_block_size(self) -> int: ...

@final
class Vocabulary:
    """Token bytes, special and EOS ids, and the token trie: built once per tokenizer and
    shared by every grammar compiled from it (grammars are cached per source, and each
    compilation runs with the GIL released under ``compile_timeout_s``)."""

    def __new__(
        cls,
        token_bytes: list[bytes],
        *,
        special_token_ids: list[int] = ...,
        eos_token_ids: list[int] = ...,
        compile_timeout_s: float = 10.0,
    ) -> Self:
        """Special tokens never match grammar bytes (but a trigger of ``after_trigger`` may be
        one); EOS ids are allowed exactly where the document may end. Raises ``InvalidInputError`` (field ``vocabulary``,
        or ``compile_timeout_s`` unless it is a positive number of seconds)."""
    @staticmethod
    def from_tokenizer_json(
        text: str, *, eos_token_ids: list[int] = ..., vocab_size: int | None = None, compile_timeout_s: float = 10.0
    ) -> Vocabulary:
        """From a Hugging Face ``tokenizer.json`` (byte-level BPE with ``Ġ`` bytes, or
        SentencePiece ``▁`` with ``<0x..>`` fallback); ``vocab_size`` pads to the model's."""
    @staticmethod
    def from_tiktoken(text: str, *, eos_token_ids: list[int] = ..., compile_timeout_s: float = 10.0) -> Vocabulary:
        """From a tiktoken file's text (``base64 rank`` lines)."""
    @property
    def size(self) -> int: ...
    @property
    def bitmask_words(self) -> int:
        """``(size + 31) // 32``: the length of a bitmask row."""
    def regex(self, pattern: str) -> Grammar:
        """Raises ``InvalidInputError`` (field ``regex``; ``grammar`` when too large or slow)."""
    def json_schema(
        self,
        schema: str,
        *,
        whitespace: str = "compact",
        max_whitespace: int = 4,
        lenient: bool = False,
        strict: bool = False,
        any_order_members: bool = False,
    ) -> Grammar:
        """A JSON Schema (as text; draft 4, 6, 7, 2019-09 or 2020-12 by ``$schema``, 2020-12
        without), declared properties in schema order, then any others; with
        ``any_order_members``, declared and other members in any order, each declared one
        at most once, ``required`` checked at the object's close. Unknown keywords
        and formats are annotations; an absent ``additionalProperties`` allows any extra
        member, unless ``strict`` (OpenAI's strict mode: only declared members).
        ``whitespace`` is ``compact`` or ``flexible`` (runs capped at ``max_whitespace``). A
        known keyword that changes what is valid but is not supported raises
        ``InvalidInputError`` (field ``json_schema``) naming it, unless ``lenient``."""
    def json_object(self, *, whitespace: str = "compact", max_whitespace: int = 4) -> Grammar:
        """Any JSON object (``response_format: json_object``)."""
    def ebnf(self, grammar: str) -> Grammar:
        """A grammar in GBNF (llama.cpp's notation; also the EBNF xgrammar reads):
        ``name ::= ...`` rules, the output matching ``root``. Raises ``InvalidInputError``
        (field ``ebnf``) for a grammar that does not parse or make sense (the message gives
        the line and column) or that the engine cannot run exactly (the message names the
        rule and the character where one character of lookahead is not enough);
        ``grammar`` when too large or slow."""
    def choice(self, choices: list[str]) -> Grammar:
        """Exactly one of ``choices``."""
    def after_trigger(self, trigger: str, then: Grammar, *, optional: bool = False) -> Grammar:
        """Free text until ``trigger`` appears, then ``then`` (think, then answer in JSON).
        The output may end only once ``then`` may, or, with ``optional``, also in the free
        text before any trigger (``tool_choice: auto``: a plain answer or a call). Raises
        ``InvalidInputError`` (field ``trigger``) for an empty trigger. A trigger that is
        the text of one of the vocabulary's special tokens (``[TOOL_CALLS]``) may also be
        written as that token (special tokens are otherwise never allowed)."""
    def structural_tags(
        self, then: Grammar, *, begin: str, end: str, separator: str = "", repeated: bool = True, begun: str = ""
    ) -> Grammar:
        """``begin``, ``then``, ``end`` (``<tool_call>\\n{...}\\n</tool_call>``); with
        ``repeated``, then any number more, each after ``separator``. ``begun``: the part of
        the first ``begin`` already written (by the prompt, or by ``after_trigger``'s
        trigger). The output may end only after an ``end``. Raises ``InvalidInputError``
        (field ``begun``) when ``begun`` is not a prefix of ``begin``, and (field
        ``json_schema``) when ``end`` could be read as more of ``then``."""
    def either(self, first: Grammar, second: Grammar) -> Grammar:
        """Text that matches ``first`` or text that matches ``second`` (an answer in the
        response format, or tool calls). Raises ``InvalidInputError`` (field
        ``json_schema``) when one first byte could begin either, and (field ``regex``)
        when ``second`` takes special tokens (``after_trigger`` goes outside)."""
    def _inject_panic(self) -> None:
        """Test hook (not API): panics inside the core. Raises ``CorePanicError``; a
        vocabulary is immutable, so it stays usable."""

@final
class Grammar:
    """A compiled grammar bound to its vocabulary; immutable and shared."""

    @property
    def vocab_size(self) -> int: ...
    def matcher(self) -> Matcher: ...

@final
class Matcher:
    """One request's position in a grammar. A panic inside any call involving it (a
    batch fill included) raises ``CorePanicError`` and the matcher refuses further use."""

    def __new__(cls, grammar: Grammar) -> Self: ...
    def fill_next_token_bitmask(self, bitmask: npt.NDArray[np.int32]) -> None:
        """Fills the caller's ``int32[(vocab + 31) // 32]`` row: bit ``t % 32`` of word
        ``t // 32`` set means token ``t`` is allowed. Raises ``InvalidInputError`` (field
        ``bitmask``) for a wrong dtype, shape or length."""
    def accept_token(self, token: int) -> bool:
        """Advances by one token; False (and no change) if it is not allowed."""
    def accept_string(self, text: str) -> bool:
        """Advances by the text's bytes (one rollback step); False (no change) if invalid."""
    def is_token_allowed(self, token: int) -> bool: ...
    def rollback(self, steps: int) -> None:
        """Undoes the last ``steps`` accepts; raises ``InvalidInputError`` (field ``steps``)."""
    def reset(self) -> None: ...
    def can_end(self) -> bool:
        """EOS is allowed now (the document is complete)."""
    def must_end(self) -> bool:
        """Nothing but EOS may follow."""
    def is_ended(self) -> bool:
        """EOS was accepted."""
    def forced_bytes(self) -> bytes:
        """What must come next whatever is sampled (jump-forward); empty if not forced."""
    @property
    def num_steps(self) -> int: ...
    def _inject_panic(self) -> None:
        """Test hook (not API): panics inside the core. Raises ``CorePanicError``, after
        which this matcher refuses every call."""

def fill_next_token_bitmask_batch(matchers: list[Matcher], bitmask: npt.NDArray[np.int32]) -> None:
    """Fills row ``i`` of ``bitmask`` (``int32[len(matchers), words]``) for ``matchers[i]``."""

def json_schema_normalized(schema: str) -> str:
    """A JSON Schema (text) as ``Vocabulary.json_schema`` reads it, as JSON text: in the
    draft 2020-12 vocabulary, annotations and unknown keywords dropped, each reference
    within the document resolved to ``#/$defs/<JSON pointer of its target>``. For tools
    that follow the engine, e.g. writing a document's members in the order it generates
    them. Raises ``InvalidInputError`` (field ``json_schema``) on text that is not JSON."""

def replay_trace(
    path: str | os.PathLike[str],
    *,
    by_time: bool = False,
    step_ms: float | None = None,
    token_ms: float = 0.0,
    check_every: int = 1,
    verbose: bool = False,
    kv_capacity: int | None = None,
    max_running_requests: int | None = None,
    max_prefill_tokens: int | None = None,
    schedule_policy: str | None = None,
    eviction_policy: str | None = None,
    enable_prefix_cache: bool | None = None,
    new_token_ratio: float | None = None,
) -> dict[str, Any]:
    """Replays a trace recorded with ``Engine(record_trace=...)`` through a fresh engine,
    the recorded tokens standing in for the model (what the ``ferrolm-replay`` binary
    does). Requests arrive in the recorded call order, each step's plan compared with the
    recorded one, or with ``by_time`` at their recorded times on a virtual clock that
    advances ``step_ms`` (default: the recording's mean step) plus ``token_ms`` per token
    at each step. The settings given replace the recorded ones. KV conservation is
    checked every ``check_every`` steps (0: at the end only) and at the end no slot may be
    held.

    Returns the summary: ``ok`` (every KV check held), ``same`` (every step and finish as
    recorded), ``steps``, ``recorded_steps``, ``compared_steps``, ``diverged_steps``,
    ``first_divergence``, ``prompt_tokens``, ``cache_hit_tokens``,
    ``recorded_cache_hit_tokens``, ``generated_tokens``, ``admissions``,
    ``prefill_chunks``, ``retractions``, ``finishes`` (count by reason), ``enforced_ends``,
    ``cut_off``, ``refused``, ``finish_mismatches``, ``first_mismatch``,
    ``missing_tokens``, ``kv_checks``, ``kv_capacity``, ``peak_kv_used``,
    ``peak_running``, ``violations`` (the first 20), ``violation_count``, ``report`` (the
    summary as lines) and ``lines`` (one per step with ``verbose``). Runs without the GIL.
    Raises ``OSError`` when the file cannot be read, ``InvalidInputError`` for a trace
    that does not parse (field ``trace``, with its line number) or a bad setting."""

def write_kv(
    k_pool: npt.NDArray[np.generic],
    v_pool: npt.NDArray[np.generic],
    out_slots: npt.ArrayLike,
    keys: npt.NDArray[np.float32],
    values: npt.NDArray[np.float32],
) -> None:
    """Stores a step's new keys and values (``float32[T, kv_heads, head_dim]`` each) into
    slots ``out_slots`` (``[T]``) of one layer's pool (``[num_slots, kv_heads, head_dim]``,
    float32, float16 or ``ml_dtypes.bfloat16``; rounded to nearest even when narrower).

    Every array is used in place and must be C-contiguous; the pools must be writable and
    not share memory. A wrong type, shape or slot raises ``InvalidInputError`` naming the
    argument.
    """

def paged_attention(
    queries: npt.NDArray[np.float32],
    k_pool: npt.NDArray[np.generic],
    v_pool: npt.NDArray[np.generic],
    positions: npt.ArrayLike,
    qo_offsets: npt.ArrayLike,
    kv_slots: npt.ArrayLike,
    kv_offsets: npt.ArrayLike,
    out: npt.NDArray[np.float32],
    *,
    scale: float,
    sliding_window: int | None = None,
    num_threads: int | None = None,
) -> None:
    """Attention of a step's queries over one layer's KV pool, read in place (no gather,
    no padding), written into ``out``.

    ``queries`` and ``out`` are ``float32[T, heads, head_dim]``; the pools are
    ``[num_slots, kv_heads, head_dim]`` in float32, float16 or bfloat16 (computed in
    float32), ``heads`` a multiple of ``kv_heads`` (query head ``h`` reads KV head
    ``h // (heads // kv_heads)``). The columns are the engine's: request ``b``'s queries
    are ``queries[qo_offsets[b]:qo_offsets[b + 1]]`` and it attends to the slots
    ``kv_slots[kv_offsets[b]:kv_offsets[b + 1]]`` in position order; query ``t`` sits at
    index ``positions[t]`` there and sees the keys up to it, or only the last
    ``sliding_window`` of them (its own included). Scores are multiplied by ``scale``.
    The step's own keys and values must already be in the pool (``write_kv``).

    The work is shared by ``num_threads`` threads (default: the machine's CPUs), split by
    request, KV head, block of queries and block of keys. Arrays must be C-contiguous and
    ``out`` must not share memory with the inputs; a wrong type, shape, offset, slot or
    position raises ``InvalidInputError`` naming the argument.
    """

@final
class Frontend:
    """The Rust HTTP front end (``ferrolm serve``): the OpenAI and native
    routes on axum/tokio threads that never take the GIL, in the process that runs the
    step loop. Starts serving on construction; ``port`` is where it listens (``port=0``:
    one the system picks). Requests are validated, rendered and tokenized on those
    threads and queued; the loop moves them into its engine core with ``drain`` and hands
    each step's outputs straight to the request streams with ``commit`` (or
    ``commit_tokens``, ``fail_step``, ``take_outputs``, which mirror ``Engine``'s and
    return the rids that finished instead of ``StepOutputs``). Structured-output grammars
    compile in ``vocabulary``'s cache (under its compile timeout) on ``grammar_threads``
    threads, off the HTTP threads and the step loop. With ``engine_heartbeat_timeout`` > 0,
    a loop that has not come round (``drain``, or a ``wait`` that returned) for that many
    seconds makes ``/health`` and every request 503, and fails what waits on it, until it
    comes round again. With ``loading``, it serves on the port that one bound (taking it over;
    ``host`` and ``port`` are then not used). Raises
    ``InvalidInputError`` when the tokenizer or chat template cannot be loaded or the
    address cannot be bound."""

    def __new__(
        cls,
        vocabulary: Vocabulary,
        tokenizer_json: str,
        *,
        host: str,
        port: int,
        model_name: str,
        model_path: str,
        context_length: int,
        kv_capacity: int,
        max_running_requests: int,
        max_request_bytes: int,
        version: str,
        model_info_json: str = "{}",
        settings_json: str = "{}",
        api_key: str | None = None,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        max_queued_requests: int | None = None,
        queue_timeout: float | None = None,
        chars_per_token: int | None = None,
        http_threads: int = 2,
        tokenizer_threads: int = 2,
        grammar_threads: int = 2,
        engine_heartbeat_timeout: float = 0.0,
        loading: FrontendLoading | None = None,
        kv_events_json: str | None = None,
        lora_registry: LoraRegistry | None = None,
    ) -> Self:
        """``lora_registry``: the LoRA adapters served beside the model (requests name
        them as ``model`` or ``lora_path``; ``/v1/load_lora_adapter`` and
        ``/v1/unload_lora_adapter`` change the set); ``None``: none, and those routes refuse."""
    @property
    def port(self) -> int: ...
    @property
    def in_flight(self) -> int:
        """Samples submitted and not finished."""
    def note_kv_events(self, queued: int, sent: int, dropped: int, replays: int, late: int) -> None:
        """The KV event publisher's counters (``ferrolm.kv_publisher``; ``late``: steps whose
        outputs went before the earlier steps' events were sent), as ``/server_info`` and
        ``/metrics`` show them while ``kv_events_json`` (the stream's description,
        ``/server_info``'s ``kv_events``) says events are enabled."""
    def wait(self, timeout: float) -> bool:
        """Blocks (GIL released) until a request, abort or call is queued, ``stop`` was
        called, or ``timeout`` seconds pass; True when something is queued."""
    def drain(self, engine: Engine) -> int:
        """Moves everything queued into ``engine`` (submissions, each answered to its
        HTTP request; aborts; control calls); returns the number of prompts it submitted."""
    def next_plan(self, engine: Engine) -> BatchPlan | None:
        """``drain``, then ``engine.schedule()`` in the same call (the GIL released once):
        the step's plan, ``None`` when the core has no work."""
    def commit(
        self, engine: Engine, logits: npt.ArrayLike, forward_s: float | None = None, forward_cpu_s: float | None = None
    ) -> npt.NDArray[np.uint64]:
        """``engine.commit(logits)``, the outputs handed to the streams. ``forward_s`` and
        ``forward_cpu_s``: the step's forward as the loop timed it (wall seconds, and its
        own thread's CPU seconds), shown on ``/metrics`` as the ``ferrolm:forward_seconds``
        histogram and the ``ferrolm:forward_loop_cpu_seconds_total`` counter."""
    def commit_tokens(
        self,
        engine: Engine,
        tokens: npt.ArrayLike,
        *,
        logprobs: object | None = None,
        top_ids: object | None = None,
        top_logprobs: object | None = None,
        forward_s: float | None = None,
        forward_cpu_s: float | None = None,
    ) -> npt.NDArray[np.uint64]:
        """``engine.commit_tokens`` (the same arguments: tokens drawn on the runner's device,
        with the logprobs asked for), the outputs handed to the streams; the forward's
        timing as in ``commit``."""
    def fail_step(self, engine: Engine, message: str) -> npt.NDArray[np.uint64]: ...
    def take_outputs(self, engine: Engine) -> npt.NDArray[np.uint64]: ...
    def stop(self, timeout: float = 5.0) -> None:
        """Stops serving: requests in flight end with 503, open connections get
        ``timeout`` seconds to close."""

@final
class FrontendLoading:
    """The port bound while the model loads, so that probes see the server starting rather
    than a refused connection: every route answers 503 (``/health``: ``{"status":
    "unavailable", "reason": "the engine is starting"}``) until a ``Frontend`` takes the
    port over (``loading=``). Raises ``InvalidInputError`` when the address cannot be bound."""

    def __new__(cls, host: str, port: int) -> Self: ...
    @property
    def port(self) -> int: ...
    def stop(self) -> None:
        """Stops answering and frees the port (when no ``Frontend`` took it over)."""

def frontend_encode(
    tokenizer_json: str, texts: list[str], *, add_special_tokens: bool = False
) -> tuple[list[list[int]], bool]:
    """Token ids of ``texts`` as the Rust front end tokenizes them (``tokenizer.json`` through
    the ``tokenizers`` crate, the pre-tokenizer's split regex run by hand when it is
    cl100k's / Llama 3's, Qwen 2's or GPT-2's), for comparing with the ``tokenizers``
    package; and whether the hand-written split ran. Raises ``InvalidInputError`` when the
    file cannot be read."""

def render_chat_template(
    template: str,
    messages_json: str,
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = True,
    tools_json: str | None = None,
    variables_json: str | None = None,
) -> str:
    """Chat messages (JSON: a list of ``{"role", "content"}``, optionally ``name``,
    ``tool_call_id``, ``reasoning_content`` and ``tool_calls``; a null ``content`` is
    empty) rendered with ``template`` as the server renders them (minijinja, with jinja2's
    trim_blocks and lstrip_blocks, ``raise_exception``, ``tojson``, ``strftime_now`` and
    Python's string methods). ``tools_json`` (a JSON list of tools) is the template's
    ``tools``; ``variables_json`` (a JSON object) more variables, a null one left
    undefined. Raises ``InvalidInputError`` when the template does not compile or fails."""

def check_constraint(constraint_json: str) -> None:
    """Checks structured-output fields (a JSON object, as ``request_grammar`` takes them)
    without compiling them: one body at most, what each placing field needs, each field's
    shape. Raises ``InvalidInputError`` naming the field; the GIL is released."""

def check_sampling(fields: dict[str, Any]) -> None:
    """Checks ``SamplingParams``' sampling fields (``Engine.submit``'s keywords and ``n``)
    against the types the core takes them in: a wrong type, a negative count, ``n`` 0 or
    a seed beyond 64 bits raises ``InvalidInputError`` naming the field. Ranges are the
    core's, checked at submit."""

def request_grammar(vocabulary: Vocabulary, constraint_json: str) -> Grammar | None:
    """The grammar of ``SamplingParams``' structured-output fields (a JSON object, as
    ``SamplingParams.constraint_fields()`` gives them): the body (``regex``,
    ``json_schema``, ``json_object``, ``choice``, ``ebnf``) after ``structured_after``'s
    triggers, between ``structured_tags``, or beside ``structured_or``'s answer, composed as
    the request core composes a chat's and cached in ``vocabulary``'s cache; None when
    none is asked for. Raises ``InvalidInputError`` naming the field at fault (a
    ``json_schema_parts`` key when that part alone does not compile, ``structured_or``...)."""

TOOL_CALL_PARSERS: tuple[str, ...]
"""The names ``tool_call_parser`` takes: ``auto`` (the format the chat template shows),
``none``, ``hermes``, ``llama3_json``, ``mistral`` and other servers' names for them."""
REASONING_PARSERS: tuple[str, ...]
"""The names ``reasoning_parser`` takes: ``auto`` (the chat template's, if it writes
``</think>``), ``none``, ``qwen3``, ``deepseek_r1``."""

@final
class ChatCore:
    """The request core of chat, the one the HTTP server runs
    (``crates/ferrolm-frontend/src/chat_request.rs``), for ``Engine.chat``: messages,
    tools and the caller's structured output in; the prompt, its ids, its grammar and the
    output parser out. ``tokenizer_json`` is the text of ``tokenizer.json``
    (``tokenizers.Tokenizer.to_str()``); grammars compile in ``vocabulary``'s cache.
    Raises ``InvalidInputError`` when the tokenizer or the template cannot be read."""

    def __new__(
        cls,
        vocabulary: Vocabulary,
        tokenizer_json: str,
        chat_template: str | None = None,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> Self: ...
    def prepare(
        self,
        request_json: str,
        *,
        constraint_json: str | None = None,
        tool_call_parser: str = "auto",
        reasoning_parser: str = "auto",
        constrain_tool_calls: bool = True,
    ) -> PreparedChat:
        """Renders, plans, tokenizes and compiles one chat. ``request_json``: a JSON object
        with ``messages`` (OpenAI's, ``tool_calls`` and ``tool`` messages included), and
        optionally ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
        ``chat_template_kwargs``, checked as ``/v1/chat/completions`` checks them.
        ``constraint_json``: the caller's structured output as ``SamplingParams``' fields
        (``SamplingParams.constraint_fields()``). Bad input raises ``InvalidInputError``
        whose ``field`` names it (``tools.0.function.parameters``, ``messages.1.role``,
        ``tool_call_parser``, ``regex``...). ``thinking_token_budget`` in the request
        makes ``PreparedChat.thinking``."""
    def thinking(self, prompt_ids: object, budget: int, *, reasoning_parser: str = "auto") -> ThinkingBudget | None:
        """The thinking budget of an output to the prompt ``prompt_ids``: ``budget`` tokens
        between the markers of the reasoning format ``reasoning_parser`` names (``auto``:
        the chat template's), as this tokenizer's ids, open where the prompt opened the
        thinking (or the format thinks without its opening marker). None where the output
        does not think: no reasoning format, or a prompt that closed the thinking."""

@final
class PreparedChat:
    """A chat ready to submit."""

    @property
    def prompt(self) -> str:
        """The rendered prompt, with what the tools add (a forced call's opening)."""
    @property
    def prompt_ids(self) -> npt.NDArray[np.uint32]:
        """The prompt's token ids (the template writes its own BOS and markers)."""
    @property
    def grammar(self) -> Grammar | None:
        """The output's grammar (the tools' calls, the caller's constraint), for
        ``Engine.submit(grammar=...)``; None when unconstrained."""
    @property
    def skip_special_tokens(self) -> bool | None:
        """False where the markers the parser reads are special tokens; None: the
        caller's setting stands."""
    @property
    def parses(self) -> bool:
        """Whether outputs are parsed (a tool-call or reasoning format applies)."""
    @property
    def thinking(self) -> ThinkingBudget | None:
        """The request's ``thinking_token_budget`` as the core takes it
        (``Engine.submit(thinking=...)``); None without one, or where the output does not
        think (``ChatCore.thinking``)."""
    def output_parser(self) -> ChatOutputParser:
        """A parser of one output as it streams."""
    def parse(
        self, text: str, finish_reason: str | None = None
    ) -> tuple[str | None, str | None, list[tuple[str, str, str]], str | None]:
        """A whole output read: content (None when empty, or there are only calls), the
        reasoning (None without a reasoning format), the calls as ``(id, name,
        arguments)`` with the arguments as JSON text, and the finish reason
        (``tool_calls`` for ``stop`` with calls, as OpenAI)."""

@final
class ChatOutputParser:
    """One output read as it streams: ``feed`` each new text, then ``finish``; each gives
    the pieces certain by then, as ``(kind, text, call index, call id)``: kind
    ``reasoning``, ``content``, ``call`` (text: the function's name; the call's id) or
    ``arguments`` (a fragment of the call's arguments)."""

    def feed(self, text: str) -> list[tuple[str, str, int, str]]: ...
    def finish(self) -> list[tuple[str, str, int, str]]: ...

def rms_norm(
    x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], out: npt.NDArray[np.float32], *, eps: float
) -> None:
    """RMSNorm of each row of ``x`` (along its last axis) into ``out``: ``x / sqrt(mean(x**2)
    + eps) * weight``, in float32 (the mean of squares summed in float64), as the Llama
    family normalizes. One call where array ops take five; large inputs are split by rows
    over threads. ``x`` and ``out`` are C-contiguous float32 arrays of the same shape that
    share no memory, ``weight`` float32 of the last axis' length; otherwise
    ``InvalidInputError`` naming the argument."""

def dequantize(data: npt.NDArray[np.uint8], ggml_type: int) -> npt.NDArray[np.float32]:
    """The weights that ``data`` encodes, as a new 1-D float32 array: ``data`` is the raw
    bytes of whole blocks of ggml type ``ggml_type`` (a GGUF tensor's bytes, e.g. a view
    of a memory-mapped file; read in place), one of ``quant_types()``. The floats equal
    ggml's and gguf-py's dequantizers bit for bit. Large inputs are split over threads;
    the GIL is released meanwhile. ``InvalidInputError`` naming ``ggml_type`` (a type not
    read) or ``data`` (not a C-contiguous uint8 array, or not whole blocks)."""

def quant_matmul(
    weight: npt.NDArray[np.uint8], ggml_type: int, rows: int, cols: int, x: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """``x @ W.T`` as float32 ``[tokens, rows]``, where ``W`` is ``rows`` rows of ``cols``
    weights of ggml type ``ggml_type`` given as raw blocks (``weight``, uint8, a GGUF
    tensor's bytes, read in place) and ``x`` is C-contiguous float32 ``[tokens, cols]``.
    Quantized types multiply integer codes with activations quantized per block to int8
    (Q8_0 for Q8_0/Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1, Q8_K for the k-quants, rounded as ggml's
    reference quantizers round); float types multiply in float. The kernels are AVX2 or
    AVX-512 VNNI where the CPU has them (the same floats as the portable code); the
    products ``QuantModel`` computes, as one call. The GIL is released meanwhile.
    ``InvalidInputError`` naming ``ggml_type``, ``weight``, ``x``, ``cols`` or ``w``."""

def quantize(x: npt.NDArray[np.float32], ggml_type: int) -> npt.NDArray[np.uint8]:
    """``x`` (C-contiguous float32 ``[rows, cols]``) quantized to ggml type ``ggml_type``
    (Q8_0, or Q4_K by a min-max fit per sub-block of 32): the raw blocks, row after row, as
    a GGUF stores them. ``InvalidInputError`` naming ``ggml_type`` (another type), ``x``
    or ``cols`` (rows that are not whole blocks)."""

def quant_types() -> dict[str, int]:
    """ggml's name of every tensor type ``dequantize`` reads (``"Q4_K"``) to its type id."""

def read_bandwidth(megabytes: int = 512, threads: int = 0, passes: int = 5) -> float:
    """Bytes per second this machine reads from memory: a STREAM-like sum over a buffer of
    ``megabytes`` on ``threads`` threads (0: one per available core), the best of
    ``passes``. The GIL is released meanwhile."""

@final
class QuantModel:
    """The Llama-family forward pass on the CPU over weights kept in their GGUF block
    formats, with its own paged KV pool of ``num_slots`` slots (what
    ``ferrolm.model.quant_runner.QuantRunner`` wraps).

    ``shape``: ``hidden``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``intermediate``,
    ``vocab``, ``rms_eps``, ``sliding_window`` (int or None) and ``inv_freq`` (the RoPE
    speeds, ``head_dim / 2`` floats, scaling applied). ``matrices``: GGUF tensor name
    (``token_embd.weight``, ``output.weight`` (absent: tied), ``blk.N.attn_q.weight``, ...,
    ``blk.N.ffn_down.weight``) -> ``(ggml_type, rows, cols, data, file_view)`` with
    ``data`` the raw blocks as a C-contiguous uint8 array, query and key rows in Hugging
    Face's order (copied: the caller's arrays may go afterwards); ``file_view``: ``data``
    is a read-only view of a memory-mapped file, whose pages the core drops from the
    process once copied (they stay in the page cache). ``vectors``: norms and biases
    (``blk.N.attn_norm.weight``, ``blk.N.attn_q.bias``, ``blk.N.attn_q_norm.weight``,
    ``output_norm.weight``, ...) as float32 arrays. ``kv_cache_dtype``: ``float32``,
    ``float16``, ``bfloat16`` or ``q8_0``. ``num_threads``: the threads a step runs on (0: one per
    available core). A missing or misshapen tensor is an ``InvalidInputError`` whose
    ``field`` is its GGUF name."""

    def __new__(
        cls,
        shape: dict[str, Any],
        num_layers: int,
        matrices: dict[str, tuple[int, int, int, npt.NDArray[np.uint8], bool]],
        vectors: dict[str, npt.NDArray[np.float32]],
        num_slots: int,
        kv_cache_dtype: str = "float32",
        num_threads: int = 0,
    ) -> Self: ...
    @property
    def num_slots(self) -> int: ...
    @property
    def num_threads(self) -> int: ...
    @property
    def weight_bytes(self) -> int:
        """Bytes of weights a decode step reads (every matrix once, the head included)."""
    def forward(
        self,
        input_ids: npt.ArrayLike,
        positions: npt.ArrayLike,
        out_slots: npt.ArrayLike,
        qo_offsets: npt.ArrayLike,
        kv_slots: npt.ArrayLike,
        kv_offsets: npt.ArrayLike,
        all_logits: bool = False,
        logit_rows: npt.ArrayLike | None = None,
        loras: StepLoras | None = None,
    ) -> npt.NDArray[np.float32]:
        """One step, with the columns of ``ferrolm.model.runner.ForwardBatch`` (``loras``:
        each request's LoRA adapter, whose update each projection adds to its rows;
        ``InvalidInputError`` naming ``loras`` for a count other than the requests' or an
        adapter read for another model's shape): writes the
        new tokens' keys and values to their slots and returns float32 logits ``[B, vocab]``
        of each request's last new token (``[T, vocab]`` of every token with
        ``all_logits``; ``[R, vocab]`` of the new tokens at ``logit_rows``, a plan's
        column, when given). Each matrix product quantizes its input per block to int8 first,
        as ``quant_matmul`` does. The GIL is released for the whole step.
        ``InvalidInputError`` naming ``input_ids`` (an id beyond the vocabulary),
        ``kv_slots`` (a slot beyond the pool), ``positions`` or ``qo_offsets``."""

@final
class LoraRegistry:
    """The LoRA adapters (PEFT folders) a model serves, by name. At most ``max_resident``
    keep their weights in memory: another one drops the least recently used idle one,
    read again from its folder when next asked for (weights a request holds are never
    dropped). Reading files releases the GIL."""

    def __new__(
        cls, *, num_layers: int, hidden: int, q_dim: int, kv_dim: int, intermediate: int, max_resident: int
    ) -> Self: ...
    def load(self, name: str, path: str | os.PathLike[str]) -> int:
        """Reads and checks the adapter in folder ``path`` and serves it as ``name``; its id
        (never reused). ``InvalidInputError``: ``field`` "lora_path" with the file at fault
        named (missing, unparsable, a module or shape this model cannot take, DoRA...),
        or "lora_name" for a name taken or not allowed."""
    def unload(self, name: str) -> None:
        """Stops serving ``name`` (requests holding it finish with it).
        ``LoraNotFoundError`` if it is not loaded."""
    def acquire(self, name: str) -> LoraAdapter:
        """The adapter ``name`` (or the one loaded from folder ``name``) for a request,
        read again if it was dropped. ``LoraNotFoundError`` if it is not loaded."""
    def trim(self) -> None:
        """Drops idle adapters' weights down to ``max_resident``."""
    def list(self) -> list[dict[str, Any]]:
        """``{"id", "name", "path", "resident"}`` per adapter, in load order."""
    def __contains__(self, name: str, /) -> bool: ...
    @property
    def max_resident(self) -> int: ...
    @property
    def resident(self) -> int:
        """Adapters whose weights are in memory now."""
    @property
    def reads(self) -> int:
        """Adapter folders read since start (loads, and reads after a drop)."""

@final
class LoraAdapter:
    """One adapter's weights, held while this object, or a request given it, lives."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def targets(self) -> list[str]:
        """The projections it adapts in some layer (``q_proj`` ... ``down_proj``)."""
    @property
    def max_rank(self) -> int: ...
    def matrices(self, layer: int, target: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None:
        """``(a [rank, in], b_t [rank, out])`` of ``layer``'s ``target``: its update is
        ``x @ a.T @ b_t`` (the scaling folded into ``b_t``); ``None`` where it is not adapted."""

@final
class StepLoras:
    """A step's LoRA adapter per request (``None``: the base model)."""

    def __new__(cls, adapters: list[LoraAdapter | None]) -> Self: ...
    @property
    def ids(self) -> npt.NDArray[np.uint32]:
        """Request ``b``'s adapter id, 0 for the base model."""
    def adapters(self) -> list[LoraAdapter | None]: ...
    def __len__(self) -> int: ...

def lora_namespace_parts(namespace: str) -> tuple[int | None, str | None, str | None]:
    """``(adapter id, adapter name, salt)`` of a prefix-cache namespace: KV events name the
    adapter of their blocks as vLLM's do (``None`` where it is not an adapter's)."""
