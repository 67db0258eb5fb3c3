"""The device sampler (torch, here on the CPU) against the core's CPU sampler, its
reference: twin engine cores get the same requests and the same logits every step; one
samples them itself (``commit``), the other hands its ``sampling_batch`` to the device
sampler and takes the ids back (``commit_tokens``).

Greedy (with bias, penalties, banned EOS and stop tokens) must pick the same tokens with
logprobs within 1e-5; a plain temperature draw uses the same uniform from the same stream
and so nearly always the same token; truncated draws (top-k, top-p, min-p) take the
kept tokens in another order, so they are compared as distributions: each sampler's
histogram over 9,600 draws against the exact distribution by a chi-square test at
p = 1e-6, and the two histograms within a total variation distance of 0.03."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from ferrolm._core import Engine, Vocabulary
from ferrolm.engine import deltas_of
from ferrolm.errors import ProtocolError

torch: Any = pytest.importorskip("torch", reason="torch is not installed; the device sampler needs it")

from ferrolm.model.device_sampler import sample  # noqa: E402  (needs torch)
from small_models import TORCH_TEST_DEVICE  # noqa: E402


def on_device(logits: np.ndarray) -> Any:
    """The logits as a tensor on the test device (the CPU unless FERROLM_TEST_DEVICE says)."""
    return torch.from_numpy(logits).to(TORCH_TEST_DEVICE)


VOCAB = 48
EOS = VOCAB - 1


def core(batch: int = 64) -> Engine:
    vocabulary = Vocabulary([f"t{i} ".encode() for i in range(VOCAB - 1)] + [b"</s>"], eos_token_ids=[EOS])
    return Engine(vocabulary, kv_capacity=batch * 512, max_running_requests=batch, max_context=4096)


class Twins:
    """Two cores with the same requests; ``step`` feeds both the same logits."""

    def __init__(self, requests: list[dict[str, Any]], seed: int = 0) -> None:
        self.cpu, self.device = core(len(requests)), core(len(requests))
        self.rng = np.random.default_rng(seed)
        for rid, params in enumerate(requests):
            prompt = params.pop("prompt", [1, 2, 3, rid % VOCAB])
            for engine in (self.cpu, self.device):
                engine.submit(rid, prompt, **params)

    def step(self, logits_of: Any = None) -> tuple[list[Any], list[Any]]:
        plan, same = self.cpu.schedule(), self.device.schedule()
        assert plan.rids.tolist() == same.rids.tolist()
        n = len(plan)
        logits = logits_of(plan) if logits_of else (self.rng.standard_normal((n, VOCAB)) * 2).astype(np.float32)
        cpu = deltas_of(self.cpu.commit(logits.copy()))
        draws = sample(on_device(logits.copy()), self.device.sampling_batch(), VOCAB)
        device = deltas_of(self.device.commit_tokens(**draws.commit_args()))
        return cpu, device

    def run(self, logits_of: Any = None) -> tuple[dict[int, Any], dict[int, Any]]:
        """Every request's (tokens, logprobs, top logprobs, finish) from each core."""
        outs: tuple[dict[int, Any], dict[int, Any]] = ({}, {})
        while self.cpu.has_work() or self.device.has_work():
            for deltas, out in zip(self.step(logits_of), outs):
                for d in deltas:
                    o = out.setdefault(d.rid, [[], [], [], None])
                    o[0] += d.token_ids
                    o[1] += d.logprobs
                    o[2] += d.top_logprobs
                    o[3] = d.finish_reason if d.finish_reason is None else (d.finish_reason, d.error_kind)
        return outs


