"""Text through the whole engine with the tiny model: incremental detokenization (the
deltas of a request add up to a full decode of its ids, multi-byte characters included),
stop strings split across tokens (caught, never leaked into a delta, excluded from the
text unless asked for), and ``stream()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any, cast

import numpy as np
import pytest
from conftest import make_engine
from ferrolm import SamplingParams
from ferrolm.engine import Delta, Engine
from ferrolm.model import ForwardBatch, LoadedModel

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "def main():\n    print(",
    "Le café est très bon, n'est-ce pas?",
    "日本語のテキスト",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def engine(tiny: LoadedModel) -> Engine:
    """One engine for the whole module: every test leaves it idle."""
    return make_engine(tiny)


def run_deltas(engine: Engine, prompts: list[Any], params: list[SamplingParams]) -> list[list[Delta]]:
    """Each request's deltas, submitted together and stepped to the end."""
    rids = [engine.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
    deltas: dict[int, list[Delta]] = {rid: [] for rid in rids}
    while engine.has_work():
        for d in engine.step():
            deltas[d.rid].append(d)
    for rid in rids:
        assert [d.finish_reason is not None for d in deltas[rid]].count(True) == 1
        assert deltas[rid][-1].finish_reason is not None
    stats = engine.core.stats()
    assert stats["kv_used"] == stats["cached_tokens"], stats
    return [deltas[rid] for rid in rids]


def ids_of(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


# ---- detokenization ----


def test_greedy_deltas_add_up_to_the_full_decode(engine: Engine) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    outputs = run_deltas(engine, PROMPTS, [params] * len(PROMPTS))
    for deltas in outputs:
        assert text_of(deltas) == engine.tokenizer.decode(ids_of(deltas), skip_special_tokens=True)


def test_sampled_deltas_add_up_to_the_full_decode_with_multibyte_text(engine: Engine) -> None:
    """Temperature 1 over the whole vocabulary: CJK and accented tokens, and lone bytes of
    multi-byte characters, come out; no delta splits a character."""
    prompts = PROMPTS * 3
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_new_tokens=24) for i in range(len(prompts))]
    outputs = run_deltas(engine, prompts, params)
    non_ascii = 0
    for deltas in outputs:
        text = text_of(deltas)
        assert text == engine.tokenizer.decode(ids_of(deltas), skip_special_tokens=True)
        non_ascii += sum(ord(c) > 127 for c in text)
    assert non_ascii > 0, "no multi-byte character came out: the test proves nothing"


def _byte_tokens(engine: Engine) -> tuple[list[int], list[int]]:
    """Ids of the single-byte tokens: non-ASCII bytes (UTF-8 lead and continuation bytes)
    and ASCII letters."""
    table = engine.tokenizer.token_bytes()
    high = [i for i, b in enumerate(table) if len(b) == 1 and b[0] >= 0x80]
    ascii_letters = [i for i, b in enumerate(table) if len(b) == 1 and chr(b[0]).isalpha() and b[0] < 0x80]
    return high, ascii_letters


def test_byte_soup_deltas_add_up_to_the_lossy_full_decode(engine: Engine) -> None:
    """Only single-byte tokens allowed, mostly UTF-8 lead and continuation bytes: output
    full of invalid and incomplete sequences, which the deltas must render exactly as a
    full (lossy, U+FFFD) decode does, also when a request ends mid-character."""
    high, letters = _byte_tokens(engine)
    assert len(high) == 128
    allowed = high + letters[:8]
    n = 12
    params = [
        SamplingParams(temperature=1.0, seed=7 + i, max_new_tokens=16 + i % 5, allowed_token_ids=allowed)
        for i in range(n)
    ]
    outputs = run_deltas(engine, ["bytes:"] * n, params)
    replacement = 0
    for deltas in outputs:
        ids = ids_of(deltas)
        assert set(ids) <= set(allowed)
        text = text_of(deltas)
        assert text == engine.tokenizer.decode(ids, skip_special_tokens=True), ids
        replacement += text.count("\ufffd")
    assert replacement > 0


