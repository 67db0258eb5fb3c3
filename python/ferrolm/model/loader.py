"""``load_model``: a model by name (``"tiny"``) or Hugging Face folder, ready to run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

from ferrolm.errors import InvalidInputError
from ferrolm.model.config import ModelConfig
from ferrolm.model.tiny import tiny_folder
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.model.weights import Weights, load_weights

EMBEDDED_MODELS = ("tiny",)


class LoadedModel(NamedTuple):
    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer


def resolve_model_folder(model: str | Path) -> Path:
    """The folder of an embedded model (built on first use) or the given folder."""
    if isinstance(model, str) and model in EMBEDDED_MODELS:
        return tiny_folder()
    folder = Path(model)
    if not folder.is_dir():
        raise InvalidInputError(
            f"model {str(model)!r} is neither an embedded model {EMBEDDED_MODELS} nor a folder; "
            "ferrolm never downloads weights: pass the path of a Hugging Face model folder",
            "model",
        )
    return folder


def load_model(model: str | Path) -> LoadedModel:
    """Reads config.json, the safetensors weights (float32) and the tokenizer.

    ``config.eos_token_ids`` also gets the EOS ids of ``generation_config.json``: chat
    models often stop on a turn-end token that only that file names.
    """
    folder = resolve_model_folder(model)
    config = ModelConfig.from_folder(folder)
    extra_eos = [i for i in _generation_eos_ids(folder) if i not in config.eos_token_ids]
    if extra_eos:
        config = dataclasses.replace(config, eos_token_ids=(*config.eos_token_ids, *extra_eos))
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise InvalidInputError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config field 'vocab_size' is {config.vocab_size}"
        )
    return LoadedModel(config, load_weights(folder, config), tokenizer)


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