def test_greedy_with_bias_penalties_and_bans_picks_the_cpu_samplers_tokens() -> None:
    requests = [
        {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True},
        {"temperature": 0.0, "max_new_tokens": 12, "logit_bias": {5: 3.0, 6: -2.5, EOS: 4.0}, "ignore_eos": True},
        {"temperature": 0.0, "max_new_tokens": 12, "repetition_penalty": 1.8, "prompt": [3, 4, 5, 9, 9]},
        {"temperature": 0.0, "max_new_tokens": 12, "frequency_penalty": 1.5, "presence_penalty": 0.7},
        {
            "temperature": 0.0,
            "max_new_tokens": 12,
            "min_new_tokens": 6,
            "stop_token_ids": [7, 8],
            "logit_bias": {EOS: 5.0, 7: 5.0},
            "repetition_penalty": 0.6,
            "frequency_penalty": -1.0,
        },
        {"top_k": 1, "max_new_tokens": 12, "logprobs": True, "top_logprobs": 5, "presence_penalty": 2.0},
        {
            "temperature": 0.0,
            "max_new_tokens": 12,
            "allowed_token_ids": [2, 3, 5, 8, 13, 21, EOS],
            "logprobs": True,
            "top_logprobs": 3,
            "logit_bias": {4: 50.0},
        },
    ]
    cpu, device = Twins(requests).run()
    assert sorted(cpu) == sorted(device) == list(range(len(requests)))
    for rid in cpu:
        (ct, clp, ctop, cfin), (dt, dlp, dtop, dfin) = cpu[rid], device[rid]
        assert dt == ct, rid
        assert dfin == cfin, rid
        np.testing.assert_allclose(dlp, clp, atol=1e-5, equal_nan=True)
        for c, d in zip(ctop, dtop, strict=True):
            assert [t for t, _ in d] == [t for t, _ in c]
            np.testing.assert_allclose([lp for _, lp in d], [lp for _, lp in c], atol=1e-5)
    assert len(cpu[5][2][0]) == 5 and len(cpu[6][2][0]) == 3, "top logprobs came back, as many as asked"
    assert all(t in (2, 3, 5, 8, 13, 21, EOS) for t in device[6][0])


def test_plain_temperature_draws_pick_the_cpu_samplers_tokens() -> None:
    """Same uniform, same order (token order over the whole row): only float rounding at
    a boundary between two tokens could tell them apart."""
    requests = [
        {"temperature": t, "seed": 100 + i, "max_new_tokens": 40, "ignore_eos": True, "logprobs": i % 2 == 0}
        for i, t in enumerate(np.linspace(0.3, 1.7, 32))
    ]
    cpu, device = Twins(requests, seed=1).run()
    agree = total = 0
    for rid in cpu:
        agree += sum(a == b for a, b in zip(cpu[rid][0], device[rid][0], strict=True))
        total += len(cpu[rid][0])
        np.testing.assert_allclose(device[rid][1], cpu[rid][1], atol=1e-5, equal_nan=True)
    assert total == 32 * 40
    assert agree >= 0.995 * total, f"{agree} of {total}"


