"""The tokenizer of a Hugging Face model folder: ``tokenizer.json`` (run by the
``tokenizers`` library) plus what ``tokenizer_config.json`` adds: the BOS/EOS tokens and
the chat template."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.bpe_from_ranks import byte_alphabet


class Tokenizer:
    """Text to token ids and back, and chat messages to a prompt."""

    def __init__(
        self,
        hf: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
        path: Path | None = None,
    ) -> None:
        self._hf: tokenizers.Tokenizer | None = hf
        # the tokenizer.json it was read from, to read again after ``release``
        self._path = path
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self.bos_token_id = self._id_of("bos_token", bos_token)
        self.eos_token_id = self._id_of("eos_token", eos_token)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The ``tokenizers`` tokenizer (read again from its file after ``release``)."""
        hf = self._hf
        if hf is None:
            assert self._path is not None
            hf = self._hf = _read_tokenizer_json(self._path)
        return hf

    def release(self) -> None:
        """Frees the tokenizer's tables (a 50k-token BPE takes about 10 MB) until they are
        next used, for a process whose tokenizing is done elsewhere: ``ferrolm serve``,
        whose Rust front end reads ``tokenizer.json`` itself. A tokenizer not read from a
        file keeps its tables."""
        if self._path is not None:
            self._hf = None

    def _id_of(self, field: str, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self.hf.token_to_id(token)
        if token_id is None:
            raise InvalidInputError(
                f"tokenizer_config.json field {field!r} names {token!r}, which is not in the vocabulary"
            )
        return int(token_id)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise InvalidInputError(f"model folder {folder.name!r} has no tokenizer.json")
        hf = _read_tokenizer_json(path)
        settings: dict[str, Any] = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.exists():
            try:
                settings = json.loads(config_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"tokenizer_config.json is not valid JSON: {exc}") from None
        template = _chat_template(settings.get("chat_template"))
        template_file = folder / "chat_template.jinja"  # newer transformers save it apart
        if template is None and template_file.exists():
            template = template_file.read_text(encoding="utf-8")
        return cls(
            hf,
            bos_token=_token_text(settings.get("bos_token")),
            eos_token=_token_text(settings.get("eos_token")),
            chat_template=template,
            path=path,
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    @property
    def special_token_ids(self) -> list[int]:
        """Ids of the special tokens (BOS, EOS, chat markers, ...), in increasing order."""
        return sorted(int(i) for i, token in self.hf.get_added_tokens_decoder().items() if token.special)

    def token_bytes(self, vocab_size: int | None = None) -> list[bytes]:
        """``out[i]``: the bytes token i stands for in decoded text, for the engine core's
        incremental detokenizer and constraint vocabulary. Padded with ``b""`` up to
        ``vocab_size`` (models often have more logits than tokens).

        Byte-level vocabularies (GPT-2 style: Llama 3, Qwen) spell bytes as printable
        characters; SentencePiece ones (Llama 2, Mistral) write a space as "▁" and raw
        bytes as "<0xNN>". Added tokens stand for their text.
        """
        vocab = self.hf.get_vocab(with_added_tokens=True)
        out = [b""] * max(vocab_size or 0, self.vocab_size, max(vocab.values(), default=-1) + 1)
        added = set(self.hf.get_added_tokens_decoder())
        decoder = json.loads(self.hf.decoder.__getstate__()) if self.hf.decoder is not None else {}
        style = _decoder_style(decoder)
        from_char = {ch: b for b, ch in enumerate(byte_alphabet())}
        for text, token_id in vocab.items():
            if token_id in added:
                out[token_id] = text.encode()
            elif style == "byte_level" and all(ch in from_char for ch in text):
                out[token_id] = bytes(from_char[ch] for ch in text)
            elif style == "sentencepiece" and _BYTE_FALLBACK.fullmatch(text):
                out[token_id] = bytes([int(text[3:5], 16)])
            elif style == "sentencepiece":
                out[token_id] = text.replace("\u2581", " ").encode()
            else:
                out[token_id] = text.encode()
        return out

    def encode(self, text: str, *, add_special_tokens: bool = True) -> np.ndarray:
        """int32 token ids. ``add_special_tokens`` applies the tokenizer's template (e.g.
        a leading BOS); text that came from ``apply_chat_template`` already has its own."""
        return np.asarray(self.hf.encode(text, add_special_tokens=add_special_tokens).ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """Renders chat messages (``{"role": ..., "content": ...}``) into the prompt text
        the model was trained on, as transformers does, with the server's template engine
        (``_core.render_chat_template``); ``variables`` are more template variables
        (``tools``, ``chat_template_kwargs``)."""
        if self.chat_template is None:
            raise InvalidInputError("this model has no chat template (tokenizer_config.json 'chat_template')")
        return _core.render_chat_template(
            self.chat_template,
            json.dumps(list(messages)),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            variables_json=json.dumps(variables) if variables else None,
        )


def _read_tokenizer_json(path: Path) -> tokenizers.Tokenizer:
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on a malformed file
        raise InvalidInputError(f"tokenizer.json could not be read: {exc}") from None


def _token_text(value: Any) -> str | None:
    # older tokenizer_config.json files store special tokens as AddedToken objects
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(value: Any) -> str | None:
    # a string, or a list of named templates of which "default" is the chat one
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return str(entry["template"])
    return None


_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _decoder_style(decoder: dict[str, Any]) -> str:
    """``byte_level``, ``sentencepiece`` or ``plain``, from tokenizer.json's decoder."""
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {part.get("type") for part in parts if isinstance(part, dict)}
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"Metaspace", "ByteFallback"} or any(
        part.get("type") == "Replace" and part.get("pattern", {}).get("String") == "\u2581" for part in parts
    ):
        return "sentencepiece"
    return "plain"