def test_multibyte_characters_fed_byte_by_byte_come_out_whole(engine: Engine) -> None:
    """Sampling ran elsewhere (``commit_tokens``): the bytes of 2-, 3- and 4-byte
    characters, one single-byte token per step. A character is released with its last
    byte, never before, never split."""
    table = engine.tokenizer.token_bytes()
    byte_id = {b[0]: i for i, b in enumerate(table) if len(b) == 1}
    text = "aé日本🙂z"
    encoded = text.encode()
    core = engine.core
    rid = 10_000_000
    core.submit(rid, [byte_id[encoded[0]]], max_new_tokens=len(encoded), temperature=0.0)
    deltas: list[str] = []
    for b in encoded:
        plan = core.schedule()
        assert plan.rids.tolist() == [rid]
        # the runner still writes the plan's KV (the sequence ends up in the cache)
        engine.runner.forward(ForwardBatch.from_plan(plan))
        out = core.commit_tokens(np.array([byte_id[b]], np.int32))
        deltas.append(out.texts[0])
    assert "".join(deltas) == text
    # a character is released only with its last byte
    ends = np.cumsum([len(ch.encode()) for ch in text])
    for k, delta in enumerate(deltas, start=1):
        released = "".join(deltas[:k])
        assert released == text[: int(np.searchsorted(ends, k, side="right"))], (k, deltas)
    assert not core.has_work()
    stats = core.stats()
    assert stats["kv_used"] == stats["cached_tokens"]


def test_special_tokens_in_the_output_follow_skip_special_tokens(engine: Engine) -> None:
    tok = engine.tokenizer
    bos = tok.bos_token_id
    assert bos is not None and bos in tok.special_token_ids
    letters = [int(tok.encode(c, add_special_tokens=False)[0]) for c in "ab"]
    for skip in (True, False):
        params = SamplingParams(
            temperature=50.0, seed=3, max_new_tokens=12, allowed_token_ids=[bos, *letters], skip_special_tokens=skip
        )
        [deltas] = run_deltas(engine, ["special:"], [params])
        ids = ids_of(deltas)
        assert bos in ids and set(letters) & set(ids), ids
        assert text_of(deltas) == tok.decode(ids, skip_special_tokens=skip)
        assert ("<|begin_of_text|>" in text_of(deltas)) is not skip


def test_stop_token_ids_end_the_request_without_their_text(engine: Engine) -> None:
    tok = engine.tokenizer
    a, b = (int(tok.encode(c, add_special_tokens=False)[0]) for c in "ab")
    # a high temperature: about even odds between the two allowed tokens
    params = SamplingParams(temperature=50.0, seed=5, max_new_tokens=40, allowed_token_ids=[a, b], stop_token_ids=[b])
    [deltas] = run_deltas(engine, ["stop ids:"], [params])
    ids = ids_of(deltas)
    assert ids[-1] == b and b not in ids[:-1]
    assert (deltas[-1].finish_reason, deltas[-1].matched_stop) == ("stop", b)
    assert text_of(deltas) == "a" * (len(ids) - 1)


# ---- stop strings ----


@pytest.fixture(scope="module")
def greedy_ref(engine: Engine) -> tuple[str, list[int], str]:
    """A greedy output with varied ASCII text near its start, and its prompt."""
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:
        [r] = engine.generate(prompt, params)
        pieces = [engine.tokenizer.decode(r.token_ids[:k]) for k in range(len(r.token_ids) + 1)]
        if r.text.isascii() and len(set(r.token_ids[:6])) >= 4 and pieces[-1] == r.text:
            return prompt, r.token_ids, r.text
    raise AssertionError("no prompt gives a varied ASCII greedy output")


