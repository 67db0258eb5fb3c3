"""``TorchRunner`` (its torch ops with SDPA, the CUDA path) on the CPU against
``NumpyRunner`` and the dense float64 reference, and its CPU paths (the core's kernel) against
that one, on the same batches (whole prefill, chunked prefill, a suffix over a cached prefix, batched
decode, mixed batches), in float32 and bf16; its checkpoint reading (stored dtype kept,
sharded, tied) and its errors. The CUDA path is the same code on another device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model import torch_runner as torch_runner_module
from ferrolm.model.config import ModelConfig
from ferrolm.model.random_weights import random_weights
from ferrolm.model.reference import reference_logits
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from ferrolm.model.runner_choice import resolve_runner_kind
from ferrolm.model.torch_runner import TorchRunner
from ferrolm.model.weights import Weights
from safetensors.numpy import save_file
from small_models import SMALL_MODEL_OVERRIDES, TORCH_TEST_DEVICE, small_config

NUM_SLOTS = 128


torch: Any = pytest.importorskip("torch", reason="torch is not installed; the torch runner tests are skipped")


def bf16_rounded(weights: Weights) -> Weights:
    """The weights a bf16 checkpoint of these holds, widened back to float32."""
    return {name: w.astype(ml_dtypes.bfloat16).astype(np.float32) for name, w in weights.items()}


class Pair:
    """A small random model on both runners, each pool poisoned with NaN (a slot never
    written must never be read), and a shuffled supply of free slots."""

    def __init__(self, variant: str, seed: int = 0, dtype: str = "float32") -> None:
        self.config: ModelConfig = small_config(variant)
        self.weights = random_weights(self.config, seed=seed)
        self.dtype = dtype
        if dtype == "bfloat16":
            # the reference then differs from the runner only by bf16 activations
            self.weights = bf16_rounded(self.weights)
        self.numpy = NumpyRunner(self.config, self.weights, NUM_SLOTS)
        # the torch ops with SDPA: what CUDA runs (the CPU's kernel paths are compared with
        # it in test_the_cores_kernel_on_the_cpu_matches_the_sdpa_path)
        self.torch = TorchRunner(
            self.config, self.weights, NUM_SLOTS, device=TORCH_TEST_DEVICE, dtype=dtype, attention="reference"
        )
        for pool in (*self.numpy.k_pool, *self.numpy.v_pool, *self.torch.k_pool, *self.torch.v_pool):
            pool.fill(np.nan) if isinstance(pool, np.ndarray) else pool.fill_(float("nan"))
        self.rng = np.random.default_rng(seed + 1)
        self.free = [int(s) for s in self.rng.permutation(NUM_SLOTS)]

    def take_slots(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def tokens(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(0, self.config.vocab_size, n)]

    def forward(self, batch: ForwardBatch, all_logits: bool = True) -> np.ndarray:
        """The torch runner's logits, checked against the numpy runner's on the same batch."""
        got = self.torch.forward(batch, all_logits=all_logits)
        want = self.numpy.forward(batch, all_logits=all_logits)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.isfinite(got).all()
        # float32: the same computation summed in another order; bf16: bf16 activations
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=0, atol=(2e-5 if self.dtype == "float32" else 3e-2) * scale)
        return got

    def check(self, logits: np.ndarray, ids: list[int], rows: slice | list[int]) -> None:
        """``logits`` are the reference's rows ``rows`` of sequence ``ids``."""
        expected = reference_logits(self.config, self.weights, ids)[rows]
        scale = max(1.0, float(np.abs(expected).max()))
        tolerance = (2e-5 if self.dtype == "float32" else 3e-2) * scale
        np.testing.assert_allclose(logits, expected, rtol=0, atol=tolerance)


