"""Sampling where the logits are: the core's sampler (``crates/ferrolm-core/src/sampling``)
as a few batched torch ops on the runner's device, so that only B token ids (and the
logprobs asked for) cross to the host instead of B x vocab logits.

It reads the step's ``SamplingBatch`` (``Engine.sampling_batch()``: knobs as columns,
ragged bias / penalty / banned lists, the grammar masks the core filled) and applies what
the core's sampler applies, in the same order: logit bias, repetition then frequency and
presence penalties, banned ids, the grammar mask; logprobs of that row; then argmax, or
temperature, min-p, top-k, top-p and one draw. The draw is the inverse CDF of the kept
weights in token order at the row's uniform, which the core takes from the request's own
random stream: same seed, same tokens, whatever else is in the batch, and a plain
temperature draw picks the token the CPU sampler picks from the same stream.

The tokens go back through ``Engine.commit_tokens(**draws.commit_args())``, which checks
them against the same masks and advances matchers, detokenizer and stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class DeviceDraws:
    """One step's draws, on the host: ``tokens`` int32 ``[B]`` (-1 where every logit was
    masked out), and where some request asked for them ``logprobs`` float32 ``[B]`` and
    ``top_ids`` int32 / ``top_logprobs`` float32 ``[B, K]`` (best first)."""

    tokens: np.ndarray
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None

    def commit_args(self) -> dict[str, Any]:
        """Keyword arguments of ``Engine.commit_tokens``."""
        args: dict[str, Any] = {"tokens": self.tokens}
        if self.logprobs is not None:
            args["logprobs"] = self.logprobs
        if self.top_ids is not None:
            args["top_ids"], args["top_logprobs"] = self.top_ids, self.top_logprobs
        return args


def _rows_of(offsets: np.ndarray) -> np.ndarray:
    """The row of each entry of a ragged column given its ``[B + 1]`` offsets."""
    return np.repeat(np.arange(offsets.size - 1), np.diff(offsets))


def sample(logits: Any, batch: Any, vocab_size: int) -> DeviceDraws:
    """Draws one token per row of ``logits`` (a torch tensor ``[B, >= vocab_size]`` on
    any device; only the first ``vocab_size`` columns count, and a float32 tensor is
    modified in place) under ``batch``, a ``SamplingBatch`` of B rows."""
    import torch

    device = logits.device
    x = logits[:, :vocab_size]
    if x.dtype != torch.float32:
        x = x.float()
    num_rows = x.shape[0]
    if batch.num_rows != num_rows:
        raise ValueError(f"the sampling batch has {batch.num_rows} rows, the logits {num_rows}")

    def put(array: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

    def ragged(offsets: np.ndarray, ids: np.ndarray) -> tuple[Any, Any]:
        return put(_rows_of(offsets)), put(ids.astype(np.int64))

    if batch.bias_ids.size:
        rows, ids = ragged(batch.bias_offsets, batch.bias_ids)
        x.index_put_((rows, ids), put(batch.bias_values), accumulate=True)
    if batch.penalty_ids.size:
        # the core's order: the repetition penalty, then frequency and presence (in float32,
        # as the core computes them)
        of = _rows_of(batch.penalty_offsets)
        counts = batch.penalty_counts
        subtract = batch.frequency_penalty[of] * counts.astype(np.float32) + np.where(
            counts > 0, batch.presence_penalty[of], np.float32(0)
        )
        rows, ids = ragged(batch.penalty_offsets, batch.penalty_ids)
        factor = put(batch.repetition_penalty[of])
        values = x[rows, ids]
        x[rows, ids] = torch.where(values > 0, values / factor, values * factor) - put(subtract.astype(np.float32))
    if batch.banned_ids.size:
        rows, ids = ragged(batch.banned_offsets, batch.banned_ids)
        x[rows, ids] = float("-inf")
    masked = np.flatnonzero(batch.mask_rows >= 0)
    if masked.size:
        words = put(batch.masks[batch.mask_rows[masked]])  # [n, ceil(vocab / 32)] int32
        shifts = torch.arange(32, dtype=torch.int32, device=device)
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().reshape(masked.size, -1)[:, :vocab_size]
        rows = put(masked)
        x[rows] = x[rows].masked_fill(~allowed, float("-inf"))

    # a row with no finite logit has nothing to draw
    dead = ~(x.max(dim=-1).values > float("-inf"))
    tokens = x.argmax(dim=-1)  # lowest id on ties, as the core's argmax
    sampled = np.flatnonzero(~batch.greedy)
    if sampled.size:
        rows = put(sampled)
        tokens[rows] = _draw(x.index_select(0, rows), batch, sampled)
    tokens = torch.where(dead, -1, tokens)

    wants_top = int(batch.top_logprobs.max()) if num_rows else 0
    if not (wants_top or batch.logprobs.any()):
        return DeviceDraws(tokens.to(torch.int32).cpu().numpy())
    logprobs = torch.log_softmax(x, dim=-1)
    chosen = logprobs.gather(1, tokens.clamp(min=0)[:, None]).squeeze(1)
    top_ids = top_logprobs = None
    if wants_top:
        top = logprobs.topk(min(wants_top, vocab_size), dim=-1)
        top_ids = top.indices.to(torch.int32).cpu().numpy()
        top_logprobs = top.values.cpu().numpy()
    return DeviceDraws(tokens.to(torch.int32).cpu().numpy(), chosen.cpu().numpy(), top_ids, top_logprobs)


def _draw(x: Any, batch: Any, rows: np.ndarray) -> Any:
    """Tokens drawn for ``x``, the steered logits of the batch's ``rows`` that sample."""
    import torch

    device = x.device

    def put(array: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

    vocab = x.shape[1]
    # weights relative to the best token, as the core: w = exp((l - max) / T), w(best) = 1
    scale = (np.float32(1) / batch.temperature[rows]).astype(np.float32)
    weights = torch.exp((x - x.max(dim=-1, keepdim=True).values) * put(scale)[:, None])
    keep = weights > 0
    min_p = batch.min_p[rows]
    if (min_p > 0).any():
        keep &= weights >= put(min_p)[:, None]
    top_k, top_p = batch.top_k[rows], batch.top_p[rows]
    truncated = np.flatnonzero((top_k > 0) | (top_p < 1))
    if truncated.size:
        t = put(truncated)
        # heaviest first, the lowest id first among equals (a stable sort of the ids)
        heaviest, order = torch.sort(torch.where(keep[t], weights[t], 0), dim=-1, descending=True, stable=True)
        limit = np.where(top_k[truncated] > 0, top_k[truncated], vocab).astype(np.int64)
        kept = (heaviest > 0) & (torch.arange(vocab, device=device)[None, :] < put(limit)[:, None])
        if (top_p[truncated] < 1).any():
            # the fewest heaviest whose sum reaches top_p of the candidates' mass: a token
            # stays while the sum of those before it is short of that
            mass = torch.where(kept, heaviest, 0).double()
            before = mass.cumsum(dim=-1) - mass
            target = put(top_p[truncated].astype(np.float64))[:, None] * mass.sum(dim=-1, keepdim=True)
            kept &= before < target
        keep[t] = torch.zeros_like(kept).scatter_(1, order, kept)
    cumulative = torch.where(keep, weights, 0).double().cumsum(dim=-1)
    target = put(batch.uniforms[rows]) * cumulative[:, -1]
    drawn = torch.searchsorted(cumulative, target[:, None], right=True).squeeze(1)
    # rounding can carry the target past the end: the last kept token then
    last = vocab - 1 - keep.flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.where(drawn >= vocab, last, drawn)
