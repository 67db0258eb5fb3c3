"""GGUF files written by the tests themselves with the ``gguf`` package's GGUFWriter: a
random llama of the embedded ``tiny`` model's layout and tokenizer (widened from 128 to
256 so that rows hold whole k-quant blocks of 256 weights) with tensors in every block
format ferrolm reads, and an HF folder of exactly the weights the file encodes, so that
loading one and the other can be compared.

Float and legacy-quant tensors are quantized from tiny's weights with gguf-py's own
quantizers; gguf-py cannot quantize the k-quants, so those tensors are random blocks
(random codes and scale bytes, f16 super-scales chosen so the weights stay small). Both
kinds are decoded for the HF folder by gguf-py's reference dequantizer, not ferrolm's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from ferrolm.model.config import ModelConfig
from ferrolm.model.loader import LoadedModel, load_model
from ferrolm.model.random_weights import random_weights
from safetensors.numpy import save_file

# the block format of each tensor of the file, by Hugging Face name suffix and layer:
# every format appears, on tensors of several shapes ("down": the down projection's, where
# it differs from the rest of the MLP)
LAYER_TYPES: list[dict[str, str]] = [
    {"attn": "Q4_K", "mlp": "Q5_K"},
    {"attn": "Q6_K", "mlp": "Q8_0", "down": "Q5_0"},
    {"attn": "Q4_0", "mlp": "Q4_1", "down": "Q5_1"},
    {"attn": "F16", "mlp": "BF16"},
]
EMBED_TYPE = "Q8_0"

_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}

# f16 super-scale byte offsets inside each k-quant block, and a value that keeps the
# weights of random codes within about +-0.05
_K_SCALES = {"Q4_K": ((0, 4e-5), (2, 2e-4)), "Q5_K": ((0, 2e-5), (2, 2e-4)), "Q6_K": ((208, 1e-4),)}


def wide_tiny(folder: Path, **config_changes: Any) -> LoadedModel:
    """tiny's tokenizer and layers, hidden size 256 (head_dim 64) and MLP 768, random
    weights from a fixed seed, written as an HF folder at ``folder`` and loaded.
    ``config_changes``: other ``ModelConfig`` fields (``model_type="qwen2"``, ...)."""
    tiny = load_model("tiny", with_weights=False)
    assert tiny.folder is not None
    config = dataclasses.replace(tiny.config, hidden_size=256, head_dim=64, intermediate_size=768, **config_changes)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny.folder / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2), encoding="utf-8")
    weights = random_weights(config, 20261205)
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return load_model(folder)


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order of a query/key projection's rows (per head, the two
    halves interleaved), written here from its description."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(type_name: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """uint8 ``[rows, bytes per row]`` of random k-quant blocks with moderate scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, block_bytes), dtype=np.uint8)
    for offset, value in _K_SCALES[type_name]:
        scales = (rng.uniform(0.5, 1.5, size=data.shape[:2]) * value).astype(np.float16)
        data[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(*data.shape[:2], 2)
    if type_name == "Q6_K":
        # the signed sub-block scales: small, so that weights stay small
        data[:, :, 192:208] = rng.integers(-8, 9, size=(*data.shape[:2], 16)).astype(np.int8).view(np.uint8)
    return data.reshape(rows, -1)


def encode(type_name: str, w: np.ndarray, seed: int) -> np.ndarray:
    """``w`` (float32, HF shape) in ``type_name``: raw file bytes (or floats for F32/F16)."""
    import gguf

    if type_name in _K_SCALES:
        return random_k_blocks(type_name, w.shape, seed)
    if type_name == "F32":
        return w.astype(np.float32)
    if type_name == "F16":
        return w.astype(np.float16)
    return gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType[type_name])


def decode(type_name: str, data: np.ndarray) -> np.ndarray:
    """gguf-py's reference dequantization of what ``encode`` wrote."""
    import gguf

    if type_name in ("F32", "F16"):
        return data.astype(np.float32)
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name]).astype(np.float32)