def truncated_distribution(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> np.ndarray:
    """The probabilities the core's sampler draws from (float64, written from its docs)."""
    w = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    keep = w >= min_p
    order = np.lexsort((np.arange(w.size), -w))  # heaviest first, lowest id on ties
    ranked = np.zeros(w.size, bool)
    ranked[order[: top_k or w.size]] = True
    keep &= ranked
    if top_p < 1:
        kept = [i for i in order if keep[i]]
        mass = sum(w[i] for i in kept)
        running, cut = 0.0, np.zeros(w.size, bool)
        for i in kept:
            cut[i] = True
            running += w[i]
            if running >= top_p * mass:
                break
        keep &= cut
    p = np.where(keep, w, 0)
    return p / p.sum()


def chi_square_critical(dof: int, z: float = 4.753) -> float:
    """The chi-square quantile at the normal quantile ``z`` (Wilson-Hilferty; z = 4.753
    is p = 1e-6)."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize(
    "knobs",
    [
        {"temperature": 0.9, "top_k": 6},
        {"temperature": 1.3, "top_p": 0.8},
        {"temperature": 1.0, "min_p": 0.15},
        {"temperature": 0.7, "top_k": 12, "top_p": 0.9, "min_p": 0.05},
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_truncated_draws_follow_the_cpu_samplers_distribution(knobs: dict[str, Any]) -> None:
    row = (np.random.default_rng(5).standard_normal(VOCAB) * 1.5).astype(np.float32)
    row[EOS] = -np.inf  # never EOS, so every request draws every step
    steps, batch = 150, 64
    requests = [{**knobs, "seed": 1000 + i, "max_new_tokens": steps} for i in range(batch)]
    cpu, device = Twins(requests).run(lambda plan: np.tile(row, (len(plan), 1)))
    expected = truncated_distribution(
        row, knobs["temperature"], knobs.get("top_k", 0), knobs.get("top_p", 1.0), knobs.get("min_p", 0.0)
    )
    support = np.flatnonzero(expected > 0)
    hist = {}
    for name, out in (("cpu", cpu), ("device", device)):
        tokens = np.concatenate([out[rid][0] for rid in out])
        assert tokens.size == steps * batch
        counts = np.bincount(tokens, minlength=VOCAB)
        assert counts[expected == 0].sum() == 0, f"{name} drew a token the truncation drops"
        want = expected[support] * tokens.size
        stat = float((((counts[support] - want) ** 2) / want).sum())
        assert stat < chi_square_critical(max(support.size - 1, 1)), (name, stat, support.size)
        hist[name] = counts / tokens.size
    assert 0.5 * np.abs(hist["cpu"] - hist["device"]).sum() < 0.03


def test_a_masked_token_is_never_sampled_and_nothing_allowed_ends_as_on_the_cpu() -> None:
    allowed = [3, 9, 10, 30]
    requests = [
        {
            "temperature": 2.0,
            "seed": i,
            "max_new_tokens": 50,
            "allowed_token_ids": allowed,
            "logit_bias": {4: 100.0, 11: 100.0},
            "ignore_eos": True,
        }
        for i in range(16)
    ]
    # EOS is the only allowed token and may not come yet: nothing can be drawn
    requests.append({"temperature": 0.7, "max_new_tokens": 5, "min_new_tokens": 2, "allowed_token_ids": [EOS]})
    requests.append({"temperature": 0.0, "max_new_tokens": 5, "allowed_token_ids": [EOS], "ignore_eos": True})
    cpu, device = Twins(requests).run()
    for rid in range(16):
        assert len(device[rid][0]) == 50 and set(device[rid][0]) <= set(allowed)
    for rid in (16, 17):
        assert device[rid][0] == cpu[rid][0] == []
        assert device[rid][3] == cpu[rid][3] == ("error", "grammar")


def test_same_seed_same_tokens_whatever_else_is_in_the_batch() -> None:
    """The watched request's logits depend only on how many tokens it has, so any
    difference in its tokens comes from the rest of the batch."""
    watched = {
        "temperature": 1.1,
        "top_p": 0.85,
        "top_k": 20,
        "seed": 77,
        "max_new_tokens": 30,
        "ignore_eos": True,
        "frequency_penalty": 0.4,
    }
    others = [
        {
            "temperature": 0.5 + i / 10,
            "top_p": 0.7,
            "seed": i,
            "max_new_tokens": 10 + i,
            "repetition_penalty": 1.3,
            "allowed_token_ids": list(range(i, VOCAB, 3)),
        }
        for i in range(1, 9)
    ]
    others += [{"temperature": 0.0, "max_new_tokens": 20, "logprobs": True, "top_logprobs": 4}]

    def run(requests: list[dict[str, Any]], rid_watched: int) -> list[int]:
        engine = core(len(requests))
        for rid, params in enumerate(requests):
            engine.submit(rid, [1, 2, 3, 4], **params)
        tokens: dict[int, list[int]] = {}
        rng = np.random.default_rng(3)
        rows = (rng.standard_normal((64, VOCAB)) * 2).astype(np.float32)
        while engine.has_work():
            plan = engine.schedule()
            logits = rng.standard_normal((len(plan), VOCAB)).astype(np.float32)
            for i, rid in enumerate(plan.rids.tolist()):
                if rid == rid_watched:
                    logits[i] = rows[len(tokens.get(rid, []))]
            draws = sample(on_device(logits), engine.sampling_batch(), VOCAB)
            for d in deltas_of(engine.commit_tokens(**draws.commit_args())):
                tokens.setdefault(d.rid, []).extend(d.token_ids)
        return tokens[rid_watched]

    alone = run([watched], 0)
    assert len(alone) == 30
    assert run([watched, *others], 0) == alone
    assert run([*others[:3], watched, *others[3:]], 3) == alone


def test_commit_tokens_refuses_bad_draws_naming_the_problem() -> None:
    engine = core(2)
    engine.submit(0, [1, 2], temperature=0.0, max_new_tokens=2)
    engine.submit(1, [1, 2], temperature=0.0, max_new_tokens=2)
    with pytest.raises(ProtocolError):
        engine.sampling_batch()  # no step in flight
    engine.schedule()
    for bad in (
        {"tokens": [1]},
        {"tokens": [1, VOCAB]},
        {"tokens": [1, 2], "logprobs": np.zeros(3, np.float32)},
        {"tokens": [1, 2], "top_ids": np.zeros((2, 2), np.int32), "top_logprobs": np.zeros((2, 3), np.float32)},
    ):
        with pytest.raises(Exception) as e:
            engine.commit_tokens(**bad)
        assert "tokens" in str(e.value) or "logprobs" in str(e.value) or "vocabulary" in str(e.value)
    with pytest.raises(Exception, match="top_ids"):
        engine.commit_tokens([1, 2], top_ids=np.zeros((2, 1), np.int32))
    with pytest.raises(Exception, match="tokens"):
        engine.commit_tokens([1, -2])
    with pytest.raises(Exception, match="tokens"):
        engine.commit_tokens(np.array([1.0, 2.0]))
    out = engine.commit_tokens(np.array([4, 5], np.int64))
    assert out.token_ids.tolist() == [4, 5]
