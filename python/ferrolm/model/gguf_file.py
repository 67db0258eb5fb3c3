"""Reading a model from one GGUF file (llama.cpp's format): the configuration, the
tokenizer and the weights, all from the file's metadata and tensors, with no Hugging Face
folder beside it.

The file is parsed by llama.cpp's own ``gguf`` package over a memory map (its values as
plain numpy views of the mapping, see ``_reader_class``); tensor bytes are read only when
a tensor is dequantized (by the Rust core, ``_core.dequantize``), one tensor at a time,
into the float32 arrays the runners use, or copied as stored by the quant runner's core.
Every problem a file can have (truncated, corrupt, an architecture, tensor type or
tokenizer ferrolm does not handle) becomes an ``InvalidInputError`` whose ``field`` names
the metadata key or the tensor.

Names and layouts follow llama.cpp's converter (``convert_hf_to_gguf.py``): tensors are
renamed (``blk.0.attn_q.weight`` is ``model.layers.0.self_attn.q_proj.weight``), their
shapes are stored fastest axis first, and for the llama architecture the rows of the
query and key projections are permuted for llama.cpp's interleaved RoPE; reading undoes
that, since the runners rotate halves as Hugging Face does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ferrolm.errors import InvalidInputError
from ferrolm.model.config import _DEFAULT_RMS_EPS, _DEFAULT_ROPE_THETA, ModelConfig, RopeScaling
from ferrolm.model.weights import Weights, check_weights

GGUF_MAGIC = b"GGUF"

# general.architecture -> ferrolm's model_type
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
# llama.cpp rotates interleaved pairs for these and its converter permutes q/k rows to
# match; qwen2/qwen3 use the half-split ("neox") rotation as stored
PERMUTED_QK = ("llama", "mistral")

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# llama 3.1+ stores its RoPE scaling as per-frequency divisors instead of metadata
ROPE_FREQS = "rope_freqs.weight"
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_BYTE = 3, 4, 6

# tokenizer.ggml.pre -> the regexes llama.cpp splits text with before byte-level BPE,
# applied one after another (each splits the pieces of the previous one). The names are
# llama.cpp's; the expressions are those of the tokenizers the names stand for.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    splits: tuple[str, ...]
    # llama.cpp's llama3 family takes a piece that is itself a token whole, before any
    # merge (tiktoken's rule; it differs from merging on a few rare pieces), and puts BOS
    # in front unless the file says otherwise
    llama3_style: bool = False


_GPT2 = PreTokenizer((_GPT2_SPLIT,))
_DIGITS_THEN_GPT2 = PreTokenizer((r"\p{N}", _GPT2_SPLIT))
_LLAMA3 = PreTokenizer((_LLAMA3_SPLIT,), llama3_style=True)
_QWEN2 = PreTokenizer((_QWEN2_SPLIT,))
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    # a file without the key: llama.cpp's fallback is GPT-2's split
    "default": _GPT2,
    **{name: _GPT2 for name in ("gpt-2", "gpt2", "mpt", "olmo")},
    # GPT-2's split after cutting every digit apart
    **{
        name: _DIGITS_THEN_GPT2
        for name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva")
    },
    **{name: _LLAMA3 for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")},
    **{name: PreTokenizer((_LLAMA3_SPLIT,)) for name in ("dbrx", "smaug-bpe")},
    **{name: _QWEN2 for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
}
# token texts that end a turn in chat templates; llama.cpp stops on them too when the
# file marks them control tokens, though only one is named by tokenizer.ggml.eos_token_id
_END_OF_GENERATION_TEXTS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|return|>",
    "<|call|>",
)
# bump whenever the tokenizer files written for a GGUF change: the cache key carries it
TOKENIZER_FILES_VERSION = "1"


def is_gguf(model: str | os.PathLike[str]) -> bool:
    """Whether ``model`` names a GGUF file: a file named ``*.gguf`` (opening it then says
    what is wrong with it, if anything) or any file that starts with GGUF's magic bytes."""
    path = Path(model)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def _reader_class() -> type:
    """A ``gguf.GGUFReader`` that checks each tensor's entry before the package builds
    its array, so that a tensor of a type ferrolm cannot read, or whose bytes run past the
    end of the file, is reported by name instead of as a numpy reshape error."""
    import gguf

    from ferrolm import _core

    readable = set(_core.quant_types().values())

    class Reader(gguf.GGUFReader):  # type: ignore[misc]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
            # the package's own, over a plain ndarray view of the file's mapping instead of
            # the np.memmap itself: the ~300k values a 50k-token vocabulary's metadata is
            # parsed into are then plain arrays, not np.memmap objects with their attribute
            # dicts (SmolLM2's file: 71 MB while parsed instead of 158, 0.6 s instead of 2.1)
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            end = offset + np.dtype(dtype).itemsize * count
            array = plain[offset:end].view(dtype=dtype)[:count]
            return array.view(array.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            size = len(self.data)
            for field in fields:
                _, name_bytes, _, dims, raw_type, offset = field.parts
                name = bytes(name_bytes).decode("utf-8", errors="replace")
                type_id = int(raw_type[0])
                try:
                    type_name = gguf.GGMLQuantizationType(type_id).name
                except ValueError:
                    type_name = None
                if type_name is None or type_id not in readable:
                    known = ", ".join(sorted(_core.quant_types()))
                    what = f"type {type_name}" if type_name else f"unknown type id {type_id}"
                    raise InvalidInputError(f"GGUF tensor {name!r} has {what}; ferrolm reads {known}", name)
                elems = math.prod(int(d) for d in dims)
                block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
                if elems % block:
                    raise InvalidInputError(
                        f"GGUF tensor {name!r} has {elems} values, not whole {type_name} blocks of {block}", name
                    )
                end = start_offs + int(offset[0]) + elems // block * block_bytes
                if end > size:
                    raise InvalidInputError(
                        f"GGUF tensor {name!r} ends at byte {end} but the file has {size} bytes: the file is truncated",
                        name,
                    )
            super()._build_tensors(start_offs, fields)

    return Reader


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """The file parsed (metadata and tensor index; tensor bytes stay on disk)."""
    path = Path(path)
    try:
        return _reader_class()(path, "r")
    except InvalidInputError:
        raise
    except Exception as exc:  # the package raises ValueError, KeyError, IndexError ... on bad bytes
        raise InvalidInputError(
            f"{path.name} is not a readable GGUF file (truncated or corrupt metadata): {exc}", "model"
        ) from None


class Metadata:
    """Typed access to a GGUF file's key/value metadata; errors name the key."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.fields = reader.fields
        # decoded values: a vocabulary's arrays take a good part of a second to decode,
        # and the tokenizer and the EOS set both read them
        self._values: dict[str, Any] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        if field is None:
            return default
        if key not in self._values:
            try:
                self._values[key] = field.contents()
            except Exception as exc:
                raise InvalidInputError(f"GGUF metadata key {key!r} cannot be read: {exc}", key) from None
        return self._values[key]

    def elements(self, key: str, indices: list[int]) -> list[Any]:
        """The entries at ``indices`` (ascending) of the array ``key``, decoding only
        those; indices past its end, and a key that is absent or not an array, give none."""
        if key in self._values:
            values = self._values[key]
            return [values[i] for i in indices if i < len(values)] if isinstance(values, list) else []
        field = self.fields.get(key)
        if field is None or len(field.types) < 2:  # an array's types: ARRAY, then its items'
            return []
        try:
            return [field.contents(i) for i in indices if i < len(field.data)]
        except Exception as exc:
            raise InvalidInputError(f"GGUF metadata key {key!r} cannot be read: {exc}", key) from None

    def require(self, key: str) -> Any:
        if key not in self.fields:
            raise InvalidInputError(f"GGUF metadata has no key {key!r}", key)
        return self.get(key)

    def positive_int(self, key: str, default: int | None = None) -> int:
        value = self.require(key) if default is None else self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidInputError(f"GGUF metadata key {key!r} must be a positive integer, got {value!r}", key)
        return value

    def positive_float(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            raise InvalidInputError(f"GGUF metadata key {key!r} must be a positive number, got {value!r}", key)
        # the file stores float32: its shortest decimal is the number the model was
        # configured with (1e-05, not 9.999999747378752e-06)
        return float(str(np.float32(value))) if isinstance(value, float) else float(value)

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.get(key, default)
        if value is not None and not isinstance(value, str):
            raise InvalidInputError(f"GGUF metadata key {key!r} must be a string, got {value!r}", key)
        return value

    def token_id(self, key: str, vocab: int) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
            raise InvalidInputError(
                f"GGUF metadata key {key!r} must be a token id below the vocabulary size {vocab}, got {value!r}", key
            )
        return value

    def array(self, key: str) -> list[Any]:
        value = self.require(key)
        if not isinstance(value, list):
            raise InvalidInputError(f"GGUF metadata key {key!r} must be an array", key)
        return value


# ---------------------------------------------------------------- configuration


def read_config(meta: Metadata) -> ModelConfig:
    """The model configuration from ``general.architecture`` and the ``{arch}.*`` keys.

    The EOS set is left empty: ``end_of_generation_ids`` gives it, and the caller fills
    it in."""
    arch = meta.string("general.architecture")
    if arch is None:
        raise InvalidInputError("GGUF metadata has no key 'general.architecture'", "general.architecture")
    if arch not in ARCHITECTURES:
        raise InvalidInputError(
            f"GGUF metadata key 'general.architecture' is {arch!r}; ferrolm runs {', '.join(ARCHITECTURES)}",
            "general.architecture",
        )
    names = {t.name for t in meta.reader.tensors}
    hidden = meta.positive_int(f"{arch}.embedding_length")
    heads = meta.positive_int(f"{arch}.attention.head_count")
    kv_heads = meta.positive_int(f"{arch}.attention.head_count_kv", default=heads)
    if heads % kv_heads:
        raise InvalidInputError(
            f"GGUF metadata key '{arch}.attention.head_count_kv' ({kv_heads}) must divide "
            f"'{arch}.attention.head_count' ({heads})",
            f"{arch}.attention.head_count_kv",
        )
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise InvalidInputError(
            f"GGUF metadata key '{arch}.embedding_length' ({hidden}) is not a multiple of the head count ({heads})",
            f"{arch}.embedding_length",
        )
    head_dim = meta.positive_int(f"{arch}.attention.key_length", default=hidden // heads)
    value_dim = meta.positive_int(f"{arch}.attention.value_length", default=head_dim)
    if value_dim != head_dim or head_dim % 2:
        raise InvalidInputError(
            f"GGUF metadata: key length {head_dim} and value length {value_dim} must be equal and even",
            f"{arch}.attention.key_length",
        )
    rope_dims = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise InvalidInputError(
            f"GGUF metadata key '{arch}.rope.dimension_count' is {rope_dims!r}; ferrolm rotates the whole head "
            f"({head_dim})",
            f"{arch}.rope.dimension_count",
        )
    vocab = _vocab_size(meta, arch)
    layers = meta.positive_int(f"{arch}.block_count")
    config = ModelConfig(
        model_type=arch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=meta.positive_int(f"{arch}.feed_forward_length"),
        vocab_size=vocab,
        rms_norm_eps=meta.positive_float(f"{arch}.attention.layer_norm_rms_epsilon", _DEFAULT_RMS_EPS),
        rope_theta=meta.positive_float(f"{arch}.rope.freq_base", _DEFAULT_ROPE_THETA),
        rope_scaling=None,
        max_position_embeddings=meta.positive_int(f"{arch}.context_length"),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=meta.token_id("tokenizer.ggml.bos_token_id", vocab),
        eos_token_ids=(),
        qk_norm="blk.0.attn_q_norm.weight" in names,
        # qwen2's attention always has q/k/v biases (as transformers' config says); the
        # others have them where the file does
        qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        mlp_bias="blk.0.ffn_gate.bias" in names,
        sliding_window=_sliding_window(meta, arch),
    )
    return dataclasses.replace(config, rope_scaling=_rope_scaling(meta, arch, config))


def _vocab_size(meta: Metadata, arch: str) -> int:
    """``{arch}.vocab_size`` where written, else the embedding's rows."""
    if f"{arch}.vocab_size" in meta:
        return meta.positive_int(f"{arch}.vocab_size")
    for tensor in meta.reader.tensors:
        if tensor.name == "token_embd.weight" and len(tensor.shape) == 2:
            return int(tensor.shape[1])
    raise InvalidInputError("GGUF file has no tensor 'token_embd.weight'", "token_embd.weight")


def _sliding_window(meta: Metadata, arch: str) -> int | None:
    key = f"{arch}.attention.sliding_window"
    if key not in meta:
        return None
    if arch != "mistral":
        raise InvalidInputError(f"GGUF metadata key {key!r}: a sliding window is supported for mistral only", key)
    return meta.positive_int(key)


def _rope_scaling(meta: Metadata, arch: str, config: ModelConfig) -> RopeScaling | None:
    key = f"{arch}.rope.scaling.type"
    kind = meta.string(key, "none")
    if kind == "linear":
        return RopeScaling("linear", meta.positive_float(f"{arch}.rope.scaling.factor", 1.0))
    if kind == "yarn":
        return _yarn_scaling(meta, arch, config)
    if kind not in ("none", None):
        raise InvalidInputError(
            f"GGUF metadata key {key!r} is {kind!r}; ferrolm supports 'none', 'linear' and 'yarn'", key
        )
    factors = next((t for t in meta.reader.tensors if t.name == ROPE_FREQS), None)
    if factors is None:
        return None
    return _llama3_scaling(meta, arch, config, factors)


def _yarn_scaling(meta: Metadata, arch: str, config: ModelConfig) -> RopeScaling:
    """YaRN as llama.cpp's converter writes it (Qwen2.5 / Qwen3 long-context files): the
    factor and the original context; the betas where given (32 and 1 otherwise) and the
    attention factor YaRN's default. DeepSeek's log multiplier is refused by its key."""
    from ferrolm.model.config import yarn_attention_factor

    log_key = f"{arch}.rope.scaling.yarn_log_multiplier"
    if meta.get(log_key) is not None:
        raise InvalidInputError(f"GGUF metadata key {log_key!r}: YaRN with a log multiplier is not supported", log_key)
    factor_key = f"{arch}.rope.scaling.factor"
    factor = meta.positive_float(factor_key, meta.require(factor_key))
    original = meta.positive_int(f"{arch}.rope.scaling.original_context_length")
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=original,
        beta_fast=meta.positive_float(f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=meta.positive_float(f"{arch}.rope.scaling.yarn_beta_slow", 1.0),
        attention_factor=yarn_attention_factor(factor),
    )


def _llama3_scaling(meta: Metadata, arch: str, config: ModelConfig, tensor: Any) -> RopeScaling | None:
    """Llama 3.1+ files hold the llama3 scaling as its result: one divisor per frequency.
    The parameters are recovered (the largest divisor is the factor; Meta's released
    models all use low/high frequency factors 1 and 4) and accepted only if they give
    the stored divisors back."""
    from ferrolm.model.rope import inverse_frequencies

    divisors = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
    if divisors.size != config.head_dim // 2 or not np.all(np.isfinite(divisors)) or divisors.min() <= 0:
        raise InvalidInputError(
            f"GGUF tensor {ROPE_FREQS!r} must hold head_dim / 2 = {config.head_dim // 2} positive divisors", ROPE_FREQS
        )
    if np.allclose(divisors, 1.0):
        return None
    original = meta.positive_int(f"{arch}.rope.scaling.original_context_length", default=8192)
    scaling = RopeScaling("llama3", float(divisors.max()), 1.0, 4.0, original)
    plain = inverse_frequencies(dataclasses.replace(config, rope_scaling=None))
    scaled = inverse_frequencies(dataclasses.replace(config, rope_scaling=scaling))
    if not np.allclose(plain / scaled, divisors, rtol=1e-4):
        raise InvalidInputError(
            f"GGUF tensor {ROPE_FREQS!r} holds RoPE frequency divisors that are not llama3 scaling "
            f"(factor {scaling.factor}, low/high frequency factors 1 and 4, original context {original})",
            ROPE_FREQS,
        )
    return scaling


# ---------------------------------------------------------------- tokenizer


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    """The tokenizer a GGUF describes, as an HF ``tokenizers`` tokenizer plus the settings
    ``tokenizer_config.json`` would hold."""

    hf: Any  # tokenizers.Tokenizer
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    # every token id that ends a generation: eos first, then end-of-turn markers
    eos_token_ids: tuple[int, ...]


def read_tokenizer(meta: Metadata) -> GGUFTokenizer:
    """Builds the tokenizer from ``tokenizer.ggml.*``: byte-level BPE (``gpt2``) with the
    pre-tokenizer ``tokenizer.ggml.pre`` names, or a SentencePiece BPE vocabulary
    (``llama``: scores, byte fallback, "▁" for spaces)."""
    kind = meta.string("tokenizer.ggml.model")
    if kind is None:
        raise InvalidInputError("GGUF metadata has no key 'tokenizer.ggml.model'", "tokenizer.ggml.model")
    tokens = meta.array("tokenizer.ggml.tokens")
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise InvalidInputError(
            "GGUF metadata key 'tokenizer.ggml.tokens' must be a non-empty list of strings", "tokenizer.ggml.tokens"
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise InvalidInputError(
            f"GGUF metadata key 'tokenizer.ggml.token_type' has {len(types)} entries for {len(tokens)} tokens",
            "tokenizer.ggml.token_type",
        )
    if kind == "gpt2":
        pre = _pre_tokenizer(meta)
        hf = _byte_level_bpe(meta, tokens, pre)
        add_bos_default = pre.llama3_style
    elif kind == "llama":
        hf = _sentencepiece_bpe(meta, tokens, types)
        add_bos_default = True  # llama.cpp's default for SentencePiece vocabularies
    else:
        raise InvalidInputError(
            f"GGUF metadata key 'tokenizer.ggml.model' is {kind!r}; ferrolm builds 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece) tokenizers",
            "tokenizer.ggml.model",
        )
    from tokenizers import AddedToken

    # whole-token matching of control tokens (<|im_start|>) and of user-defined ones
    # (<think>): without it the text "<|im_start|>" would be cut into pieces
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_CONTROL]
    plain = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_USER_DEFINED]
    hf.add_special_tokens(special)
    hf.add_tokens(plain)

    vocab = len(tokens)
    bos = meta.token_id("tokenizer.ggml.bos_token_id", vocab)
    eos = meta.token_id("tokenizer.ggml.eos_token_id", vocab)
    add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
    _set_post_processor(hf, tokens, bos if add_bos else None, eos if add_eos else None)
    return GGUFTokenizer(
        hf,
        bos_token=None if bos is None else tokens[bos],
        eos_token=None if eos is None else tokens[eos],
        chat_template=meta.string("tokenizer.chat_template"),
        eos_token_ids=end_of_generation_ids(meta, vocab),
    )


