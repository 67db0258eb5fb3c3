"""The model configuration, read from a Hugging Face ``config.json``.

Only the Llama family is supported (Llama 2/3, Mistral, Qwen2, Qwen3): they share one
forward pass and differ in a handful of switches (biases, q/k norm, RoPE scaling, sliding
window), which this module turns into explicit fields so the runners never look at
``model_type``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferrolm.errors import InvalidInputError

# model_type -> the architecture name transformers gives it
SUPPORTED_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_MODEL_TYPE_OF_ARCHITECTURE = {arch: mt for mt, arch in SUPPORTED_MODEL_TYPES.items()}

# transformers' per-model defaults for fields a config.json may leave out
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}
_DEFAULT_RMS_EPS = 1e-6
_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` (divide every frequency), ``llama3`` (divide
    only the low frequencies, blend the middle band) or ``yarn`` (interpolate the low
    frequencies, keep the high ones, ramp between the dimensions that turn ``beta_slow``
    and ``beta_fast`` times over the original context; cos and sin multiplied by
    ``attention_factor``)."""

    rope_type: str
    factor: float
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # llama3 and yarn
    original_max_position_embeddings: int = 8192
    # yarn only
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the forward pass needs to know about a Llama-family model."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # Qwen3 normalizes each head of q and k (RMSNorm over head_dim) before RoPE
    qk_norm: bool = False
    # biases on the q, k, v projections (Qwen2 always; Llama/Qwen3 with attention_bias)
    qkv_bias: bool = False
    # bias on the output projection (Llama/Qwen3 with attention_bias; never Qwen2)
    o_bias: bool = False
    mlp_bias: bool = False
    # Mistral: a query attends only to the last `sliding_window` positions (itself included)
    sliding_window: int | None = None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_slot(self, itemsize: int = 4) -> int:
        """Bytes one token slot of the KV pool takes, keys and values of every layer
        (``itemsize`` 4 for the float32 pool), for sizing the pool to a memory budget."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        """Reads ``config.json`` of a Hugging Face model folder."""
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidInputError(f"model folder {str(folder)!r} has no config.json") from None
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path.name} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidInputError("config.json must hold a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Builds a config from the parsed ``config.json`` of a supported model."""
        model_type = _model_type(raw)
        hidden = _positive_int(raw, "hidden_size")
        heads = _positive_int(raw, "num_attention_heads")
        kv_heads = _positive_int(raw, "num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise InvalidInputError(
                f"config field 'num_key_value_heads' ({kv_heads}) must divide 'num_attention_heads' ({heads})"
            )
        # Qwen3's transformers config defaults head_dim to 128; the others derive it
        derived_head_dim = 128 if model_type == "qwen3" else None
        if raw.get("head_dim") is None and derived_head_dim is None:
            if hidden % heads:
                raise InvalidInputError(
                    f"config field 'hidden_size' ({hidden}) is not a multiple of "
                    f"'num_attention_heads' ({heads}) and 'head_dim' is not given"
                )
            derived_head_dim = hidden // heads
        head_dim = _positive_int(raw, "head_dim", default=derived_head_dim)
        if head_dim % 2:
            raise InvalidInputError(f"config field 'head_dim' must be even for RoPE, got {head_dim}")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise InvalidInputError(f"config field 'hidden_act' is {act!r}; only 'silu' is supported")

        rope_theta, rope_scaling = _rope(raw, raw.get("max_position_embeddings"))
        attention_bias = _bool(raw, "attention_bias", default=False)
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=_positive_int(raw, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_positive_int(raw, "intermediate_size"),
            vocab_size=_positive_int(raw, "vocab_size"),
            rms_norm_eps=_positive_float(raw, "rms_norm_eps", default=_DEFAULT_RMS_EPS),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_positive_int(
                raw, "max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[model_type]
            ),
            tie_word_embeddings=_bool(raw, "tie_word_embeddings", default=False),
            bos_token_id=_optional_token_id(raw, "bos_token_id"),
            eos_token_ids=_token_ids(raw, "eos_token_id"),
            qk_norm=model_type == "qwen3",
            qkv_bias=model_type == "qwen2" or (model_type != "mistral" and attention_bias),
            o_bias=model_type in ("llama", "qwen3") and attention_bias,
            mlp_bias=model_type == "llama" and _bool(raw, "mlp_bias", default=False),
            sliding_window=_sliding_window(raw, model_type),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` content that reads back as this config."""
        out: dict[str, Any] = {
            "architectures": [SUPPORTED_MODEL_TYPES[self.model_type]],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
            "torch_dtype": "float32",
        }
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            scaling: dict[str, Any] = {"rope_type": rs.rope_type, "factor": rs.factor}
            if rs.rope_type == "llama3":
                scaling |= {
                    "low_freq_factor": rs.low_freq_factor,
                    "high_freq_factor": rs.high_freq_factor,
                    "original_max_position_embeddings": rs.original_max_position_embeddings,
                }
            elif rs.rope_type == "yarn":
                scaling |= {
                    "original_max_position_embeddings": rs.original_max_position_embeddings,
                    "beta_fast": rs.beta_fast,
                    "beta_slow": rs.beta_slow,
                    "attention_factor": rs.attention_factor,
                    "truncate": rs.truncate,
                }
            out["rope_scaling"] = scaling
        if self.model_type == "qwen2":
            if self.o_bias or not self.qkv_bias:
                raise InvalidInputError("a qwen2 config always has q/k/v biases and no output bias")
        elif self.model_type == "mistral":
            if self.qkv_bias or self.o_bias:
                raise InvalidInputError("a mistral config has no attention biases")
        else:
            if self.qkv_bias != self.o_bias:
                raise InvalidInputError(f"a {self.model_type} config has biases on all of q/k/v/o or none")
            out["attention_bias"] = self.qkv_bias
        if self.mlp_bias:
            out["mlp_bias"] = True
        if self.model_type == "mistral":
            out["sliding_window"] = self.sliding_window
        elif self.sliding_window is not None:
            raise InvalidInputError(f"a {self.model_type} config with a sliding window is not supported")
        return out


def _model_type(raw: dict[str, Any]) -> str:
    model_type = raw.get("model_type")
    if model_type is None:
        archs = raw.get("architectures") or []
        known = [_MODEL_TYPE_OF_ARCHITECTURE[a] for a in archs if a in _MODEL_TYPE_OF_ARCHITECTURE]
        if not known:
            raise InvalidInputError(
                f"config field 'model_type' is missing and 'architectures' ({archs!r}) names no "
                f"supported architecture; supported: {sorted(_MODEL_TYPE_OF_ARCHITECTURE)}"
            )
        model_type = known[0]
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InvalidInputError(
            f"config field 'model_type' is {model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    archs = raw.get("architectures")
    if archs and not any(a in _MODEL_TYPE_OF_ARCHITECTURE for a in archs):
        raise InvalidInputError(
            f"config field 'architectures' is {archs!r}; supported: {sorted(_MODEL_TYPE_OF_ARCHITECTURE)}"
        )
    return str(model_type)


_MISSING: Any = object()


def _get(raw: dict[str, Any], field: str, default: Any, label: str) -> Any:
    value = raw.get(field)
    if value is None:
        if default is _MISSING or default is None:
            raise InvalidInputError(f"config field {label!r} is missing")
        return default
    return value


def _positive_int(raw: dict[str, Any], field: str, default: Any = _MISSING, *, within: str = "") -> int:
    """``within`` names the object holding the field, for the message (``rope_scaling.``)."""
    label = within + field
    value = _get(raw, field, default, label)
    # bool is an int in Python; `true` is never a meaningful size
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInputError(f"config field {label!r} must be a positive integer, got {value!r}")
    return value


def _positive_float(raw: dict[str, Any], field: str, default: Any = _MISSING, *, within: str = "") -> float:
    label = within + field
    value = _get(raw, field, default, label)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise InvalidInputError(f"config field {label!r} must be a positive number, got {value!r}")
    return float(value)


def _bool(raw: dict[str, Any], field: str, default: bool) -> bool:
    value = raw.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInputError(f"config field {field!r} must be true or false, got {value!r}")
    return value


def _optional_token_id(raw: dict[str, Any], field: str) -> int | None:
    value = raw.get(field)
    if value is None:
        return None
    if isinstance(value, list):  # some configs list one id
        if len(value) != 1:
            raise InvalidInputError(f"config field {field!r} must be one token id, got {value!r}")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"config field {field!r} must be a token id, got {value!r}")
    return value


def _token_ids(raw: dict[str, Any], field: str) -> tuple[int, ...]:
    value = raw.get(field)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidInputError(f"config field {field!r} must be a token id or a list of them, got {value!r}")
    return tuple(values)


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's default cos/sin multiplier, ``0.1 * mscale * ln(factor) + 1`` (1 when not
    stretched)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _rope(raw: dict[str, Any], max_positions: Any) -> tuple[float, RopeScaling | None]:
    # transformers 5 moved theta and scaling into `rope_parameters`; older configs use
    # `rope_theta` + `rope_scaling`
    params = raw.get("rope_parameters")
    scaling: Any
    if isinstance(params, dict):
        theta = _positive_float(
            params, "rope_theta", default=raw.get("rope_theta") or _DEFAULT_ROPE_THETA, within="rope_parameters."
        )
        scaling, where = params, "rope_parameters"
    else:
        theta = _positive_float(raw, "rope_theta", default=_DEFAULT_ROPE_THETA)
        scaling, where = raw.get("rope_scaling"), "rope_scaling"
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise InvalidInputError(f"config field {where!r} must be an object or null, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3", "yarn"):
        raise InvalidInputError(
            f"config field '{where}.rope_type' is {rope_type!r}; supported: 'default', 'linear', 'llama3', 'yarn'"
        )
    within = where + "."
    if rope_type == "yarn":
        return theta, _yarn(scaling, within, max_positions)
    factor = _positive_float(scaling, "factor", within=within)
    if rope_type == "linear":
        return theta, RopeScaling("linear", factor)
    low = _positive_float(scaling, "low_freq_factor", within=within)
    high = _positive_float(scaling, "high_freq_factor", within=within)
    if high <= low:
        raise InvalidInputError(
            f"config field '{where}.high_freq_factor' ({high}) must exceed '{where}.low_freq_factor' ({low})"
        )
    original = _positive_int(scaling, "original_max_position_embeddings", within=within)
    return theta, RopeScaling("llama3", factor, low, high, original)


def _yarn(scaling: dict[str, Any], within: str, max_positions: Any) -> RopeScaling:
    """YaRN's parameters as transformers reads them: the original context defaults to
    ``max_position_embeddings``, the factor to their ratio, the attention factor to
    ``yarn_attention_factor`` (with DeepSeek's ``mscale`` / ``mscale_all_dim`` where both
    are given), ``beta_fast`` / ``beta_slow`` to 32 / 1."""
    default_original = max_positions if max_positions is not None else _MISSING
    original = _positive_int(scaling, "original_max_position_embeddings", default=default_original, within=within)
    if scaling.get("factor") is None and isinstance(max_positions, int):
        factor = max_positions / original
    else:
        factor = _positive_float(scaling, "factor", within=within)
    if scaling.get("attention_factor") is not None:
        attention = _positive_float(scaling, "attention_factor", within=within)
    elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
        mscale = _positive_float(scaling, "mscale", within=within)
        mscale_all_dim = _positive_float(scaling, "mscale_all_dim", within=within)
        attention = yarn_attention_factor(factor, mscale) / yarn_attention_factor(factor, mscale_all_dim)
    else:
        attention = yarn_attention_factor(factor)
    beta_fast = _positive_float(scaling, "beta_fast", default=32.0, within=within) if scaling.get("beta_fast") else 32.0
    beta_slow = _positive_float(scaling, "beta_slow", default=1.0, within=within) if scaling.get("beta_slow") else 1.0
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise InvalidInputError(f"config field '{within}truncate' must be true or false, got {truncate!r}")
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=original,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        attention_factor=attention,
        truncate=truncate,
    )


def _sliding_window(raw: dict[str, Any], model_type: str) -> int | None:
    if model_type in ("qwen2", "qwen3"):
        # Qwen's window applies only to some layers; never enabled in released checkpoints
        if _bool(raw, "use_sliding_window", default=False):
            raise InvalidInputError("config field 'use_sliding_window' is true; Qwen sliding window is not supported")
        return None
    if model_type == "mistral" and raw.get("sliding_window") is not None:
        return _positive_int(raw, "sliding_window")
    return None
