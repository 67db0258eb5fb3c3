"""Checkpoints as transformers writes them: for each architecture a small random model
built with transformers (``LlamaForCausalLM(LlamaConfig(...))``, Qwen2, Qwen3, Mistral),
``save_pretrained`` in float32 and bf16 (two of them in shards), loaded with ``load_model``
and run on the numpy and the torch runner; logits compared with transformers' own forward
on the same prompts, in every way the engine feeds a runner: a whole prefill, a chunked
prefill, a suffix over a cached prefix, and a batch of decodes of different lengths.

Tolerances: float32, 1e-4 absolute on logits of up to ~11 (the numpy runner, the torch
runner in float32, and the numpy runner on a bf16 checkpoint against transformers run in
float32 on the same bf16 weights; measured 4e-6 to 9e-6); bf16, 2e-2 of the largest logit
(the torch runner in bf16 against transformers in bf16: both round logits of ~8 to bf16,
whose step there is 0.06, so an absolute 2e-2 is finer than bf16 itself; measured 0.09 to
0.11, where transformers' own bf16 forward is 0.10 to 0.13 from its float32 one). Greedy
choices identical in float32 wherever the top two logits are not a near tie.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrolm.model.loader import load_model
from ferrolm.model.random_weights import random_weights
from ferrolm.model.reference import reference_logits
from ferrolm.model.runner import ForwardBatch, ModelRunner, NumpyRunner
from small_models import SMALL_MODEL_OVERRIDES, TORCH_TEST_DEVICE, small_config

torch: Any = pytest.importorskip(
    "torch", reason="torch is not installed; the transformers checkpoint tests are skipped"
)
transformers: Any = pytest.importorskip(
    "transformers", reason="transformers is not installed; the transformers checkpoint tests are skipped"
)

from ferrolm.model.torch_runner import TorchRunner  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

VOCAB = 97
COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # a short original context, so the scaling matters at these lengths
    "original_max_position_embeddings": 32,
    "rope_theta": 500000.0,
}
# architecture -> (config class, model class, settings beyond COMMON)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE}),
    # Llama 2 shape with every bias and tied embeddings
    "llama-biases-tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 1}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 5}),
}
SHARDED = {"llama3", "qwen3"}  # these are saved in several safetensors files
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
PROMPT_A = [int(i) for i in np.random.default_rng(21).integers(3, VOCAB, 30)]
PROMPT_B = PROMPT_A[:11] + [int(i) for i in np.random.default_rng(22).integers(3, VOCAB, 8)]


def randomize(model: Any, seed: int) -> None:
    """Weights of a size that makes logits of order ten (transformers' init gives ~0,
    where any tolerance passes): norms near 1, biases near 0, projections that keep
    activations of order one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
            if name.endswith("norm.weight"):
                value = 1 + 0.2 * u
            elif name.endswith(".bias"):
                value = 0.1 * u
            elif "embed_tokens" in name or "lm_head" in name:
                value = 0.3 * math.sqrt(3) * u
            else:
                value = math.sqrt(3 / p.shape[1]) * u
            p.copy_(value.to(p.dtype))


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer whose EOS comes only from tokenizer_config.json (a Qwen
    config written by transformers has no eos_token_id)."""
    import tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


@dataclass
class Checkpoint:
    folder: Path
    dtype: str
    logits_a: np.ndarray  # transformers' logits of every position of PROMPT_A, float64
    logits_b: np.ndarray
    # transformers in float32 on the checkpoint's (maybe bf16-rounded) weights
    logits_a_f32: np.ndarray
    logits_b_f32: np.ndarray


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.fixture(
    scope="module", params=[(a, d) for a in ARCHITECTURES for d in TOLERANCE], ids=lambda p: f"{p[0]}-{p[1]}"
)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    arch, dtype = request.param
    config_class, model_class, settings = ARCHITECTURES[arch]
    config = getattr(transformers, config_class)(**(COMMON | settings))
    model = getattr(transformers, model_class)(config)
    randomize(model, seed=len(arch))
    folder = tmp_path_factory.mktemp(f"{arch}-{dtype}")
    model.to(getattr(torch, dtype)).save_pretrained(folder, max_shard_size="40KB" if arch in SHARDED else "50GB")
    write_tokenizer(folder)
    del model

    def reloaded(as_dtype: str) -> Any:
        """The checkpoint as a transformers user runs it (eager attention: its reference)."""
        cls = getattr(transformers, model_class)
        return cls.from_pretrained(folder, dtype=getattr(torch, as_dtype), attn_implementation="eager").eval()

    f32 = reloaded("float32")
    logits_a_f32, logits_b_f32 = hf_logits(f32, PROMPT_A), hf_logits(f32, PROMPT_B)
    if dtype == "float32":
        logits_a, logits_b = logits_a_f32, logits_b_f32
    else:
        bf16 = reloaded("bfloat16")
        assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
        logits_a, logits_b = hf_logits(bf16, PROMPT_A), hf_logits(bf16, PROMPT_B)
    return Checkpoint(folder, dtype, logits_a, logits_b, logits_a_f32, logits_b_f32)


def test_the_checkpoint_is_what_transformers_writes(checkpoint: Checkpoint) -> None:
    files = {p.name for p in checkpoint.folder.iterdir()}
    sharded = checkpoint.folder.name.split("-")[0] in SHARDED
    assert ("model.safetensors.index.json" in files) == sharded
    assert len([f for f in files if f.endswith(".safetensors")]) > (1 if sharded else 0)
    raw = json.loads((checkpoint.folder / "config.json").read_text())
    loaded = load_model(checkpoint.folder)
    # transformers leaves eos_token_id out of a Qwen config: the tokenizer's comes in
    assert loaded.config.eos_token_ids[-1] == 2 and 2 in loaded.config.eos_token_ids
    if raw["model_type"] in ("qwen2", "qwen3"):
        assert raw.get("eos_token_id") is None and loaded.config.eos_token_ids == (2,)


def runners(checkpoint: Checkpoint) -> list[tuple[str, ModelRunner, np.ndarray, np.ndarray, float]]:
    """(name, runner, expected logits of A and B, tolerance) for each runner of the checkpoint."""
    loaded = load_model(checkpoint.folder)
    stored = "bfloat16" if checkpoint.dtype == "bfloat16" else "float32"
    torch_runner = TorchRunner.from_folder(
        checkpoint.folder, loaded.config, 128, device=TORCH_TEST_DEVICE, dtype=stored
    )
    assert torch_runner.embedding_matrix().dtype == getattr(torch, stored)
    found = [
        # the numpy runner widens the checkpoint to float32: compare with float32 transformers
        (
            f"{checkpoint.folder.name} numpy",
            NumpyRunner(loaded.config, loaded.weights, 128),
            checkpoint.logits_a_f32,
            checkpoint.logits_b_f32,
            TOLERANCE["float32"],
        ),
        (
            f"{checkpoint.folder.name} torch-{stored}",
            torch_runner,
            checkpoint.logits_a,
            checkpoint.logits_b,
            TOLERANCE[stored],
        ),
    ]
    if TORCH_TEST_DEVICE == "cpu":
        # the torch ops with SDPA, as on CUDA (on the CPU the default is the core's kernel,
        # and in float32 the numpy runner's code over the torch tensors)
        sdpa = TorchRunner.from_folder(
            checkpoint.folder, loaded.config, 128, device="cpu", dtype=stored, attention="reference"
        )
        found.append(
            (
                f"{checkpoint.folder.name} torch-{stored}-sdpa",
                sdpa,
                checkpoint.logits_a,
                checkpoint.logits_b,
                TOLERANCE[stored],
            )
        )
    return found


def assert_close(name: str, actual: np.ndarray, expected: np.ndarray, tolerance: float) -> None:
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    largest = float(np.abs(expected).max())
    # float32: absolute; bf16: relative to the largest logit (see the module's docstring)
    scale = 1.0 if tolerance == TOLERANCE["float32"] else max(1.0, largest)
    diff = float(np.abs(actual - expected).max())
    print(f"{name}: max |diff| {diff:.3g}, largest logit {largest:.3g}")  # shown with pytest -s
    assert diff <= tolerance * scale, f"{name}: max |diff| {diff:.3g} > {tolerance} x {scale:.3g}"
    if tolerance == TOLERANCE["float32"]:
        # greedy choices identical, wherever the best two are not within the tolerance
        top2 = np.sort(expected, axis=-1)[..., -2:]
        clear = (top2[..., 1] - top2[..., 0]) > 2 * tolerance
        assert clear.mean() > 0.8
        np.testing.assert_array_equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])


def test_whole_and_chunked_prefill(checkpoint: Checkpoint) -> None:
    for name, runner, expected_a, _, tolerance in runners(checkpoint):
        whole = runner.forward(ForwardBatch.from_requests([PROMPT_A], [list(range(30))]), all_logits=True)
        assert_close(name, whole, expected_a, tolerance)
        slots, start, parts = list(range(40, 70)), 0, []
        for chunk in (7, 1, 13, 9):
            end = start + chunk
            batch = ForwardBatch.from_requests([PROMPT_A[start:end]], [slots[:end]])
            parts.append(runner.forward(batch, all_logits=True))
            start = end
        assert_close(name + " chunked", np.concatenate(parts), expected_a, tolerance)


def test_suffix_over_a_cached_prefix_and_a_batch_of_decodes(checkpoint: Checkpoint) -> None:
    for name, runner, expected_a, expected_b, tolerance in runners(checkpoint):
        # A is prefilled; B reuses A's first 11 slots and prefills only its own suffix,
        # in the same batch as the last 4 tokens of another copy of A over the same prefix
        a_slots = list(range(30))
        runner.forward(ForwardBatch.from_requests([PROMPT_A[:26]], [a_slots[:26]]))
        b_slots = a_slots[:11] + list(range(30, 38))
        a2_slots = a_slots[:11] + list(range(38, 57))
        batch = ForwardBatch.from_requests([PROMPT_B[11:], PROMPT_A[11:]], [b_slots, a2_slots])
        logits = runner.forward(batch, all_logits=True)
        assert_close(name + " cached suffix", logits[:8], expected_b[11:], tolerance)
        assert_close(name + " cached suffix", logits[8:], expected_a[11:], tolerance)
        # decodes of different lengths at once: A at 26 (its slots), B at 17 and A at 29
        # (the copy), each one token on top of what is in the pool
        decode = ForwardBatch.from_requests(
            [[PROMPT_A[26]], [PROMPT_B[17]], [PROMPT_A[29]]], [a_slots[:27], b_slots[:18], a2_slots[:30]]
        )
        rows = runner.forward(decode)
        assert_close(name + " decodes", rows, np.stack([expected_a[26], expected_b[17], expected_a[29]]), tolerance)


# ---- the same random weights given to transformers in memory (ferrolm's small variants) ----


def hf_model(variant: str, seed: int) -> tuple[Any, Any, Any]:
    config = small_config(variant)
    weights = random_weights(config, seed=seed)
    raw = config.to_hf_dict()
    raw.pop("torch_dtype")
    model_type = raw.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **raw)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    state = {name: torch.from_numpy(np.array(value)) for name, value in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # a tied model may not list lm_head.weight as its own parameter
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return config, weights, model.eval()


@pytest.mark.parametrize("variant", sorted(SMALL_MODEL_OVERRIDES))
def test_reference_and_runner_match_transformers(variant: str) -> None:
    config, weights, model = hf_model(variant, seed=11)
    ids = [int(i) for i in np.random.default_rng(12).integers(0, config.vocab_size, 21)]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].double().numpy()
    tolerance = 2e-5 * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(reference_logits(config, weights, ids), expected, rtol=0, atol=tolerance)
    for runner in (
        NumpyRunner(config, weights, num_slots=32),
        TorchRunner(config, weights, 32, device=TORCH_TEST_DEVICE),
    ):
        # over two calls, so the second reads the first's keys and values from the pool
        first = runner.forward(ForwardBatch.from_requests([ids[:13]], [list(range(13))]), all_logits=True)
        second = runner.forward(ForwardBatch.from_requests([ids[13:]], [list(range(21))]), all_logits=True)
        np.testing.assert_allclose(np.concatenate([first, second]), expected, rtol=0, atol=tolerance)
