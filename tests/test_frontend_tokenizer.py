"""The Rust front end's tokenizer: the pre-tokenizer's split regex is run by hand for the
common byte-level BPE patterns (cl100k / Llama 3, the tiny model's; Qwen 2's; GPT-2's) and
must give the ids the ``tokenizers`` package gives, on every kind of text; any other
pattern runs as the package runs it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from ferrolm import _core
from ferrolm.bench.serve import make_requests
from ferrolm.errors import InvalidInputError
from ferrolm.model.tiny import tiny_folder
from tokenizers import Tokenizer

QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHOSEN = [
    "",
    "Hello world",
    "  leading and trailing  ",
    "x  y",
    " ",
    "\n",
    "'",
    "'s",
    " 's",
    " !",
    " 1",
    "I'm sure you'll say it's what we'd've done; THEY'RE, 'S 'sx 'ſ ''s",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000 ٣٤٥ 一二三 ⅣⅫ ²³",
    "tabs\tand\t\tnewlines\n\n\r\n  \n x\n\ny \n   \n\t\t\n",
    "punct!!! ... ?!\n\n(parens) [brackets] {braces} \"quotes\" 'single'",
    "unicode: héllo naïve café Ελληνικά русский 中文字符 日本語 한국어 עברית العربية",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 combining e\u0301 a\u0308",
    "nbsp\u00a0here\u2003em\u3000ideo \u0085nel \u2028ls",
    'code: fn main() { let x = vec![1, 2, 3]; println!("{x:?}"); }\n',
    "special tokens inside: <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>hm</think>",
]


def random_texts(count: int, seed: int) -> list[str]:
    alphabet = list("aZé字ſK1٣²Ⅳ 'sStTrReEvVmMlLdD\t\r\n\u00a0\u3000\u0085.,!?-_\"😀\u0301\u200d") + [
        "  ",
        "\n\n",
        "<|im_end|>",
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(count)]


def bench_prompts() -> list[str]:
    out = []
    for r in make_requests(12, seed=0, output_lens=(16, 64, 128)):
        out.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in r.messages))
    return out


def with_pre_tokenizer(tmp_path: Path, name: str, pre_tokenizer: dict) -> Path:
    raw = json.loads((tiny_folder() / "tokenizer.json").read_text())
    raw["pre_tokenizer"] = pre_tokenizer
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return path


def variants(tmp_path: Path) -> dict[str, tuple[Path, bool]]:
    """tokenizer.json files and whether the hand-written split should take each."""
    tiny = tiny_folder() / "tokenizer.json"
    split = json.loads(tiny.read_text())["pre_tokenizer"]
    qwen = json.loads(json.dumps(split))
    qwen["pretokenizers"][0]["pattern"]["Regex"] = QWEN2
    other = json.loads(json.dumps(split))
    other["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|[^\w\s]+|\s+"
    return {
        "tiny": (tiny, True),
        "qwen2": (with_pre_tokenizer(tmp_path, "qwen2", qwen), True),
        "gpt2": (
            with_pre_tokenizer(
                tmp_path,
                "gpt2",
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ),
            True,
        ),
        "gpt2-prefix": (
            with_pre_tokenizer(
                tmp_path,
                "gpt2p",
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            ),
            True,
        ),
        "other-regex": (with_pre_tokenizer(tmp_path, "other", other), False),
    }


@pytest.mark.parametrize("name", ["tiny", "qwen2", "gpt2", "gpt2-prefix", "other-regex"])
def test_the_front_ends_ids_are_the_tokenizers_packages(tmp_path: Path, name: str) -> None:
    path, fast = variants(tmp_path)[name]
    reference = Tokenizer.from_file(str(path))
    texts = CHOSEN + random_texts(1500, seed=len(name)) + bench_prompts()
    for special in (False, True):
        got, was_fast = _core.frontend_encode(str(path), texts, add_special_tokens=special)
        assert was_fast == fast
        want = [e.ids for e in reference.encode_batch(texts, add_special_tokens=special)]
        for text, g, w in zip(texts, got, want):
            assert g == w, f"{name}: {text!r}"


def test_an_unreadable_file_is_an_invalid_input(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{")
    with pytest.raises(InvalidInputError, match="tokenizer.json could not be read"):
        _core.frontend_encode(str(bad), ["x"])
