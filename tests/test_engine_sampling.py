"""Sampling through the whole engine with the tiny model: per-request seeds, ``n > 1``
sharing the prompt's prefill, and logprobs / top logprobs checked against the dense
float64 reference forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import make_engine
from ferrolm import SamplingParams
from ferrolm.engine import Engine
from ferrolm.model import LoadedModel
from ferrolm.model.reference import reference_logits

PROMPT = "In the beginning the universe was created. This has made a lot of people"


@pytest.fixture(scope="module")
def engine(tiny: LoadedModel) -> Engine:
    return make_engine(tiny)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def sampled(seed: int | None, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_new_tokens=12, ignore_eos=True, **kw)


def test_same_seed_same_text(engine: Engine, tiny: LoadedModel) -> None:
    [a] = engine.generate(PROMPT, sampled(42))
    [b] = engine.generate(PROMPT, sampled(42))  # now with the prompt cached
    assert (a.token_ids, a.text) == (b.token_ids, b.text)
    # in another engine, in a batch with other requests, and with top-k/top-p settings
    # that leave the distribution untouched
    other = make_engine(tiny, max_prefill_tokens=5)
    results = other.generate(["some other prompt", PROMPT, "and another one"], sampled(42))
    assert results[1].token_ids == a.token_ids
    [c] = other.generate(PROMPT, sampled(42, top_p=1.0, top_k=0, min_p=0.0))
    assert c.token_ids == a.token_ids


def test_different_seeds_differ(engine: Engine) -> None:
    outputs = {tuple(engine.generate(PROMPT, sampled(seed))[0].token_ids) for seed in range(1, 6)}
    assert len(outputs) >= 4  # a collision of 12 sampled tokens is all but impossible


def test_n_samples_share_the_prompt_prefill(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt_len = len(engine.tokenizer.encode(PROMPT))
    # top-k: batched and alone, a row's logits differ by rounding (~1e-6), which can move a
    # draw across a boundary between two of 32,000 tiny probabilities; among the top 40 the
    # boundaries are far apart (the property tested is the seeds, not the rounding)
    results = engine.generate(PROMPT, sampled(7, n=3, top_k=40))
    assert len(results) == 3
    assert [r.finish_reason for r in results] == ["length"] * 3
    assert [len(r.token_ids) for r in results] == [12] * 3
    assert results[0].cached_tokens == 0  # a fresh engine
    # the later samples reuse every prompt token but the last (whose logits they need)
    assert [r.cached_tokens for r in results[1:]] == [prompt_len - 1] * 2
    assert len({tuple(r.token_ids) for r in results}) == 3
    # sample j is seeded with seed + j: the same as a request with that seed alone
    for j, r in enumerate(results):
        [alone] = engine.generate(PROMPT, sampled(7 + j, top_k=40))
        assert alone.token_ids == r.token_ids
        assert alone.text == r.text
    # greedy samples are all the same
    greedy = engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=6, n=3))
    assert len({tuple(r.token_ids) for r in greedy}) == 1
    stats = engine.core.stats()
    assert stats["kv_used"] == stats["cached_tokens"], stats


def test_logprobs_shapes_and_values_match_the_reference(engine: Engine, tiny: LoadedModel) -> None:
    k = 5
    params = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=k)
    [r] = engine.generate(PROMPT, params)
    n = len(r.token_ids)
    assert n == 8
    assert len(r.logprobs) == n and len(r.top_logprobs) == n
    prompt = r.prompt_ids
    # every generated token's distribution, from the dense reference over the whole sequence
    ref = log_softmax(reference_logits(tiny.config, tiny.weights, prompt + r.token_ids)[len(prompt) - 1 : -1])
    for j, (token, lp, top) in enumerate(zip(r.token_ids, r.logprobs, r.top_logprobs, strict=True)):
        assert len(top) == k
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 1e-6 for v in values)
        assert top[0][0] == token  # greedy: the sampled token is the best alternative
        assert top[0][1] == pytest.approx(lp, abs=1e-6)
        assert lp == pytest.approx(ref[j, token], abs=2e-3)
        ref_top = np.argsort(-ref[j])[:k]
        assert [t for t, _ in top] == ref_top.tolist()
        np.testing.assert_allclose(values, ref[j, ref_top], atol=2e-3)


def test_logprobs_when_sampling(engine: Engine) -> None:
    """At temperature 1 the sampled token need not be the best; its logprob is the one
    its alternatives list gives it when it is among them."""
    params = sampled(3, logprobs=True, top_logprobs=20)
    [r] = engine.generate(PROMPT, params)
    assert len(r.logprobs) == len(r.token_ids) == 12
    for token, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs, strict=True):
        assert np.isfinite(lp) and lp <= 1e-6
        assert len(top) == 20
        assert lp <= top[0][1] + 1e-6
        found = dict(top)
        if token in found:
            assert lp == pytest.approx(found[token], abs=1e-6)


def test_no_logprobs_unless_asked(engine: Engine) -> None:
    [r] = engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=4))
    assert len(r.logprobs) == 4 and all(np.isnan(r.logprobs))
    assert r.top_logprobs == [[]] * 4


def test_top_k_1_samples_the_greedy_token(engine: Engine) -> None:
    [greedy] = engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))
    for seed in (1, 2):
        params = SamplingParams(temperature=1.5, top_k=1, seed=seed, max_new_tokens=8, ignore_eos=True)
        [r] = engine.generate(PROMPT, params)
        assert r.token_ids == greedy.token_ids
