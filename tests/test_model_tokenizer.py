"""Reading a tokenizer folder: the special tokens and chat template in their various
Hugging Face spellings, and the errors of a broken folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model.tokenizer import Tokenizer
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, models, pre_tokenizers

WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "[INST]", "[/INST]"]
LLAMA2_STYLE_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "{% for m in messages %}{{ bos_token }}[INST] {{ m['content'] }} [/INST]{% endfor %}"
)


def write_folder(folder: Path, settings: dict[str, Any] | None) -> Path:
    hf = HfTokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(folder / "tokenizer.json"))
    if settings is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def test_plain_settings(tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(write_folder(tmp_path, {"bos_token": "<s>", "eos_token": "</s>"}))
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, len(WORDS))
    ids = tok.encode("hello world")
    assert ids.dtype == np.int32 and ids.tolist() == [3, 4]
    assert tok.decode(ids) == "hello world"


def test_special_tokens_written_as_objects(tmp_path: Path) -> None:
    settings = {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": {"content": "</s>"}}
    tok = Tokenizer.from_folder(write_folder(tmp_path, settings))
    assert (tok.bos_token, tok.eos_token_id) == ("<s>", 2)


def test_folder_without_tokenizer_config_has_no_specials(tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(write_folder(tmp_path, None))
    assert tok.bos_token_id is None and tok.eos_token_id is None and tok.chat_template is None
    with pytest.raises(InvalidInputError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hello"}])


@pytest.mark.parametrize("spelling", ["string", "named list", "separate file"])
def test_chat_template_in_each_spelling(tmp_path: Path, spelling: str) -> None:
    settings: dict[str, Any] = {"bos_token": "<s>"}
    if spelling == "string":
        settings["chat_template"] = LLAMA2_STYLE_TEMPLATE
    elif spelling == "named list":
        settings["chat_template"] = [
            {"name": "tool_use", "template": "unused"},
            {"name": "default", "template": LLAMA2_STYLE_TEMPLATE},
        ]
    else:
        (tmp_path / "chat_template.jinja").write_text(LLAMA2_STYLE_TEMPLATE)
    tok = Tokenizer.from_folder(write_folder(tmp_path, settings))
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert prompt == "<s>[INST] hello [/INST]"


def test_template_exception_becomes_invalid_input(tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(write_folder(tmp_path, {"chat_template": LLAMA2_STYLE_TEMPLATE}))
    with pytest.raises(InvalidInputError, match="no system role"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])


def test_template_is_sandboxed_and_has_json(tmp_path: Path) -> None:
    template = "{{ messages[0]['content'] | tojson }}{{ messages.__class__.__mro__ }}"
    tok = Tokenizer.from_folder(write_folder(tmp_path, {"chat_template": template}))
    with pytest.raises(InvalidInputError, match="chat template failed"):
        tok.apply_chat_template([{"role": "user", "content": "é"}])
    tok.chat_template = "{{ messages[0]['content'] | tojson }}"
    assert tok.apply_chat_template([{"role": "user", "content": "é<>"}]) == '"é<>"'


def test_bos_token_outside_the_vocabulary_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="'bos_token'.*<|begin_of_text|>"):
        Tokenizer.from_folder(write_folder(tmp_path, {"bos_token": "<|begin_of_text|>"}))


def test_missing_or_broken_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="tokenizer.json could not be read"):
        Tokenizer.from_folder(tmp_path)
    write_folder(tmp_path, None)
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(InvalidInputError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_folder(tmp_path)


def test_token_bytes_of_a_sentencepiece_vocabulary(tmp_path: Path) -> None:
    # Llama 2 / Mistral style: "▁" is a space, "<0xNN>" a raw byte
    vocab = {"<unk>": 0, "<s>": 1, "<0x0A>": 2, "<0xE2>": 3, "\u2581hello": 4, "world": 5}
    hf = HfTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    hf.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    hf.add_special_tokens(["<s>"])
    tok = Tokenizer(hf, bos_token="<s>")
    assert tok.token_bytes() == [b"<unk>", b"<s>", b"\n", b"\xe2", b" hello", b"world"]
    assert tok.special_token_ids == [1]


def test_token_bytes_of_a_plain_vocabulary(tmp_path: Path) -> None:
    tok = Tokenizer.from_folder(write_folder(tmp_path, None))
    assert tok.token_bytes(vocab_size=9) == [w.encode() for w in WORDS] + [b"", b""]
