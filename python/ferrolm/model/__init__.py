"""The model side of ferrolm: configs, weights, tokenizers and the forward pass.

``load_model("tiny" | folder | file.gguf)`` gives ``(config, weights, tokenizer, folder,
gguf)``; a ``NumpyRunner`` (float32 numpy), a ``TorchRunner`` (torch, CPU or CUDA, any
dtype) or a ``QuantRunner`` (GGUF block formats, the forward in the Rust core) runs the
forward pass over a paged KV pool, one ``ForwardBatch`` per engine step.
"""

from ferrolm.model.config import ModelConfig, RopeScaling
from ferrolm.model.loader import LoadedModel, load_model
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.runner import ForwardBatch, ModelRunner, NumpyRunner
from ferrolm.model.tokenizer import Tokenizer
from ferrolm.model.torch_runner import TorchRunner  # imports torch only when one is built
from ferrolm.model.weights import Weights, load_weights

__all__ = [
    "ForwardBatch",
    "LoadedModel",
    "ModelConfig",
    "ModelRunner",
    "NumpyRunner",
    "QuantRunner",
    "RopeScaling",
    "Tokenizer",
    "TorchRunner",
    "Weights",
    "load_model",
    "load_weights",
]