def end_of_generation_ids(meta: Metadata, vocab: int) -> tuple[int, ...]:
    """Every token id that ends a generation, as llama.cpp's end-of-generation set: the
    EOS, end-of-turn and end-of-message ids the metadata names, then the control tokens
    whose text is a known turn end (a chat model's file often names only one of them)."""
    ids = [
        i
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (i := meta.token_id(key, vocab)) is not None
    ]
    types = meta.get("tokenizer.ggml.token_type") or []
    controls = [i for i, k in enumerate(types) if k == _TOKEN_CONTROL]
    # the control tokens' texts only: the whole vocabulary as Python strings would leave the
    # process several MB larger for good (the heap it fragments)
    texts = meta.elements("tokenizer.ggml.tokens", controls)
    ids += [i for i, t in zip(controls, texts) if t in _END_OF_GENERATION_TEXTS]
    return tuple(dict.fromkeys(ids))


def _pre_tokenizer(meta: Metadata) -> PreTokenizer:
    name = meta.string("tokenizer.ggml.pre", "default") or "default"
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise InvalidInputError(
            f"GGUF metadata key 'tokenizer.ggml.pre' is {name!r}, a pre-tokenizer ferrolm does not know; "
            f"known: {', '.join(sorted(PRE_TOKENIZERS))}",
            "tokenizer.ggml.pre",
        )
    return pre


