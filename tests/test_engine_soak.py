"""A randomized soak of the whole engine with the tiny model: a few hundred requests of
random lengths, sampling settings, stop strings, stop ids and allowed-token sets, some
aborted at random moments, submitted while the engine runs under KV pressure. After every
step the core's invariants hold (KV conservation); at the end every request finished
exactly once, its output respects what it asked for, and every slot is free or cached.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from conftest import make_engine
from ferrolm import SamplingParams
from ferrolm.model import LoadedModel

NUM_REQUESTS = 300
# small enough that requests are retracted whatever tokens are sampled (at 160 the draws of
# one OpenBLAS kernel never filled the pool)
KV_CAPACITY = 128
STOP_STRINGS = ["e", "th", " a", "in", "\n", "ing", "xq", "ation", "(", "er"]


@dataclass
class Tracked:
    prompt: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finishes: list[tuple[Any, ...]] = field(default_factory=list)
    aborted: bool = False  # abort() answered True


def random_request(rng: np.random.Generator, vocab: int, bases: list[list[int]]) -> tuple[list[int], SamplingParams]:
    length = int(rng.integers(1, 41))
    if rng.random() < 0.5:  # shares a prefix with other requests
        base = bases[int(rng.integers(len(bases)))]
        prompt = base[: int(rng.integers(1, len(base) + 1))]
        prompt = (prompt + [int(t) for t in rng.integers(0, vocab, size=length)])[:length]
    else:
        prompt = [int(t) for t in rng.integers(0, vocab, size=length)]
    max_new = int(rng.integers(1, 13))
    kw: dict[str, Any] = {
        "max_new_tokens": max_new,
        "min_new_tokens": int(rng.integers(0, max_new + 1)) if rng.random() < 0.2 else 0,
        "temperature": float(rng.choice([0.0, 0.0, 0.7, 1.0, 1.5])),
        "seed": int(rng.integers(0, 2**32)) if rng.random() < 0.7 else None,
        "ignore_eos": bool(rng.random() < 0.3),
    }
    if rng.random() < 0.2:
        kw["top_k"] = int(rng.integers(1, 50))
    if rng.random() < 0.2:
        kw["top_p"] = float(rng.uniform(0.3, 1.0))
    if rng.random() < 0.5:
        kw["stop"] = [str(s) for s in rng.choice(STOP_STRINGS, size=int(rng.integers(1, 3)), replace=False)]
        kw["include_stop_str"] = bool(rng.random() < 0.3)
    if rng.random() < 0.15:
        kw["stop_token_ids"] = [int(t) for t in rng.integers(0, vocab, size=3)]
    if rng.random() < 0.2:
        size = int(rng.integers(1, 30))
        kw["allowed_token_ids"] = sorted({int(t) for t in rng.integers(0, vocab, size=size)})
    if rng.random() < 0.2:
        kw["logprobs"] = True
        kw["top_logprobs"] = int(rng.integers(0, 4))
    return prompt, SamplingParams(**kw)


def test_randomized_soak(tiny: LoadedModel) -> None:
    rng = np.random.default_rng(20261130)
    tok = tiny.tokenizer
    vocab = tok.vocab_size  # special tokens included
    eos = set(tiny.config.eos_token_ids)
    engine = make_engine(tiny, KV_CAPACITY, max_running_requests=24, max_prefill_tokens=96)
    bases = [[int(t) for t in rng.integers(0, vocab, size=30)] for _ in range(4)]
    reqs: dict[int, Tracked] = {}
    finished_rids: set[int] = set()
    stale_abort_checked = 0
    steps = 0
    while len(reqs) < NUM_REQUESTS or engine.has_work():
        if len(reqs) < NUM_REQUESTS:
            for _ in range(int(rng.integers(0, 6))):
                prompt, params = random_request(rng, vocab, bases)
                rid = engine.submit(prompt, params)
                assert rid not in reqs
                reqs[rid] = Tracked(prompt, params)
        live = [rid for rid in reqs if rid not in finished_rids and not reqs[rid].aborted]
        if live and rng.random() < 0.25:
            victim = live[int(rng.integers(len(live)))]
            assert engine.abort(victim) is True
            reqs[victim].aborted = True
        if finished_rids and rng.random() < 0.05:
            # aborting a request that already finished changes nothing
            done = sorted(finished_rids)[int(rng.integers(len(finished_rids)))]
            assert engine.abort(done) is False
            stale_abort_checked += 1
        for d in engine.step():
            r = reqs[d.rid]
            assert d.rid not in finished_rids, f"request {d.rid} produced output after it finished"
            r.token_ids += d.token_ids
            r.text += d.text
            r.logprobs += d.logprobs
            r.top_logprobs += d.top_logprobs
            if d.finish_reason is not None:
                r.finishes.append((d.finish_reason, d.matched_stop, d.error, d.prompt_tokens, d.completion_tokens))
                finished_rids.add(d.rid)
        engine.core.check_invariants()
        steps += 1
        assert steps < 5000, "the soak does not finish"

    stats = engine.core.stats()
    assert len(reqs) == NUM_REQUESTS
    assert finished_rids == set(reqs)
    assert stats["waiting"] == 0 and stats["running"] == 0, stats
    assert stats["kv_used"] == stats["cached_tokens"], stats
    assert stats["errors"] == 0, stats
    assert stats["finished"] == NUM_REQUESTS, stats
    # the run really went through KV pressure and the cache
    assert stats["cache_hit_tokens"] > 0, stats
    assert stats["kv_used"] > KV_CAPACITY // 2, stats
    assert stats["retractions"] > 0, stats

    reasons: Counter[str] = Counter()
    for rid, r in reqs.items():
        assert len(r.finishes) == 1, (rid, r.finishes)
        reason, matched, error, prompt_tokens, completion_tokens = r.finishes[0]
        reasons[reason] += 1
        p = r.params
        assert error is None, (rid, error)
        assert prompt_tokens == len(r.prompt), (rid, prompt_tokens)
        assert completion_tokens == len(r.token_ids), (rid, completion_tokens, len(r.token_ids))
        assert len(r.token_ids) <= p.max_new_tokens
        if r.aborted:
            assert reason == "abort", (rid, reason)
            continue
        assert reason in ("stop", "length"), (rid, reason)
        if reason == "length":
            assert len(r.token_ids) == p.max_new_tokens, rid
        else:
            assert len(r.token_ids) >= max(p.min_new_tokens, 1), rid
            if isinstance(matched, str):
                assert matched in p.stop, (rid, matched)
            else:
                assert matched in p.stop_token_ids or (not p.ignore_eos and matched in eos), (rid, matched)
                assert r.token_ids[-1] == matched, rid
        if p.allowed_token_ids is not None:
            assert set(r.token_ids) <= set(p.allowed_token_ids), rid
        # EOS is masked out with ignore_eos and before min_new_tokens, and ends a request
        # otherwise; so do stop ids
        assert not eos & set(r.token_ids if p.ignore_eos else r.token_ids[:-1]), rid
        assert not set(p.stop_token_ids) & set(r.token_ids[:-1]), rid
        if not p.stop:
            # a stop token's (or EOS's) text is not part of the output
            ids = r.token_ids[:-1] if isinstance(matched, int) else r.token_ids
            assert r.text == tok.decode(ids, skip_special_tokens=True), rid
        elif p.include_stop_str:
            if isinstance(matched, str):
                assert r.text.endswith(matched), (rid, r.text, matched)
        elif p.min_new_tokens == 0:
            # (stop strings are not looked for in the first min_new_tokens tokens)
            assert not any(s in r.text for s in p.stop), (rid, r.text, p.stop)
        if p.logprobs:
            assert len(r.logprobs) == len(r.token_ids)
            assert all(np.isfinite(lp) and lp <= 1e-5 for lp in r.logprobs), rid
        if p.top_logprobs:
            assert [len(t) for t in r.top_logprobs] == [p.top_logprobs] * len(r.token_ids), rid

    # every kind of ending happened
    assert reasons["abort"] > 10 and reasons["stop"] > 10 and reasons["length"] > 10, reasons
    assert stale_abort_checked > 0
    # with nothing running the cache can be dropped, and then every slot is free
    assert engine.core.flush_cache() is True
    engine.core.check_invariants()
    assert engine.core.stats()["kv_used"] == 0
