"""The quantized runner (``QuantRunner``: a GGUF's weights kept in their block formats,
the forward in the Rust core) against the numpy runner over the same file dequantized to
float32, on a file with a tensor of every block format; what ``--runner auto`` picks for
a GGUF; and bad input.

Tolerance: the quantized runner rounds each matrix product's input to int8 per block
(as llama.cpp does), a relative error of at most 1/254 of the block's largest value per
element; over this model's 2 layers that moves logits by well under 2% of their range,
and the test holds it to that while the argmax of every position agrees.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from ferrolm import Engine, SamplingParams
from ferrolm.errors import InvalidInputError
from ferrolm.model.loader import load_model
from ferrolm.model.quant_runner import QuantRunner
from ferrolm.model.random_weights import random_weights
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from ferrolm.model.runner_choice import resolve_runner_kind
from gguf_files import wide_tiny, write_tiny_gguf


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERROLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("quant")
    path = base / "tiny.gguf"
    write_tiny_gguf(wide_tiny(base / "wide"), path)
    return path


def _prompt_batch(ids: list[int]) -> ForwardBatch:
    return ForwardBatch.from_requests([ids], [list(range(len(ids)))])


def test_logits_agree_with_the_dequantized_float_forward(gguf_path: Path) -> None:
    model = load_model(gguf_path)
    reference = NumpyRunner(model.config, model.weights, 64, kv_cache_dtype="float32")
    quant = QuantRunner.from_gguf(gguf_path, model.config, 64, kv_cache_dtype="float32")
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")
    want = reference.forward(_prompt_batch(ids), all_logits=True)
    got = quant.forward(_prompt_batch(ids), all_logits=True)
    assert got.shape == want.shape == (len(ids), model.config.vocab_size)
    spread = float(want.max() - want.min())
    assert np.abs(got - want).max() <= 0.02 * spread
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    # a decode step over the cached prompt agrees as well
    step = ForwardBatch.from_requests([[int(want[-1].argmax())]], [list(range(len(ids) + 1))])
    reference_step, quant_step = reference.forward(step), quant.forward(step)
    assert np.abs(quant_step - reference_step).max() <= 0.02 * spread


def test_a_gguf_runs_on_the_quant_runner_by_default(gguf_path: Path) -> None:
    assert resolve_runner_kind("auto", "cpu", "auto", model=gguf_path) == "quant"
    assert resolve_runner_kind("numpy", "cpu", "auto", model=gguf_path) == "numpy"
    engine = Engine(str(gguf_path), kv_capacity=256, device="cpu")
    assert isinstance(engine.runner, QuantRunner)
    [out] = engine.generate(["Hello there"], SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 8
    # the same file on the numpy runner: the first greedy token agrees where the float
    # forward's top two logits are well apart (int8 activations move logits by ~1% of
    # their range, so a near-tie may go either way on another CPU's BLAS)
    numpy_engine = Engine(str(gguf_path), kv_capacity=256, runner="numpy")
    [same] = numpy_engine.generate(["Hello there"], SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True))
    ids = numpy_engine.tokenizer.encode("Hello there")
    logits = numpy_engine.runner.forward(_prompt_batch([int(i) for i in ids]))[0]
    top2 = np.sort(logits)[-2:]
    clear = top2[1] - top2[0] > 0.05 * float(logits.max() - logits.min())
    if clear:
        assert out.token_ids[0] == same.token_ids[0]


def test_a_q8_0_kv_cache_stays_close_to_the_float_one(gguf_path: Path) -> None:
    # The q8_0 pool rounds each key and value to 1/254 of its 32-value block's largest
    # magnitude (plus the f16 scale's 2^-11): attention's scores and outputs move by about
    # that relative amount, well under the 2% of the logits' range the int8 activations
    # already get. A prompt, then decode steps that read it back from the pool.
    model = load_model(gguf_path)
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")
    runs: dict[str, list[np.ndarray]] = {}
    fed: list[int] = []  # the float pool's greedy tokens, fed to both
    for kv in ("float32", "q8_0"):
        runner = QuantRunner.from_gguf(gguf_path, model.config, 64, kv_cache_dtype=kv)
        logits = [runner.forward(_prompt_batch(ids), all_logits=True)]
        for i in range(4):
            if kv == "float32":
                fed.append(int(logits[-1][-1].argmax()))
            step = ForwardBatch.from_requests([[fed[i]]], [list(range(len(ids) + i + 1))])
            logits.append(runner.forward(step))
        runs[kv] = logits
    spread = float(runs["float32"][0].max() - runs["float32"][0].min())
    for want, got in zip(runs["float32"], runs["q8_0"]):
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 0.01 * spread
        assert 0 < np.abs(got - want).max()  # the pool is really quantized
    assert (runs["q8_0"][0].argmax(axis=1) == runs["float32"][0].argmax(axis=1)).mean() >= 0.9


def test_a_q8_0_kv_cache_is_the_quant_runners_and_needs_whole_blocks_per_head(gguf_path: Path) -> None:
    engine = Engine(str(gguf_path), kv_capacity=128, kv_cache_dtype="q8_0")
    [out] = engine.generate(["Hello there"], SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 6
    with pytest.raises(InvalidInputError, match="quant runner") as err:
        Engine(str(gguf_path), kv_capacity=128, runner="numpy", kv_cache_dtype="q8_0")
    assert err.value.field == "kv_cache_dtype"
    # heads 16 wide: a block of 32 would straddle two of them
    config = dataclasses.replace(
        load_model("tiny", with_weights=False).config, head_dim=16, num_heads=8, num_kv_heads=4
    )
    with pytest.raises(InvalidInputError, match="multiple of 32") as err:
        QuantRunner.from_weights(config, random_weights(config, 1), 8, dtype="float16", kv_cache_dtype="q8_0")
    assert err.value.field == "kv_cache_dtype"


def test_bad_input_is_refused_by_field(gguf_path: Path) -> None:
    model = load_model(gguf_path, with_weights=False)
    with pytest.raises(InvalidInputError) as err:
        QuantRunner.from_gguf(gguf_path, model.config, 8, kv_cache_dtype="int4")
    assert err.value.field == "kv_cache_dtype"
    with pytest.raises(InvalidInputError) as err:
        resolve_runner_kind("quant", "cpu", "auto", model="tiny")
    assert err.value.field == "runner"
    runner = QuantRunner.from_gguf(gguf_path, model.config, 8)
    with pytest.raises(InvalidInputError) as err:
        runner.forward(_prompt_batch([model.config.vocab_size]))
    assert err.value.field == "input_ids"
    with pytest.raises(InvalidInputError) as err:
        runner.forward(ForwardBatch.from_requests([[1]], [[8]]))
    assert err.value.field == "kv_slots"


@pytest.mark.parametrize("quantization", ["q8_0", "q4_k"])
def test_a_float_checkpoint_quantized_at_load(tmp_path: Path, quantization: str) -> None:
    # hidden 256 and MLP 768: the q/k/v/o/gate/up rows are whole 256-blocks (Q4_K) and the
    # down rows (768) too
    model = wide_tiny(tmp_path / "wide")
    reference = NumpyRunner(model.config, model.weights, 64, kv_cache_dtype="float32")
    quant = QuantRunner.from_weights(
        model.config, model.weights, 64, quantization=quantization, kv_cache_dtype="float32"
    )
    ids = model.tokenizer.encode("It was the best of times, it was the worst of times.")
    want = reference.forward(_prompt_batch(ids), all_logits=True)
    got = quant.forward(_prompt_batch(ids), all_logits=True)
    spread = float(want.max() - want.min())
    # 4-bit weights move logits several times more than 8-bit ones
    assert np.abs(got - want).max() <= (0.03 if quantization == "q8_0" else 0.15) * spread
    per_weight = quant.weight_bytes / sum(w.size for n, w in model.weights.items() if w.ndim == 2)
    assert per_weight < (1.1 if quantization == "q8_0" else 0.9)  # against 4 bytes in float32
    assert model.folder is not None
    engine = Engine(str(model.folder), kv_capacity=64, quantization=quantization)
    assert isinstance(engine.runner, QuantRunner)
    with pytest.raises(InvalidInputError) as err:
        Engine(str(model.folder), kv_capacity=64, quantization="q2_k")
    assert err.value.field == "quantization"


# --dtype float16|bfloat16 on the CPU: the matrices keep 2 bytes a weight. A float16 weight
# is within 2^-11 of its float32 value (relative), a bfloat16 one within 2^-8; activations
# stay float32 for these types, so the logits move by that order of their range (measured
# here: 0.04% and 0.4%), held to about four times that.
@pytest.mark.parametrize(("dtype", "tolerance"), [("float16", 0.002), ("bfloat16", 0.015)])
def test_a_float_checkpoint_in_two_byte_floats(tmp_path: Path, dtype: str, tolerance: float) -> None:
    model = wide_tiny(tmp_path / "wide")
    assert model.folder is not None and model.config.tie_word_embeddings
    reference = NumpyRunner(model.config, model.weights, 64, kv_cache_dtype="float32")
    quant = QuantRunner.from_folder(model.folder, model.config, 64, dtype=dtype, kv_cache_dtype="float32")
    ids = model.tokenizer.encode("It was the best of times, it was the worst of times.")
    want = reference.forward(_prompt_batch(ids), all_logits=True)
    got = quant.forward(_prompt_batch(ids), all_logits=True)
    spread = float(want.max() - want.min())
    assert np.abs(got - want).max() <= tolerance * spread
    # the same from the float32 arrays in memory
    direct = QuantRunner.from_weights(model.config, model.weights, 64, dtype=dtype, kv_cache_dtype="float32")
    np.testing.assert_array_equal(direct.forward(_prompt_batch(ids), all_logits=True), got)
    # 2 bytes for every weight a step reads (the tied head is the embedding), float32's 4
    read = [w for name, w in model.weights.items() if w.ndim == 2 and name != "lm_head.weight"]
    assert quant.weight_bytes == 2 * sum(w.size for w in read) == sum(w.nbytes for w in read) // 2
    # --dtype on the CPU picks the quant runner for a float checkpoint
    engine = Engine(str(model.folder), kv_capacity=64, device="cpu", dtype=dtype)
    assert isinstance(engine.runner, QuantRunner) and engine.runner.weight_bytes == quant.weight_bytes
    [out] = engine.generate(["Hello"], SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_dtype_and_quantization_combinations(gguf_path: Path) -> None:
    assert resolve_runner_kind("auto", "cpu", "float16") == "quant"
    assert resolve_runner_kind("quant", "cpu", "bfloat16", model="tiny") == "quant"
    refused = [
        (("auto", "cpu", "float16"), {"quantization": "q8_0"}, "dtype"),
        (("quant", "cpu", "bfloat16"), {"model": gguf_path}, "dtype"),
        (("quant", "cuda", "float16"), {}, "device"),
        (("quant", "cpu", "float32"), {}, "runner"),
        (("numpy", "cpu", "float16"), {}, "dtype"),
    ]
    for args, kwargs, field in refused:
        with pytest.raises(InvalidInputError) as err:
            resolve_runner_kind(*args, **kwargs)
        assert err.value.field == field, (args, kwargs)
    model = load_model("tiny")
    for kwargs, field in (
        ({}, "quantization"),
        ({"quantization": "q8_0", "dtype": "float16"}, "dtype"),
        ({"dtype": "float32"}, "dtype"),
    ):
        with pytest.raises(InvalidInputError) as err:
            QuantRunner.from_weights(model.config, model.weights, 8, **kwargs)
        assert err.value.field == field, kwargs


def test_the_dtype_flag_reaches_the_quant_runner(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import argparse

    from ferrolm.cli import main
    from ferrolm.server.args import add_serve_arguments, build_engine, server_args_from

    folder = wide_tiny(tmp_path / "wide").folder
    assert folder is not None
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    flags = ["--model", str(folder), "--dtype", "bfloat16", "--device", "cpu", "--max-total-tokens", "256"]
    args = server_args_from(parser.parse_args(flags), {})
    engine = build_engine(args)
    assert isinstance(engine.runner, QuantRunner)
    flags = ["generate", "--model", str(folder), "--prompt", "Hello", "--max-new-tokens", "3", "--ignore-eos"]
    assert main([*flags, "--device", "cpu", "--dtype", "float16"]) == 0
    assert "[length, 3 tokens]" in capsys.readouterr().out
    assert main([*flags, "--dtype", "float16", "--quantization", "q8_0"]) == 2
    assert "--dtype" in capsys.readouterr().err