@pytest.fixture(
    params=[(v, d) for v in sorted(SMALL_MODEL_OVERRIDES) for d in ("float32", "bfloat16")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def pair(request: pytest.FixtureRequest) -> Pair:
    variant, dtype = request.param
    return Pair(variant, dtype=dtype)


def test_whole_and_chunked_prefill(pair: Pair) -> None:
    ids = pair.tokens(30)
    whole = pair.forward(ForwardBatch.from_requests([ids], [pair.take_slots(30)]))
    pair.check(whole, ids, slice(None))
    slots, start = pair.take_slots(30), 0
    for chunk in (7, 1, 13, 9):
        end = start + chunk
        logits = pair.forward(ForwardBatch.from_requests([ids[start:end]], [slots[:end]]))
        pair.check(logits, ids, slice(start, end))
        start = end


def test_suffix_prefill_over_a_shared_cached_prefix(pair: Pair) -> None:
    prefix, first_tail = pair.tokens(11), pair.tokens(5)
    prefix_slots = pair.take_slots(11)
    pair.forward(ForwardBatch.from_requests([prefix + first_tail], [prefix_slots + pair.take_slots(5)]))
    tail_a, tail_b = pair.tokens(6), pair.tokens(1)
    batch = ForwardBatch.from_requests(
        [tail_a, tail_b], [prefix_slots + pair.take_slots(6), prefix_slots + pair.take_slots(1)]
    )
    logits = pair.forward(batch)
    pair.check(logits[:6], prefix + tail_a, slice(11, None))
    pair.check(logits[6:], prefix + tail_b, slice(11, None))


def test_batched_decode_and_a_mixed_batch(pair: Pair) -> None:
    lengths = (3, 17, 8)
    sequences = [pair.tokens(n) for n in lengths]
    slots = [pair.take_slots(n) for n in lengths]
    logits = pair.forward(ForwardBatch.from_requests(sequences, slots), all_logits=False)
    for _ in range(3):
        new = [int(np.argmax(row)) for row in logits]
        for b in range(len(sequences)):
            sequences[b].append(new[b])
            slots[b] += pair.take_slots(1)
        logits = pair.forward(ForwardBatch.from_requests([[t] for t in new], slots), all_logits=False)
        for b, seq in enumerate(sequences):
            pair.check(logits[b : b + 1], seq, slice(-1, None))
    # continuous batching: two decodes beside a prompt chunk, and a lone one-token prompt
    waiting, lone = pair.tokens(12), pair.tokens(1)
    waiting_slots = pair.take_slots(12)
    pair.forward(ForwardBatch.from_requests([waiting[:5]], [waiting_slots[:5]]))
    step = pair.tokens(2)
    slots[0] += pair.take_slots(1)
    slots[1] += pair.take_slots(1)
    batch = ForwardBatch.from_requests(
        [step[:1], waiting[5:], step[1:], lone], [slots[0], waiting_slots, slots[1], pair.take_slots(1)]
    )
    logits = pair.forward(batch)
    pair.check(logits[:1], sequences[0] + step[:1], slice(-1, None))
    pair.check(logits[1:8], waiting, slice(5, None))
    pair.check(logits[8:9], sequences[1] + step[1:], slice(-1, None))
    pair.check(logits[9:], lone, slice(None))


def test_a_single_decode_beside_nothing_else() -> None:
    # one decode alone is attended as a chunk of one query, not through the padded path
    pair = Pair("mistral")
    ids = pair.tokens(9)
    slots = pair.take_slots(10)
    pair.forward(ForwardBatch.from_requests([ids], [slots[:9]]))
    nxt = pair.tokens(1)
    logits = pair.forward(ForwardBatch.from_requests([nxt], [slots]))
    pair.check(logits, ids + nxt, slice(-1, None))


def test_pool_and_weights_keep_the_compute_dtype() -> None:
    config = small_config("qwen3")
    weights = random_weights(config, seed=2)
    runner = TorchRunner(config, weights, 16, device="cpu", dtype="bfloat16")
    assert runner.dtype == torch.bfloat16 and runner.device.type == "cpu"
    assert runner.k_pool[0].dtype == torch.bfloat16 and runner.k_pool[0].shape == (
        16,
        config.num_kv_heads,
        config.head_dim,
    )
    assert runner.layers[0].qkv.dtype == torch.bfloat16
    assert runner.kv_pool_bytes() == 16 * config.kv_bytes_per_slot(itemsize=2)
    # tied embeddings stay one tensor: on the CPU the head as [hidden, vocab] (for x @ w),
    # whose columns are the embedding's rows
    assert runner.embed is None and runner.lm_head.shape == (config.hidden_size, config.vocab_size)
    # auto on the CPU computes in float32
    assert TorchRunner(config, weights, 4, device="cpu").dtype == torch.float32


def write_checkpoint(folder: Path, config: ModelConfig, weights: Weights, dtype: Any, shards: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict()))
    stored = {
        n: np.ascontiguousarray(w.astype(dtype))
        for n, w in weights.items()
        if not (config.tie_word_embeddings and n == "lm_head.weight")
    }
    names = sorted(stored)
    if shards == 1:
        save_file(stored, str(folder / "model.safetensors"))
        return
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: stored[n] for n in part}, str(folder / file))
        weight_map |= {n: file for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("variant", ["llama-biases", "qwen3", "qwen2"])
def test_from_folder_reads_bf16_straight_into_torch(tmp_path: Path, variant: str) -> None:
    config = small_config(variant)
    weights = bf16_rounded(random_weights(config, seed=4))
    write_checkpoint(tmp_path, config, weights, ml_dtypes.bfloat16, shards=3)
    runner = TorchRunner.from_folder(tmp_path, config, 32, device=TORCH_TEST_DEVICE, dtype="bfloat16")
    embedding = runner.embedding_matrix()
    assert embedding.dtype == torch.bfloat16
    np.testing.assert_array_equal(embedding.float().cpu().numpy(), weights["model.embed_tokens.weight"])
    if config.tie_word_embeddings:
        assert runner.lm_head.data_ptr() == embedding.data_ptr()
    # the same model given as float32 numpy weights gives the same logits
    direct = TorchRunner(config, weights, 32, device=TORCH_TEST_DEVICE, dtype="bfloat16")
    batch = ForwardBatch.from_requests([[3, 1, 4, 1, 5, 9]], [list(range(6))])
    np.testing.assert_array_equal(runner.forward(batch, all_logits=True), direct.forward(batch, all_logits=True))
    # auto on the CPU widens to float32
    assert TorchRunner.from_folder(tmp_path, config, 4, device="cpu").dtype == torch.float32


def test_from_folder_refuses_a_wrong_shape_naming_the_tensor(tmp_path: Path) -> None:
    config = small_config("llama3")
    weights = random_weights(config, seed=4)
    weights["model.norm.weight"] = weights["model.norm.weight"][:-1]
    write_checkpoint(tmp_path, config, weights, np.float32)
    with pytest.raises(InvalidInputError, match="'model.norm.weight' has shape"):
        TorchRunner.from_folder(tmp_path, config, 4, device="cpu")


@pytest.mark.skipif(torch_runner_module.cuda_available(), reason="this machine has CUDA")
def test_cuda_asked_for_but_absent_is_a_clear_error() -> None:
    config = small_config("llama3")
    with pytest.raises(InvalidInputError, match="no CUDA device.*--device cpu") as e:
        TorchRunner(config, random_weights(config, seed=0), 8, device="cuda")
    assert e.value.field == "device"
    assert resolve_runner_kind("auto") == "numpy"  # no CUDA: float32 on the CPU is numpy's
    assert resolve_runner_kind("torch", "cpu", "bfloat16") == "torch"
    assert resolve_runner_kind("auto", "cpu", "bfloat16") == "quant"  # a float checkpoint in bf16


def test_bad_device_or_dtype_is_named() -> None:
    config = small_config("llama3")
    weights = random_weights(config, seed=0)
    with pytest.raises(InvalidInputError, match="device must be one of") as e:
        TorchRunner(config, weights, 8, device="tpu")
    assert e.value.field == "device"
    with pytest.raises(InvalidInputError, match="dtype must be one of") as e:
        TorchRunner(config, weights, 8, device="cpu", dtype="int8")
    assert e.value.field == "dtype"


def test_malformed_batch_or_slots_out_of_range_are_refused() -> None:
    config = small_config("llama3")
    runner = TorchRunner(config, random_weights(config, seed=0), 8, device="cpu")
    with pytest.raises(InvalidInputError, match="vocab size"):
        runner.forward(ForwardBatch.from_requests([[config.vocab_size]], [[0]]))
    with pytest.raises(InvalidInputError, match="num_slots"):
        runner.forward(ForwardBatch.from_requests([[1]], [[8]]))


def test_a_pool_that_does_not_fit_is_a_clear_error() -> None:
    config = small_config("llama3", num_hidden_layers=1)
    with pytest.raises(InvalidInputError, match=r"KV pool of 2000000000000 slots .* does not fit on cpu") as e:
        TorchRunner(config, random_weights(config, seed=0), 2 * 10**12, device="cpu")
    assert e.value.field == "kv_capacity"


def test_mem_fraction_static_sizes_the_pool_from_the_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # the CPU has no mem_get_info: a device reporting 64 MiB, 16 MiB of it in use
    total = 64 * 2**20
    monkeypatch.setattr(torch_runner_module, "device_memory", lambda device: (3 * total // 4, total))
    config = small_config("llama3")
    runner = TorchRunner(
        config, random_weights(config, seed=0), None, device="cpu", dtype="bfloat16", mem_fraction_static=0.5
    )
    per_slot = config.kv_bytes_per_slot(itemsize=2)
    assert runner.num_slots == (total // 2 - total // 4) // per_slot
    assert runner.k_pool[0].shape[0] == runner.num_slots
    with pytest.raises(InvalidInputError, match="leaves no room for a KV pool") as e:
        TorchRunner(config, random_weights(config, seed=0), None, device="cpu", mem_fraction_static=0.2)
    assert e.value.field == "mem_fraction_static"
    with pytest.raises(InvalidInputError, match=r"in \(0, 1\)"):
        TorchRunner(config, random_weights(config, seed=0), None, device="cpu", mem_fraction_static=1.5)


def test_mem_fraction_static_on_the_cpu_is_refused() -> None:
    config = small_config("llama3")
    with pytest.raises(InvalidInputError, match="CUDA device's memory; on the CPU give --max-total-tokens"):
        TorchRunner(config, random_weights(config, seed=0), None, device="cpu", mem_fraction_static=0.8)


@pytest.mark.parametrize("variant", sorted(SMALL_MODEL_OVERRIDES))
@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype"),
    [("float32", "float32"), ("float32", "float16"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")],
)
def test_the_cores_kernel_on_the_cpu_matches_the_sdpa_path(variant: str, dtype: str, kv_cache_dtype: str) -> None:
    """On the CPU the runner attends with the core's kernel over zero-copy views of its
    pool tensors; SDPA over the gathered slots (the CUDA path) is its reference. Both
    read the same pool values, so they differ only by summation order; through a narrow
    pool, where the earlier layers' last-bit differences round a key or value to the
    neighbouring half (an ulp of float16 is 1e-3 relative, of bfloat16 8e-3); and with
    bf16 compute, by bf16 activations rounded after that."""
    config = small_config(variant)
    weights = random_weights(config, seed=3)
    runners = {
        a: TorchRunner(
            config, weights, NUM_SLOTS, device="cpu", dtype=dtype, kv_cache_dtype=kv_cache_dtype, attention=a
        )
        for a in ("kernel", "reference")
    }
    for r in runners.values():
        assert r.k_pool[0].dtype == getattr(torch, kv_cache_dtype)
        for pool in (*r.k_pool, *r.v_pool):
            pool.fill_(float("nan"))  # a slot never written must never be read
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, config.vocab_size, 64)]
    a, b, c = list(range(0, 20)), list(range(20, 30)), list(range(40, 64))
    batches = [
        ForwardBatch.from_requests([tokens[:12]], [a[:12]]),  # a prompt
        ForwardBatch.from_requests([tokens[12:18], tokens[20:30]], [a[:18], b]),  # a chunk over a cached prefix
        ForwardBatch.from_requests([tokens[18:19], tokens[30:31], tokens[40:47]], [a[:19], b + [30], c[:7]]),
        ForwardBatch.from_requests([tokens[19:20], tokens[31:32]], [a, b + [30, 31]]),  # decodes
    ]
    tolerance = 3e-2 if dtype == "bfloat16" else {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.5e-2}[kv_cache_dtype]
    for batch in batches:
        kernel = runners["kernel"].forward(batch, all_logits=True)
        reference = runners["reference"].forward(batch, all_logits=True)
        assert np.isfinite(kernel).all()
        np.testing.assert_allclose(kernel, reference, rtol=0, atol=tolerance * max(1.0, float(np.abs(reference).max())))
    # the kernel paths wrote the runner's own pool tensors (views, not copies): the first
    # layer's keys and values, which both paths compute from the same embeddings
    written = np.unique(np.concatenate([batch.out_slots for batch in batches]))
    for pools in ("k_pool", "v_pool"):
        got, want = (getattr(runners[a], pools)[0][written].float().numpy() for a in ("kernel", "reference"))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_attention_backend_and_kv_cache_dtype_are_checked() -> None:
    config = small_config("llama3")
    weights = random_weights(config, seed=1)
    with pytest.raises(InvalidInputError, match="attention") as e:
        TorchRunner(config, weights, 8, device="cpu", attention="flash")
    assert e.value.field == "attention"
    with pytest.raises(InvalidInputError, match="kv_cache_dtype") as e:
        TorchRunner(config, weights, 8, device="cpu", kv_cache_dtype="int8")
    assert e.value.field == "kv_cache_dtype"
    # unset: the kernel on the CPU, in the compute dtype's pool; FERROLM_ATTENTION=reference picks SDPA
    plain = TorchRunner(config, weights, 8, device="cpu")
    assert (plain.attention, plain.k_pool[0].dtype) == ("kernel", torch.float32)
