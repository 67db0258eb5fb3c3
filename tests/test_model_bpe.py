"""The byte-level BPE tokenizer built from tiktoken ranks behaves as tiktoken's BPE: the
same tokens as a direct rank-merging implementation, and as cl100k_base itself."""

from __future__ import annotations

import random

import pytest
from ferrolm.model.bpe_from_ranks import build_byte_level_bpe, byte_alphabet, load_tiktoken_ranks, merges_from_ranks
from tokenizers import Tokenizer

RANKS = 32000  # as the tiny model: enough for common English words


@pytest.fixture(scope="module")
def ranks() -> list[bytes]:
    return load_tiktoken_ranks("cl100k_base", limit=RANKS)


@pytest.fixture(scope="module")
def tokenizer(ranks: list[bytes]) -> Tokenizer:
    return build_byte_level_bpe(ranks, ["<|endoftext|>"])


def rank_bpe(piece: bytes, rank: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm, written plainly: a known word is one token; otherwise keep
    joining the adjacent pair whose join has the lowest rank (leftmost on a tie)."""
    if piece in rank:
        return [rank[piece]]
    parts = [bytes([b]) for b in piece]
    while True:
        candidates = [
            (rank[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in rank
        ]
        if not candidates:
            return [rank[p] for p in parts]
        _, i = min(candidates)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def varied_text(seed: int, length: int) -> str:
    rng = random.Random(seed)
    words = "the of and to in is that for it as with was on be by this are from at or an which".split()
    ranges = [(0x20, 0x7F), (0xA0, 0x250), (0x370, 0x400), (0x4E00, 0x4F00), (0x1F600, 0x1F650)]
    out = []
    for _ in range(length):
        kind = rng.random()
        if kind < 0.5:
            out.append(" " + rng.choice(words))
        elif kind < 0.6:
            out.append(rng.choice(["\n", "\n\n", "  ", "\t", " \r\n", "   x"]))
        elif kind < 0.7:
            out.append(str(rng.randrange(10**6)))
        else:
            lo, hi = rng.choice(ranges)
            out.append("".join(chr(rng.randrange(lo, hi)) for _ in range(rng.randrange(1, 6))))
    return "".join(out)


def test_the_lowest_ranks_are_the_256_single_bytes(ranks: list[bytes]) -> None:
    assert sorted(ranks[:256]) == [bytes([b]) for b in range(256)]
    assert all(len(t) >= 2 for t in ranks[256:])


def test_byte_alphabet_is_a_printable_bijection() -> None:
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert all(len(ch) == 1 and ch.isprintable() and not ch.isspace() for ch in alphabet)
    assert alphabet[ord("A")] == "A" and alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"


def test_merges_list_every_split_in_rank_order() -> None:
    tokens = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca"]
    assert merges_from_ranks(tokens) == [
        (b"a", b"b"),
        (b"b", b"c"),
        (b"a", b"bc"),  # both splits of "abc", the one with the lower-ranked first part first
        (b"ab", b"c"),
        (b"c", b"a"),
    ]


def test_matches_rank_merging_on_varied_text(ranks: list[bytes], tokenizer: Tokenizer) -> None:
    rank = {t: r for r, t in enumerate(ranks)}
    from_char = {ch: b for b, ch in enumerate(byte_alphabet())}
    text = varied_text(seed=1, length=1500)
    pieces = tokenizer.pre_tokenizer.pre_tokenize_str(text)
    expected = [i for piece, _ in pieces for i in rank_bpe(bytes(from_char[ch] for ch in piece), rank)]
    assert tokenizer.encode(text).ids == expected
    assert tokenizer.decode(expected) == text


# bpe-openai 0.1 reads its data through a deprecated importlib.resources call
@pytest.mark.filterwarnings("ignore:open_binary is deprecated:DeprecationWarning")
def test_matches_cl100k_where_its_tokens_are_all_kept(tokenizer: Tokenizer) -> None:
    import bpe_openai  # a dependency: its data is the tiny model's tokenizer

    cl100k = bpe_openai.get_encoding("cl100k_base")
    lines = [
        "hello world",
        "tiktoken is great!",
        "It is a truth universally acknowledged, that a single man in possession of a good fortune...",
        "def main():\n    return 0\n\n\n",
        "  leading spaces and trailing   ",
        "I'm sure they'll say it's fine, don't you think? We've seen THE END.",
        "1234567 + 89 = 1234656",
    ]
    compared = 0
    for line in lines:
        expected = cl100k.encode(line)
        if max(expected) < RANKS:  # the full vocabulary chose only tokens we kept
            assert tokenizer.encode(line).ids == expected, line
            compared += 1
    assert compared >= 5
    assert tokenizer.encode("hello world").ids == [15339, 1917]


def test_special_tokens_follow_the_ranks(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size(with_added_tokens=True) == RANKS + 1
    # cl100k ranks the printable bytes first, from "!" (rank 0): "a" is 97 - 33
    assert tokenizer.encode("a<|endoftext|>b").ids == [64, RANKS, 65]
    assert tokenizer.decode([64, RANKS, 65], skip_special_tokens=False) == "a<|endoftext|>b"


def test_vocabulary_without_every_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="every single byte"):
        build_byte_level_bpe([bytes([b]) for b in range(255)], [])
