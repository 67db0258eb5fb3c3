"""What the quant runner keeps resident (issue 27's floor: serving a Q4_K_M file takes at
most 1.3x the file plus the KV pool): once ``QuantRunner.from_gguf`` returns, the file
is no longer mapped and the process holds the weights as the core stores them and nothing
else of their size (no staging copies, no float32 weights); the KV pool takes memory only
where it is written; the Python tokenizer can be released and read again.

Measured in a fresh interpreter on a GGUF written here (about 66 MB of Q8_0 matrices, a
16k-row embedding, and a byte-level vocabulary of 258 tokens, so that the weights dwarf
everything else and the file parses in a moment), with
freed heap pages handed back before each reading (``release_free_heap``). The margins
are generous, a few MB against regressions of tens: a kept copy of the matrices, the
file's pages, float32 weights or a pool written through at construction.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 1024, 2816, 4, 16, 4
VOCAB = 16384  # rows of the embedding (and tied head); the tokenizer has 258 of them
MIB = 1 << 20


def _write_gguf(path: Path) -> None:
    """A llama of random Q8_0 matrices with a byte-level BPE of the 256 bytes, one merge
    and an end-of-text token."""
    import gguf
    from ferrolm.model.bpe_from_ranks import byte_alphabet

    tokens = [*byte_alphabet(), "\u0120t", "<|endoftext|>"]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("llama.block_count", LAYERS)
    writer.add_uint32("llama.context_length", 4096)
    writer.add_uint32("llama.embedding_length", HIDDEN)
    writer.add_uint32("llama.feed_forward_length", INTERMEDIATE)
    writer.add_uint32("llama.attention.head_count", HEADS)
    writer.add_uint32("llama.attention.head_count_kv", KV_HEADS)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", [1] * (len(tokens) - 1) + [3])
    writer.add_array("tokenizer.ggml.merges", ["\u0120 t"])
    writer.add_uint32("tokenizer.ggml.eos_token_id", len(tokens) - 1)
    rng = np.random.default_rng(27)

    def q8_0(rows: int, cols: int) -> np.ndarray:
        blocks = rng.integers(-127, 128, size=(rows, cols // 32, 34), dtype=np.int8).view(np.uint8)
        scales = rng.uniform(1e-4, 2e-4, size=(rows, cols // 32)).astype(np.float16)
        blocks[:, :, :2] = scales.view(np.uint8).reshape(rows, cols // 32, 2)
        return blocks.reshape(rows, -1)

    def add(name: str, data: np.ndarray, raw: gguf.GGMLQuantizationType | None = None) -> None:
        writer.add_tensor(name, data, raw_dtype=raw)

    q8 = gguf.GGMLQuantizationType.Q8_0
    kv = KV_HEADS * HIDDEN // HEADS
    add("token_embd.weight", q8_0(VOCAB, HIDDEN), q8)
    add("output_norm.weight", np.ones(HIDDEN, np.float32))
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        add(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        for part, rows, cols in (
            ("attn_q", HIDDEN, HIDDEN),
            ("attn_k", kv, HIDDEN),
            ("attn_v", kv, HIDDEN),
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_gate", INTERMEDIATE, HIDDEN),
            ("ffn_up", INTERMEDIATE, HIDDEN),
            ("ffn_down", HIDDEN, INTERMEDIATE),
        ):
            add(f"blk.{i}.{part}.weight", q8_0(rows, cols), q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# run in a fresh interpreter: RSS readings there see this model and nothing the test
# session loaded before
_MEASURE = """
import json, sys
from ferrolm import Engine
from ferrolm._memory import release_free_heap
from ferrolm.model.loader import load_model
from ferrolm.model.quant_runner import QuantRunner

def rss():
    release_free_heap()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))

def reset_peak():
    # Linux 4.0+: the peak RSS starts again from the current one
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False

def mapped(path):
    with open("/proc/self/maps") as f:
        return any(path in line for line in f)

path, slots = sys.argv[1], int(sys.argv[2])
model = load_model(path, with_weights=False)
QuantRunner.from_gguf(path, model.config, 16)  # every import and one-time cost, then dropped
out = {"before": rss()}
out["peak_reset"] = reset_peak()
runner = QuantRunner.from_gguf(path, model.config, slots)
out["peak"] = peak()
out["mapped"] = mapped(path)
out["runner"] = rss()
out["weight_bytes"] = runner.weight_bytes
del runner
out["dropped"] = rss()
engine = Engine(path, kv_capacity=slots)
out["engine"] = rss()
engine.tokenizer.release()
out["released"] = rss()
out["reloaded_ids"] = engine.tokenizer.encode(" t").tolist()
print(json.dumps(out))
"""


def test_a_gguf_on_the_quant_runner_keeps_its_weights_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "big.gguf"
    _write_gguf(path)
    pool_bytes = 128 * MIB  # float16: slots * layers * (k, v) * kv heads * head_dim * 2 bytes
    slots = pool_bytes // (LAYERS * 2 * KV_HEADS * (HIDDEN // HEADS) * 2)
    env_cache = {"FERROLM_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), str(slots)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, **env_cache},
    )
    assert done.returncode == 0, done.stderr
    m = json.loads(done.stdout.strip().splitlines()[-1])
    weights = m["weight_bytes"]
    assert weights > 60 * MIB  # the file's matrices, as stored (Q8_0)
    # the file's mapping is gone once the core has its copy
    assert not m["mapped"]
    # the runner costs its weights: not a second copy of them, not the file's pages, not
    # its 128 MB pool (written slot by slot as requests come)
    grew = m["runner"] - m["before"]
    assert 0.9 * weights <= grew <= weights + 6 * MIB, (grew / MIB, weights / MIB)
    assert m["before"] - m["dropped"] < 6 * MIB  # and gives them back when dropped
    # nor is the file resident whole beside the copy at the peak of loading: each
    # tensor's file pages leave the process once the core has copied them. Measured here:
    # 1.45x the weights (the unpermuted query and key rows staged, the reader, the
    # allocator's slack); 2.1x when the pages stay until the file is unmapped.
    if m["peak_reset"]:
        assert m["peak"] - m["before"] <= 1.65 * weights, ((m["peak"] - m["before"]) / MIB, weights / MIB)
    # a whole engine (tokenizer, vocabulary, scheduler, step loop): a few MB beside them
    assert m["engine"] - m["dropped"] <= weights + 12 * MIB, ((m["engine"] - m["dropped"]) / MIB, weights / MIB)
    assert m["released"] <= m["engine"]
    assert m["reloaded_ids"] == [256]  # " t" is the merged token: read again after release