def _boundary_stops(engine: Engine, ids: list[int], text: str) -> list[str]:
    """Substrings of the text that span one or more token boundaries."""
    ends = [len(engine.tokenizer.decode(ids[:k])) for k in range(1, len(ids) + 1)]
    stops = []
    for k in (1, 2, 5):  # boundary after token k
        p = ends[k - 1]
        assert 0 < p < len(text)
        stops.append(text[p - 1 : p + 1])  # last char of token k, first of token k + 1
    # one that starts inside a token and covers two boundaries
    a, b = ends[0], ends[2]
    stops.append(text[a - 1 : b + 1])
    assert len(set(stops)) == len(stops), stops
    return stops


def test_stop_string_across_tokens_stops_and_never_leaks(engine: Engine, greedy_ref) -> None:
    prompt, ref_ids, ref_text = greedy_ref
    for stop in _boundary_stops(engine, ref_ids, ref_text):
        cut = ref_text.index(stop)
        params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True, stop=[stop])
        deltas = list(engine.stream(prompt, params))
        text = text_of(deltas)
        assert text == ref_text[:cut], (stop, text)
        assert stop not in text
        for d in deltas:
            assert stop not in d.text, (stop, d.text)
        assert deltas[-1].finish_reason == "stop"
        assert deltas[-1].matched_stop == stop
        # the run ended on the token that completed the stop string
        ids = ids_of(deltas)
        assert ids == ref_ids[: len(ids)]
        assert len(engine.tokenizer.decode(ids)) >= cut + len(stop) > len(engine.tokenizer.decode(ids[:-1]))
        # the same through generate, and with include_stop_str
        [r] = engine.generate(prompt, params)
        assert (r.text, r.finish_reason, r.matched_stop) == (ref_text[:cut], "stop", stop)
        [r] = engine.generate(prompt, dataclasses.replace(params, include_stop_str=True))
        assert (r.text, r.finish_reason, r.matched_stop) == (ref_text[: cut + len(stop)], "stop", stop)
        assert r.token_ids == ids


def test_first_of_several_stop_strings_wins(engine: Engine, greedy_ref) -> None:
    prompt, ref_ids, ref_text = greedy_ref
    stops = _boundary_stops(engine, ref_ids, ref_text)
    first = min(stops, key=ref_text.index)
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True, stop=list(reversed(stops)))
    [r] = engine.generate(prompt, params)
    assert (r.text, r.matched_stop) == (ref_text[: ref_text.index(first)], first)


def test_a_stop_string_that_never_matches_changes_nothing(engine: Engine, greedy_ref) -> None:
    """Partial matches are held back while they might grow, then released."""
    prompt, ref_ids, ref_text = greedy_ref
    # starts like the text at a boundary, then diverges: held back, then released
    stop = ref_text[:3] + "\x00never"
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True, stop=[stop])
    deltas = list(engine.stream(prompt, params))
    assert text_of(deltas) == ref_text
    assert ids_of(deltas) == ref_ids
    assert deltas[-1].finish_reason == "length"


# ---- stream ----


def test_stream_concatenation_equals_generate(engine: Engine) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    for prompt in PROMPTS[:3]:
        [r] = engine.generate(prompt, params)
        deltas = list(engine.stream(prompt, params))
        assert text_of(deltas) == r.text
        assert ids_of(deltas) == r.token_ids
        assert all(d.finish_reason is None for d in deltas[:-1])
        assert deltas[-1].finish_reason == r.finish_reason
        assert len(deltas) == len(r.token_ids)  # one token per step
        assert not engine.has_work()


def test_closing_a_stream_early_frees_its_request(engine: Engine) -> None:
    # (stream() is a generator: closing it aborts the request)
    stream = cast(
        Generator[Delta, None, None],
        engine.stream("An unfinished story about", SamplingParams(temperature=0.0, max_new_tokens=20)),
    )
    first = [next(stream), next(stream)]
    assert all(d.finish_reason is None for d in first)
    stream.close()
    # the request is aborted; its closing output is nobody's, so step() does not return it
    assert engine.step() == []
    assert not engine.has_work()
    engine.core.check_invariants()
    stats = engine.core.stats()
    assert stats["running"] == 0 and stats["kv_used"] == stats["cached_tokens"], stats