def _byte_level_bpe(meta: Metadata, tokens: list[str], pre: PreTokenizer) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges_raw = meta.array("tokenizer.ggml.merges")
    merges = []
    for i, merge in enumerate(merges_raw):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2:
            raise InvalidInputError(
                f"GGUF metadata key 'tokenizer.ggml.merges' entry {i} ({merge!r}) is not two tokens apart by a space",
                "tokenizer.ggml.merges",
            )
        merges.append((parts[0], parts[1]))
    vocab = _vocab_dict(tokens)
    try:
        model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.llama3_style)
    except Exception as exc:  # a merge of tokens not in the vocabulary
        raise InvalidInputError(
            f"the GGUF tokenizer cannot be built from 'tokenizer.ggml.merges': {exc}", "tokenizer.ggml.merges"
        ) from None
    hf = Tokenizer(model)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece_bpe(meta: Metadata, tokens: list[str], types: list[int]) -> Any:
    """SentencePiece's BPE as ``tokenizers`` runs Llama 2 / Mistral: merges in the order
    of the merged token's score, bytes the vocabulary lacks as ``<0xNN>`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scores = meta.array("tokenizer.ggml.scores")
    if len(scores) != len(tokens):
        raise InvalidInputError(
            f"GGUF metadata key 'tokenizer.ggml.scores' has {len(scores)} entries for {len(tokens)} tokens",
            "tokenizer.ggml.scores",
        )
    vocab = _vocab_dict(tokens)
    unk = meta.token_id("tokenizer.ggml.unknown_token_id", len(tokens))
    # a merge (a, b) for each way to cut a normal token into two tokens of the vocabulary,
    # ranked by the merged token's score (higher merges first), then by the pieces' ids
    ranked = []
    for token, token_id in vocab.items():
        if types[token_id] in (_TOKEN_CONTROL, _TOKEN_BYTE):
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[token_id]), vocab[left], vocab[right], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    model = models.BPE(
        vocab=vocab, merges=merges, unk_token=None if unk is None else tokens[unk], fuse_unk=True, byte_fallback=True
    )
    hf = Tokenizer(model)
    add_space = meta.get("tokenizer.ggml.add_space_prefix", True)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    hf.decoder = decoders.Sequence(steps)
    return hf


def _vocab_dict(tokens: list[str]) -> dict[str, int]:
    """Token text -> id; a text listed twice keeps its first id (the later entry is
    unreachable by text in llama.cpp too)."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return vocab


