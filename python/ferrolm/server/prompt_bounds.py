"""A cheap lower bound on the number of tokens of a text, so that a prompt that cannot fit
the context is refused before it is tokenized (tokenizing megabytes takes seconds).

The bound must never refuse a prompt that fits. It rests on one number: the most
characters of input one token can stand for. A token is not always at least one
character (a byte-level vocabulary splits an emoji into several tokens: that only raises
the count), but one token can stand for many characters (a run of spaces, a line of
"=" signs, a special token such as "<|im_start|>"), so the bound is

    tokens >= ceil(len(text) / (longest token in characters * normalizer shrink))

where the longest token is measured in bytes (never fewer than its characters), and the
shrink is how many input characters the normalizer can fold into one (NFC/NFKC compose at
most 4 code points into one: the longest canonical decomposition in Unicode is 4 code
points). Tokenizers that can make input vanish (a pre-tokenizer or normalizer that drops
whitespace or accents, added tokens that strip their neighbours' spaces, an unknown-token
that swallows a whole word, a precompiled normalizer) have no such bound: ``None``, and
the exact check after tokenizing is the only one.
"""

from __future__ import annotations

import json
from typing import Any

from ferrolm.model.tokenizer import Tokenizer

NF_COMPOSE_SHRINK = 4  # the longest canonical decomposition, in code points
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "UnicodeScripts"}


def max_input_chars_per_token(tokenizer: Tokenizer, token_bytes: list[bytes]) -> int | None:
    """The most input characters one token can consume, or ``None`` where the tokenizer
    has no bound (see the module's docstring)."""
    hf = tokenizer.hf
    if type(hf.model).__name__ != "BPE":
        return None  # WordPiece / WordLevel / Unigram: an unknown word can be one token
    if (
        getattr(hf.model, "unk_token", None)
        and getattr(hf.model, "fuse_unk", False)
        and not getattr(hf.model, "byte_fallback", False)
    ):
        return None  # a run of unknown characters fuses into one token
    if not _pre_tokenizer_keeps_text(_state(hf.pre_tokenizer)):
        return None
    shrink = _normalizer_shrink(_state(hf.normalizer))
    if shrink is None:
        return None
    longest = max((len(b) for b in token_bytes), default=1)
    for added in hf.get_added_tokens_decoder().values():
        if added.lstrip or added.rstrip or added.single_word:
            return None  # it swallows the whitespace around it: any amount
        longest = max(longest, len(added.content))
    return max(longest, 1) * shrink


def min_tokens(text: str, chars_per_token: int | None) -> int:
    """A lower bound on the tokens of ``text`` (0 where none is known)."""
    if chars_per_token is None:
        return 0
    return -(-len(text) // chars_per_token)


def _state(component: Any) -> dict[str, Any] | None:
    if component is None:
        return None
    state: dict[str, Any] = json.loads(component.__getstate__())
    return state


def _pre_tokenizer_keeps_text(state: dict[str, Any] | None) -> bool:
    if state is None:
        return True
    kind = state.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps_text(p) for p in state.get("pretokenizers", []))
    if kind == "Split":
        return bool(state.get("behavior") != "Removed")
    return kind in _KEEPING_PRE_TOKENIZERS


def _normalizer_shrink(state: dict[str, Any] | None) -> int | None:
    """How many input characters the normalizer may fold into one (``None``: any number)."""
    if state is None:
        return 1
    kind = state.get("type")
    if kind == "Sequence":
        total = 1
        for part in state.get("normalizers", []):
            shrink = _normalizer_shrink(part)
            if shrink is None:
                return None
            total *= shrink
        return total
    if kind in ("NFC", "NFKC"):
        return NF_COMPOSE_SHRINK
    if kind in ("NFD", "NFKD", "Prepend", "Lowercase"):
        return 1  # decomposing, prepending and lowercasing never shorten text
    if kind == "Replace":
        pattern, content = state.get("pattern", {}), state.get("content", "")
        if "String" not in pattern or not content:
            return None  # a regex, or a replacement that deletes
        return max(1, -(-len(pattern["String"]) // len(content)))
    return None  # Strip, StripAccents, BertNormalizer, Precompiled...: text may vanish
