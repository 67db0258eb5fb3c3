"""``load_model``: a model by name (``"tiny"``), Hugging Face folder or GGUF file, ready to run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

from ferrolm.errors import InvalidInputError
from ferrolm.model import gguf_file
from ferrolm.model.config import ModelConfig
from ferrolm.model.tiny import tiny_folder
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.model.weights import Weights, load_weights

EMBEDDED_MODELS = ("tiny",)


class LoadedModel(NamedTuple):
    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer
    # the folder it was read from, for runners that read the checkpoint themselves
    folder: Path | None = None
    # the GGUF file it was read from, for the runner that keeps its weights quantized
    gguf: Path | None = None


def resolve_model_folder(model: str | Path) -> Path:
    """The folder of an embedded model (built on first use), the given folder, or for a
    GGUF file the folder of the tokenizer files made from it (``tokenizer.json`` and
    ``tokenizer_config.json``, written once into the cache; it holds no weights)."""
    if isinstance(model, str) and model in EMBEDDED_MODELS:
        return tiny_folder()
    if gguf_file.is_gguf(model):
        return gguf_file.tokenizer_folder(model)
    folder = Path(model)
    if not folder.is_dir():
        raise InvalidInputError(
            f"model {str(model)!r} is neither an embedded model {EMBEDDED_MODELS}, a folder nor a GGUF file; "
            "ferrolm never downloads weights: pass the path of a Hugging Face model folder or of a .gguf file",
            "model",
        )
    return folder


def tokenizer_json_path(model: str | Path) -> Path:
    """The ``tokenizer.json`` of ``model`` (embedded, folder or GGUF file), for readers
    that take a path (the Rust HTTP front end)."""
    return resolve_model_folder(model) / "tokenizer.json"


def load_model(model: str | Path, *, with_weights: bool = True) -> LoadedModel:
    """Reads config.json, the safetensors weights (float32) and the tokenizer.

    The EOS ids are those Hugging Face tools stop on, in this order, without repeats:
    ``config.json``'s ``eos_token_id``, ``generation_config.json``'s (chat models often
    stop on a turn-end token only that file names) and the tokenizer's ``eos_token``
    (``tokenizer_config.json``). A model needs at least one of the three; transformers
    writes Qwen2/Qwen3 configs without ``eos_token_id``.

    ``with_weights=False`` leaves ``weights`` empty, for a runner that reads the
    checkpoint itself (from ``folder``) in its own dtype.

    A GGUF file (``model`` is its path) gives everything from its metadata and tensors
    (``gguf_file``): ``gguf`` is the file (the quantized runner reads its weights as
    stored), ``weights`` those weights dequantized to float32 (for the numpy and torch
    runners) unless ``with_weights=False``, and ``folder`` is ``None``.
    """
    if not (isinstance(model, str) and model in EMBEDDED_MODELS) and gguf_file.is_gguf(model):
        return _load_gguf(Path(model), with_weights)
    folder = resolve_model_folder(model)
    config = ModelConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise InvalidInputError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config field 'vocab_size' is {config.vocab_size}"
        )
    tokenizer_eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    eos_ids = list(config.eos_token_ids)
    for i in (*_generation_eos_ids(folder), *tokenizer_eos):
        if i not in eos_ids:
            eos_ids.append(i)
    if not eos_ids:
        raise InvalidInputError(
            "the model names no EOS token: none of config.json 'eos_token_id', generation_config.json "
            "'eos_token_id' or tokenizer_config.json 'eos_token' is set",
            "model",
        )
    out_of_range = [i for i in eos_ids if i >= config.vocab_size]
    if out_of_range:
        raise InvalidInputError(
            f"EOS token id(s) {out_of_range} are not below config field 'vocab_size' ({config.vocab_size})"
        )
    if tuple(eos_ids) != config.eos_token_ids:
        config = dataclasses.replace(config, eos_token_ids=tuple(eos_ids))
    weights = load_weights(folder, config) if with_weights else {}
    return LoadedModel(config, weights, tokenizer, folder)


def _generation_eos_ids(folder: Path) -> list[int]:
    path = folder / "generation_config.json"
    if not path.exists():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise InvalidInputError(f"generation_config.json is not a valid JSON object: {exc}") from None
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise InvalidInputError(f"generation_config.json field 'eos_token_id' must be token ids, got {value!r}")
    return ids


def _load_gguf(path: Path, with_weights: bool) -> LoadedModel:
    reader = gguf_file.open_gguf(path)
    meta = gguf_file.Metadata(reader)
    config = gguf_file.read_config(meta)
    tokenizer = Tokenizer.from_folder(gguf_file.tokenizer_folder(path, meta=meta))
    if tokenizer.vocab_size > config.vocab_size:
        raise InvalidInputError(
            f"the GGUF tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is {config.vocab_size}",
            "tokenizer.ggml.tokens",
        )
    eos_ids = gguf_file.end_of_generation_ids(meta, config.vocab_size)
    if not eos_ids:
        raise InvalidInputError(
            "the GGUF file names no EOS token: 'tokenizer.ggml.eos_token_id' is not set and no control token "
            "ends a turn",
            "tokenizer.ggml.eos_token_id",
        )
    config = dataclasses.replace(config, eos_token_ids=eos_ids)
    if not with_weights:
        return LoadedModel(config, {}, tokenizer, None, path)
    return LoadedModel(config, gguf_file.read_weights(reader, config), tokenizer, None, path)
