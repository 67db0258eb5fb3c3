"""Speculative decoding by lookup (``Engine(speculative=True)``, ``--speculative ngram``,
a request's ``speculative``): the same tokens as without it, on every runner that takes
a plan's logit rows, through the offline engine and the server; its counters on
``/metrics``; and refusals by field.

The tiny model's random weights repeat themselves within a few tokens, so its greedy
output is full of n-grams seen before: drafts are proposed and kept there without a
trained model. The logits of a draft's rows come from one forward over several new
tokens (a prefill-shaped product), so logprobs are compared with a tolerance; the token
ids must agree exactly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import make_engine
from ferrolm import Engine, SamplingParams
from ferrolm.errors import InvalidInputError
from ferrolm.model.runner import ForwardBatch
from ferrolm.server.testing import running_server
from gguf_files import wide_tiny, write_tiny_gguf

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "one two three four one two three four one two",
]


def _generate(engine: Engine, params: SamplingParams) -> list:
    return engine.generate(PROMPTS, params)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True),
        SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
        SamplingParams(max_new_tokens=30, temperature=0.0, logprobs=True, top_logprobs=2, stop=["ab"]),
        SamplingParams(max_new_tokens=25, temperature=1.0, seed=3, n=2),
    ],
    ids=["greedy", "seeded", "logprobs-and-stop", "n2"],
)
def test_the_same_tokens_with_and_without_speculation(tiny: Any, params: SamplingParams) -> None:
    # make_engine: a float32 KV pool (a float16 one may round a draft row's keys, computed
    # a few ulps apart in a many-token forward, to another half), on FERROLM_TEST_RUNNER
    plain = make_engine(tiny)
    spec = make_engine(tiny, speculative=True)
    want, got = _generate(plain, params), _generate(spec, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    if params.logprobs:
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
            assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]
    stats = spec.core.stats()
    assert stats["spec_drafts"] > 0 and stats["spec_accepted_tokens"] > 0, stats
    if params.temperature == 0:
        assert stats["steps"] < plain.core.stats()["steps"]
    assert sum(stats["spec_accepted_histogram"]) == stats["spec_drafts"]
    spec.core.check_invariants()
    assert plain.core.stats()["spec_drafts"] == 0


def test_a_request_opts_in_or_out(tiny: Any) -> None:
    off = make_engine(tiny)
    off.generate(PROMPTS[:1], SamplingParams(max_new_tokens=30, temperature=0.0, speculative=True))
    assert off.core.stats()["spec_drafts"] > 0
    on = make_engine(tiny, speculative=True)
    on.generate(PROMPTS[:1], SamplingParams(max_new_tokens=30, temperature=0.0, speculative=False))
    assert on.core.stats()["spec_drafts"] == 0


def test_bad_settings_are_refused_by_field() -> None:
    with pytest.raises(InvalidInputError) as e:
        Engine("tiny", speculative=True, speculative_max_draft=0)
    assert e.value.field == "speculative_max_draft"
    with pytest.raises(InvalidInputError) as e:
        Engine("tiny", speculative=True, speculative_max_draft=65)
    assert e.value.field == "speculative_max_draft"
    with pytest.raises(InvalidInputError) as e:
        Engine("tiny", speculative=True, speculative_row_cost=0.0)
    assert e.value.field == "speculative_row_cost"
    with pytest.raises(InvalidInputError) as e:
        SamplingParams(speculative="yes")  # type: ignore[arg-type]
    assert e.value.field == "speculative"


def test_a_batchs_logit_rows_pick_the_tokens_a_draft_needs() -> None:
    batch = ForwardBatch.from_requests([[1, 2, 3], [4]], [[0, 1, 2], [3]])
    assert batch.logit_rows.tolist() == [2, 3]  # each request's last new token
    rows = dataclasses.replace(batch, logit_rows=[0, 1, 2, 3])  # checked again
    assert rows.logit_rows.tolist() == [0, 1, 2, 3]
    for bad in ([3, 1], [0, 4]):
        with pytest.raises(InvalidInputError, match="logit_rows"):
            dataclasses.replace(batch, logit_rows=bad)


def test_the_quant_runner_verifies_drafts_with_the_same_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(wide_tiny(tmp_path / "wide"), path)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    plain = Engine(str(path), kv_capacity=1024, device="cpu")
    spec = Engine(str(path), kv_capacity=1024, device="cpu", speculative=True)
    assert [o.token_ids for o in spec.generate(PROMPTS, params)] == [
        o.token_ids for o in plain.generate(PROMPTS, params)
    ]
    assert spec.core.stats()["spec_accepted_tokens"] > 0
    # the core's rows, as the quant runner returns them: row r is token r's logits
    ids = [5, 6, 7, 8]
    batch = ForwardBatch.from_requests([ids], [list(range(4))])
    every = spec.runner.forward(batch, all_logits=True)
    picked = spec.runner.forward(dataclasses.replace(batch, logit_rows=[1, 3]))
    np.testing.assert_array_equal(picked, every[[1, 3]])


def test_the_server_speculates_by_default_or_on_request() -> None:
    with running_server("--max-total-tokens", "4096", "--speculative", "ngram", "--speculative-max-draft", "4") as s:
        with httpx.Client(base_url=s.url, headers=s.headers, timeout=60) as http:
            body = {"prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0}
            spec = http.post("/v1/completions", json=body).json()
            off = http.post("/v1/completions", json={**body, "speculative": False}).json()
            assert spec["choices"][0]["text"] == off["choices"][0]["text"]
            native = http.post(
                "/generate",
                json={
                    "text": PROMPTS[0],
                    "sampling_params": {"max_new_tokens": 30, "temperature": 0, "speculative": True},
                },
            ).json()
            assert native["text"] == spec["choices"][0]["text"]
            bad = http.post("/v1/completions", json={**body, "speculative": "yes"})
            assert bad.status_code == 400 and "speculative" in bad.json()["error"]["message"]
            metrics = http.get("/metrics").text
    drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].split()[-1]) > 0
    accepted = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0
    assert 'ferrolm:spec_decode_accepted_tokens_per_draft_bucket{le="+Inf"}' in metrics