def tokenizer_metadata(folder: Path) -> dict[str, Any]:
    """tokens, token types and merges of an HF byte-level BPE ``tokenizer.json``."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}
    for added in spec["added_tokens"]:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = 3 if added["special"] else 4
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokens": tokens, "types": [types[i] for i in range(len(tokens))], "merges": merges}


def write_tiny_gguf(
    model: LoadedModel,
    path: Path,
    *,
    arch: str = "llama",
    hf_folder: Path | None = None,
    overrides: dict[str, Any] | None = None,
    tensor_types: dict[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Writes ``model`` (tiny) as a GGUF of ``arch`` at ``path``; returns the HF-named
    float32 weights the file encodes (decoded by gguf-py) and, given ``hf_folder``,
    writes them there as an HF folder with tiny's tokenizer and config.

    ``overrides``: metadata keys to set instead (a value of ``None`` leaves the key out);
    ``tensor_types``: GGUF tensor name -> type name, instead of ``LAYER_TYPES``."""
    import gguf

    c = model.config
    assert model.folder is not None
    writer = gguf.GGUFWriter(str(path), arch=arch)
    overrides = dict(overrides or {})
    tok = tokenizer_metadata(model.folder)
    settings = json.loads((model.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    keys: dict[str, Any] = {
        f"{arch}.block_count": c.num_layers,
        f"{arch}.context_length": c.max_position_embeddings,
        f"{arch}.embedding_length": c.hidden_size,
        f"{arch}.feed_forward_length": c.intermediate_size,
        f"{arch}.attention.head_count": c.num_heads,
        f"{arch}.attention.head_count_kv": c.num_kv_heads,
        f"{arch}.attention.layer_norm_rms_epsilon": c.rms_norm_eps,
        f"{arch}.rope.freq_base": c.rope_theta,
        f"{arch}.rope.dimension_count": c.head_dim,
        f"{arch}.vocab_size": c.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tok["tokens"],
        "tokenizer.ggml.token_type": tok["types"],
        "tokenizer.ggml.merges": tok["merges"],
        "tokenizer.ggml.bos_token_id": c.bos_token_id,
        "tokenizer.ggml.eos_token_id": c.eos_token_ids[0],
        "tokenizer.ggml.eot_token_id": c.eos_token_ids[1],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": settings["chat_template"],
    }
    keys |= overrides
    for key, value in keys.items():
        if value is None:
            continue
        _add(writer, key, value)

    weights = dict(model.weights)
    del weights["lm_head.weight"]  # tied: the file has no output.weight
    encoded: dict[str, np.ndarray] = {}
    for seed, (hf_name, w) in enumerate(sorted(weights.items())):
        name, type_name = _gguf_name_and_type(hf_name, w)
        type_name = (tensor_types or {}).get(name, type_name)
        layout = w
        heads = c.num_heads if "q_proj" in hf_name else c.num_kv_heads if "k_proj" in hf_name else 0
        if heads and arch in ("llama", "mistral"):
            layout = permute_qk(w, heads)
        data = encode(type_name, layout, seed)
        raw_dtype = None if type_name in ("F32", "F16") else gguf.GGMLQuantizationType[type_name]
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
        decoded = decode(type_name, data).reshape(w.shape)
        if heads and arch in ("llama", "mistral"):
            decoded = unpermute_qk(decoded, heads)
        encoded[hf_name] = np.ascontiguousarray(decoded)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    if hf_folder is not None:
        hf_folder.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
            shutil.copy(model.folder / name, hf_folder / name)
        save_file(encoded, str(hf_folder / "model.safetensors"), metadata={"format": "pt"})
    return encoded


def _gguf_name_and_type(hf_name: str, w: np.ndarray) -> tuple[str, str]:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight", EMBED_TYPE
    if hf_name == "model.norm.weight":
        return "output_norm.weight", "F32"
    _, _, layer, rest = hf_name.split(".", 3)
    name = f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}"
    if w.ndim == 1:
        return name, "F32"
    types = LAYER_TYPES[int(layer)]
    if rest.startswith("self_attn"):
        return name, types["attn"]
    return name, types.get("down", types["mlp"]) if rest.startswith("mlp.down_proj") else types["mlp"]


def _add(writer: Any, key: str, value: Any) -> None:
    import gguf

    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], int):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    else:
        writer.add_array(key, value)


def write_metadata_gguf(
    path: Path, arch: str, config: ModelConfig, keys: dict[str, Any], tensors: dict[str, np.ndarray] | None = None
) -> Path:
    """A GGUF of one block's hyperparameters (context 4096), ``keys`` (str, int as uint32,
    float as float32) and ``tensors``: enough for the metadata reader, no weights."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(1)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_heads)
    writer.add_context_length(4096)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_vocab_size(config.vocab_size)
    for key, value in keys.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, value)
    for name, tensor in (tensors or {}).items():
        writer.add_tensor(name, tensor)
    for out in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        out()
    return path