def _set_post_processor(hf: Any, tokens: list[str], bos: int | None, eos: int | None) -> None:
    from tokenizers import processors

    if bos is None and eos is None:
        return
    first = f"{tokens[bos]} " if bos is not None else ""
    last = f" {tokens[eos]}" if eos is not None else ""
    special = [(tokens[i], i) for i in dict.fromkeys(i for i in (bos, eos) if i is not None)]
    hf.post_processor = processors.TemplateProcessing(
        single=f"{first}$A{last}", pair=f"{first}$A{last} {first}$B{last}", special_tokens=special
    )


# ---------------------------------------------------------------- weights


def read_weights(reader: Any, config: ModelConfig) -> Weights:
    """Every tensor the forward pass reads, dequantized to float32 and renamed and
    reshaped as in a Hugging Face checkpoint."""
    from ferrolm import _core

    weights: Weights = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name is None:
            continue
        raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        values = _core.dequantize(raw, int(tensor.tensor_type))
        shape = tuple(reversed([int(d) for d in tensor.shape]))
        array = values.reshape(shape)
        if config.model_type in PERMUTED_QK and name.endswith(("q_proj.weight", "q_proj.bias")):
            array = unpermute(array, config.num_heads, tensor.name)
        elif config.model_type in PERMUTED_QK and name.endswith(("k_proj.weight", "k_proj.bias")):
            array = unpermute(array, config.num_kv_heads, tensor.name)
        weights[name] = array
    if config.tie_word_embeddings and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    try:
        check_weights(weights, config)
    except InvalidInputError as exc:
        raise InvalidInputError(f"GGUF file: {exc}", _gguf_name_in(str(exc))) from None
    return weights


