"""A Hugging Face byte-level BPE tokenizer built from tiktoken ranks, with no network.

tiktoken's BPE keeps a word as one token when it is in the vocabulary, and otherwise
repeatedly joins the adjacent pair of parts whose concatenation has the lowest rank.
Hugging Face's BPE joins the adjacent pair that comes first in its merge list. Listing,
for every token, each split into two vocabulary tokens, in order of the token's rank,
makes the two procedures take the same steps; ``ignore_merges`` gives the whole-word
shortcut. Hugging Face's byte-level models spell bytes as printable characters (the
GPT-2 byte alphabet), so vocabulary and merges are written in that alphabet.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# cl100k_base's pre-tokenizer: contractions, words with one leading non-letter, numbers
# of up to three digits, punctuation runs, newlines, other whitespace
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def load_tiktoken_ranks(name: str = "cl100k_base", limit: int | None = None) -> list[bytes]:
    """The tokens of a tiktoken vocabulary shipped in the ``bpe-openai`` package, by rank
    (only ranks below ``limit`` when given)."""
    data = _bpe_openai_data(f"{name}.tiktoken.gz")
    by_rank: dict[int, bytes] = {}
    for line in gzip.decompress(data).splitlines():
        token, rank = line.split()
        if limit is None or int(rank) < limit:
            by_rank[int(rank)] = base64.b64decode(token)
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ValueError(f"{name}: ranks are not 0..{len(by_rank) - 1}")
    return [by_rank[r] for r in range(len(by_rank))]


def _bpe_openai_data(file: str) -> bytes:
    # find the package without importing it: its __init__ eagerly builds encoders (slow,
    # and it warns); only its data files are needed here
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the package 'bpe-openai' is needed to build the tiny tokenizer")
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / file
        if path.exists():
            return path.read_bytes()
    raise FileNotFoundError(f"bpe-openai ships no data file {file!r}")


def byte_alphabet() -> list[str]:
    """``alphabet[b]``: the character GPT-2's byte-level BPE writes for byte ``b``.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) are
    moved, in order, to the code points from 256 up.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet: list[str] = [""] * 256
    moved = 0
    for b in range(256):
        if b in printable:
            alphabet[b] = chr(b)
        else:
            alphabet[b] = chr(256 + moved)
            moved += 1
    return alphabet


def merges_from_ranks(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Every split of every multi-byte token into two tokens of the vocabulary, ordered by
    the rank of the token they form (ties: by the ranks of the parts)."""
    rank = {t: r for r, t in enumerate(tokens)}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for r, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in rank and right in rank:
                merges.append((r, rank[left], rank[right], left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def build_byte_level_bpe(tokens: list[bytes], special_tokens: list[str]) -> Tokenizer:
    """A tokenizer whose ids ``0..len(tokens)-1`` are ``tokens`` (which must include all 256
    single bytes) followed by ``special_tokens``."""
    if not {bytes([b]) for b in range(256)} <= set(tokens):
        raise ValueError("a byte-level vocabulary must contain every single byte")
    alphabet = byte_alphabet()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spell(t): i for i, t in enumerate(tokens)}
    merges = [(spell(a), spell(b)) for a, b in merges_from_ranks(tokens)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated", invert=False),
            # the regex already split the text: ByteLevel only maps bytes to the alphabet
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return tokenizer
