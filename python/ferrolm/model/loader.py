"""``load_model``: a model by name (``"tiny"``) or Hugging Face folder, ready to run."""

from __future__ import annotations

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
            "ferrolm never downloads weights: pass the path of a Hugging Face model folder"
        )
    return folder


def load_model(model: str | Path) -> LoadedModel:
    """Reads config.json, the safetensors weights (float32) and the tokenizer."""
    folder = resolve_model_folder(model)
    config = ModelConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise InvalidInputError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config field 'vocab_size' is {config.vocab_size}"
        )
    return LoadedModel(config, load_weights(folder, config), tokenizer)