def hf_tensor_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor the forward pass reads, else ``None``."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    match = _LAYER_NAME.fullmatch(name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
    return None


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face tensor name (the inverse of ``hf_tensor_name``)."""
    for gguf_name, hf in _GLOBAL_TENSORS.items():
        if hf == hf_name:
            return gguf_name
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if match:
        for gguf_name, hf in _LAYER_TENSORS.items():
            if hf == match.group(2):
                return f"blk.{match.group(1)}.{gguf_name}"
    return hf_name


def _gguf_name_in(message: str) -> str | None:
    match = re.search(r"'([^']+)'", message)
    return gguf_tensor_name(match.group(1)) if match else None


def unpermute(array: np.ndarray, heads: int, name: str) -> np.ndarray:
    """Undoes the converter's row permutation of a query/key projection: within each
    head, llama.cpp's order interleaves the two halves that Hugging Face keeps apart."""
    rows = array.shape[0]
    if rows % (2 * heads):
        raise InvalidInputError(f"GGUF tensor {name!r} has {rows} rows, not a whole number of heads ({heads})", name)
    half = rows // heads // 2
    return np.ascontiguousarray(array.reshape(heads, half, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape))


def permute_for_gguf(array: np.ndarray, heads: int) -> np.ndarray:
    """The converter's permutation (the inverse of ``unpermute``), for writing files."""
    rows = array.shape[0]
    half = rows // heads // 2
    return np.ascontiguousarray(array.reshape(heads, 2, half, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape))


