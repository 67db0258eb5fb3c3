"""Parts of the server checked without one: the prompt length bound (which the front end
takes as its ``chars_per_token``) and the flags (where the API key comes from, the body
size limit)."""

from __future__ import annotations

import argparse
import json
import unicodedata
from typing import Any

import pytest
import tokenizers
from ferrolm.model.loader import resolve_model_folder
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.server.args import add_serve_arguments, server_args_from
from ferrolm.server.prompt_bounds import NF_COMPOSE_SHRINK, max_input_chars_per_token, min_tokens
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model_folder("tiny"))


@pytest.fixture(scope="module")
def tiny_bound(tiny_tokenizer: Tokenizer) -> int:
    bound = max_input_chars_per_token(tiny_tokenizer, tiny_tokenizer.token_bytes())
    assert bound is not None
    return bound


# ---- the prompt length bound never refuses a prompt that fits ----


@pytest.fixture(scope="module")
def long_tokens(tiny_tokenizer: Tokenizer) -> list[str]:
    """The vocabulary's longest pieces, as text: the texts that pack most into a token."""
    pieces = sorted(tiny_tokenizer.token_bytes(), key=len, reverse=True)[:50]
    return [p.decode("utf-8", errors="ignore") for p in pieces if p]


@given(st.data())
def test_the_bound_is_a_lower_bound(
    tiny_tokenizer: Tokenizer, tiny_bound: int, long_tokens: list[str], data: st.DataObject
) -> None:
    parts = data.draw(
        st.lists(
            st.one_of(
                st.sampled_from(long_tokens),
                st.sampled_from(["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", " " * 40, "\n" * 30, "=" * 64]),
                st.text(max_size=20),
                st.integers(1, 500).map(lambda n: " " * n),
            ),
            max_size=30,
        )
    )
    text = "".join(parts)
    for special in (True, False):
        assert len(tiny_tokenizer.encode(text, add_special_tokens=special)) >= min_tokens(text, tiny_bound)


def test_runs_of_whitespace_are_the_worst_case_and_still_bounded(tiny_tokenizer: Tokenizer, tiny_bound: int) -> None:
    for ch in (" ", "\n", "\t", "=", "-", "a"):
        text = ch * 100_000
        assert len(tiny_tokenizer.encode(text)) >= min_tokens(text, tiny_bound)


def _with(tokenizer: Tokenizer, change: Any) -> Tokenizer:
    spec = json.loads(tokenizer.hf.to_str())
    change(spec)
    return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)))


def _normalizer(kind: dict[str, Any]) -> Any:
    return lambda spec: spec.__setitem__("normalizer", kind)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_normalizer({"type": "Strip", "strip_left": True, "strip_right": True}), id="strip"),
        pytest.param(_normalizer({"type": "StripAccents"}), id="strip-accents"),
        pytest.param(_normalizer({"type": "Replace", "pattern": {"String": " "}, "content": ""}), id="delete"),
        pytest.param(_normalizer({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}), id="regex"),
        pytest.param(lambda spec: spec.__setitem__("pre_tokenizer", {"type": "WhitespaceSplit"}), id="drops-spaces"),
        pytest.param(lambda spec: spec["added_tokens"][0].__setitem__("rstrip", True), id="added-token-rstrip"),
    ],
)
def test_no_bound_where_text_can_vanish(tiny_tokenizer: Tokenizer, change: Any) -> None:
    tokenizer = _with(tiny_tokenizer, change)
    assert max_input_chars_per_token(tokenizer, tokenizer.token_bytes()) is None
    assert min_tokens("x" * 10**6, None) == 0


def test_composing_normalizers_widen_the_bound(tiny_tokenizer: Tokenizer, tiny_bound: int) -> None:
    nfc = _with(tiny_tokenizer, _normalizer({"type": "NFC"}))
    assert max_input_chars_per_token(nfc, nfc.token_bytes()) == tiny_bound * NF_COMPOSE_SHRINK
    text = "e\u0301" * 5000  # composes to half as many characters
    assert len(nfc.encode(text)) >= min_tokens(text, tiny_bound * NF_COMPOSE_SHRINK)


def test_no_canonical_composition_folds_more_than_four_code_points() -> None:
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest <= NF_COMPOSE_SHRINK


# ---- the API key ----


def _parse(*flags: str, environ: dict[str, str]) -> Any:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return server_args_from(parser.parse_args(list(flags)), environ)


def test_api_key_from_the_environment_and_the_flag_wins() -> None:
    assert _parse(environ={}).api_key is None
    assert _parse(environ={"FERROLM_API_KEY": "from-env"}).api_key == "from-env"
    assert _parse("--api-key", "from-flag", environ={"FERROLM_API_KEY": "from-env"}).api_key == "from-flag"
    assert _parse(environ={"FERROLM_API_KEY": "k"}).public_dict()["api_key"] == "set"


@pytest.mark.parametrize(
    ("flags", "environ"), [((), {"FERROLM_API_KEY": ""}), ((), {"FERROLM_API_KEY": "  "}), (("--api-key", ""), {})]
)
def test_an_empty_key_is_refused_not_taken_for_none(flags: tuple[str, ...], environ: dict[str, str]) -> None:
    with pytest.raises(SystemExit):
        _parse(*flags, environ=environ)


def test_max_request_bytes_flag() -> None:
    assert _parse(environ={}).max_request_bytes == 8 * 1024 * 1024
    assert _parse("--max-request-bytes", "1000", environ={}).max_request_bytes == 1000
    with pytest.raises(SystemExit):
        _parse("--max-request-bytes", "0", environ={})


def test_the_eviction_policy_flag_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferrolm.engine
    from ferrolm.server.args import build_engine

    assert _parse(environ={}).radix_eviction_policy == "lru"
    with pytest.raises(SystemExit):
        _parse("--radix-eviction-policy", "arc", environ={})
    seen: dict[str, Any] = {}

    def fake_engine(*a: Any, **kw: Any) -> None:
        seen.update(kw)

    monkeypatch.setattr(ferrolm.engine, "Engine", fake_engine)
    build_engine(_parse("--radix-eviction-policy", "slru", environ={}))
    assert seen["eviction_policy"] == "slru"
