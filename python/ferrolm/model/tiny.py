"""The embedded default model ``tiny``: a small Llama with random weights from a fixed
seed and a real byte-level BPE tokenizer (the lowest ranks of ``cl100k_base``).

It is made here, without a network, and written as an ordinary Hugging Face folder in a
cache directory on first use, so every other part of ferrolm loads it like any model.
Its text is gibberish; its purpose is to make the whole stack run on a fresh machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, processors

from ferrolm.model.bpe_from_ranks import build_byte_level_bpe, load_tiktoken_ranks
from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import random_weights

# bump whenever anything below changes what gets written: the folder name carries it, so
# a stale cache is never read
TINY_VERSION = "2"
TINY_SEED = 20261130
BPE_RANKS = 32000  # the first 32,000 cl100k_base tokens (ranks 0..255 are the single bytes)
BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, IM_START, IM_END]
# as in Qwen's tokenizers, the markers of tool calls and of thinking are tokens of their
# own, but not special ones: they are text that the output keeps (and that the constraint
# engine can see), and a single logit bias forces one
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
# ChatML, and tools the Hermes way (Qwen 2.5's convention, written anew): the functions in
# the system turn, calls as JSON in <tool_call> tags, results in <tool_response> tags.
# Messages without tools render as plain ChatML.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'You can call functions. Their signatures:\\n<tools>\\n' }}"
    "{% for tool in tools %}{{ (tool | tojson) + '\\n' }}{% endfor %}"
    "{{ '</tools>\\nTo call one, write a JSON object with its name and arguments in <tool_call></tool_call> "
    'tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>'
    "<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% set arguments = function['arguments'] if function['arguments'] is string "
    "else (function['arguments'] | tojson) %}"
    "{{ ('\\n' if (message['content'] or not loop.first) else '') + '<tool_call>\\n{\"name\": ' "
    "+ (function['name'] | tojson) + ', \"arguments\": ' + arguments + '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_POSITIONS = 4096


def tiny_config() -> ModelConfig:
    bos_id = BPE_RANKS + SPECIAL_TOKENS.index(BOS)
    return ModelConfig(
        model_type="llama",
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=352,
        vocab_size=BPE_RANKS + len(SPECIAL_TOKENS) + len(ADDED_TOKENS),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        # a plain completion ends with end_of_text, a chat turn with im_end
        eos_token_ids=(BPE_RANKS + SPECIAL_TOKENS.index(EOS), BPE_RANKS + SPECIAL_TOKENS.index(IM_END)),
    )


def cache_root() -> Path:
    """``$FERROLM_CACHE``, else ``~/.cache/ferrolm``."""
    configured = os.environ.get("FERROLM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ferrolm"


def tiny_folder() -> Path:
    """The folder holding ``tiny``, built on first call and reused afterwards."""
    folder = cache_root() / f"tiny-{TINY_VERSION}"
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        # build beside the final place and rename: a reader never sees a half-written
        # folder, and of two processes building at once one simply wins
        staging = Path(tempfile.mkdtemp(prefix=f".tiny-{TINY_VERSION}-", dir=folder.parent))
        try:
            staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            write_tiny(staging)
            try:
                staging.rename(folder)
            except OSError:
                if not folder.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def write_tiny(folder: Path) -> None:
    """Writes the model as a Hugging Face folder into ``folder`` (which must exist)."""
    config = tiny_config()
    tokens = load_tiktoken_ranks("cl100k_base", limit=BPE_RANKS)
    tokenizer = build_byte_level_bpe(tokens, SPECIAL_TOKENS)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    assert tokenizer.get_vocab_size(with_added_tokens=True) == config.vocab_size
    bos_id = config.bos_token_id
    assert bos_id is not None
    # like Llama 3: encoding a text puts BOS in front
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))

    weights = tiny_weights(config)
    # a tied checkpoint stores the embedding once
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})

    eos_ids = list(config.eos_token_ids)
    _write_json(folder / "config.json", config.to_hf_dict())
    _write_json(folder / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_ids})
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {
                str(BPE_RANKS + i): {
                    "content": t,
                    "special": t in SPECIAL_TOKENS,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                }
                for i, t in enumerate(SPECIAL_TOKENS + ADDED_TOKENS)
            },
        },
    )


def tiny_weights(config: ModelConfig) -> dict[str, np.ndarray]:
    """The weights of version 1 (random from ``TINY_SEED``, drawn for the vocabulary
    without ``ADDED_TOKENS``) with embedding rows for the added tokens drawn after them
    from their own seed: every other weight stays as it was."""
    base = dataclasses.replace(config, vocab_size=config.vocab_size - len(ADDED_TOKENS))
    weights = random_weights(base, TINY_SEED)
    extra = random_weights(dataclasses.replace(config, vocab_size=len(ADDED_TOKENS)), TINY_SEED + 1)
    embed = np.concatenate([weights["model.embed_tokens.weight"], extra["model.embed_tokens.weight"]])
    weights["model.embed_tokens.weight"] = weights["lm_head.weight"] = embed
    return weights


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