# ---------------------------------------------------------------- tokenizer files


def tokenizer_folder(path: str | os.PathLike[str], *, meta: Metadata | None = None) -> Path:
    """A folder holding ``tokenizer.json`` and ``tokenizer_config.json`` for the GGUF at
    ``path``: what ``Tokenizer.from_folder`` and the Rust front end read. Written once
    into ``$FERROLM_CACHE/gguf-tokenizers/``, keyed by the file's path, size and
    modification time (a changed file gets a new folder), and reused afterwards.
    ``meta``: the file already opened, if the caller has it."""
    from ferrolm.model.tiny import cache_root

    path = Path(path).resolve()
    stat = path.stat()
    key = xxhash.xxh3_64_hexdigest(f"{TOKENIZER_FILES_VERSION}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    folder = cache_root() / "gguf-tokenizers" / f"{path.stem[:64]}-{key}"
    if (folder / "tokenizer.json").is_file():
        return folder
    tokenizer = read_tokenizer(meta if meta is not None else Metadata(open_gguf(path)))
    folder.parent.mkdir(parents=True, exist_ok=True)
    # written beside the final place and renamed: a reader never sees half a folder, and
    # of two processes writing at once one simply wins
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=folder.parent))
    try:
        staging.chmod(0o755)
        write_tokenizer_files(tokenizer, staging)
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def write_tokenizer_files(tokenizer: GGUFTokenizer, folder: Path) -> None:
    tokenizer.hf.save(str(folder / "tokenizer.json"))
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "clean_up_tokenization_spaces": False,
        # the EOS set is not a tokenizer_config.json field; kept for readers of the folder
        "ferrolm_eos_token_ids": list(tokenizer.eos_token_ids),
    }
    if tokenizer.chat_template is not None:
        settings["chat_template"] = tokenizer.chat_template
    (folder / "tokenizer_config.json").write_text(
        json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
