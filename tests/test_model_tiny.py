"""The embedded model ``tiny``: built once into the cache with no network, loaded like any
Hugging Face folder, with a working tokenizer and a deterministic forward pass."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ferrolm.errors import InvalidInputError
from ferrolm.model import tiny
from ferrolm.model.config import ModelConfig
from ferrolm.model.loader import LoadedModel, load_model
from ferrolm.model.runner import ForwardBatch, NumpyRunner

HF_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ferrolm-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FERROLM_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def model(cache: Path) -> LoadedModel:
    return load_model("tiny")


def test_tiny_is_written_as_a_hugging_face_folder_in_the_cache(model: LoadedModel, cache: Path) -> None:
    folder = cache / f"tiny-{tiny.TINY_VERSION}"
    assert {p.name for p in folder.iterdir()} == HF_FILES
    assert ModelConfig.from_folder(folder) == tiny.tiny_config() == model.config
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == list(model.config.eos_token_ids)
    # nothing half-built is left beside it
    assert [p.name for p in cache.iterdir()] == [folder.name]


def test_tiny_is_reused_not_rebuilt(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(folder: Path) -> None:
        raise AssertionError("tiny was rebuilt although it is in the cache")

    monkeypatch.setattr(tiny, "write_tiny", refuse)
    reloaded = load_model("tiny")
    assert reloaded.config == model.config


def test_cache_root_defaults_to_the_home_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FERROLM_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tiny.cache_root() == tmp_path / ".cache" / "ferrolm"


def test_a_folder_path_loads_the_same_model(model: LoadedModel) -> None:
    folder = tiny.tiny_folder()
    for spelling in (folder, str(folder)):
        again = load_model(spelling)
        assert again.config == model.config
        np.testing.assert_array_equal(again.weights["model.norm.weight"], model.weights["model.norm.weight"])


def test_unknown_model_name_is_refused_without_downloading(cache: Path) -> None:
    with pytest.raises(InvalidInputError, match="never downloads"):
        load_model("meta-llama/Llama-3.1-8B")


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(raw | {"vocab_size": 32000}))
    with pytest.raises(InvalidInputError, match="'vocab_size'"):
        load_model(folder)


def copy_of_tiny(destination: Path) -> Path:
    folder = tiny.tiny_folder()
    for file in HF_FILES:
        (destination / file).write_bytes((folder / file).read_bytes())
    return destination


def test_generation_config_adds_its_eos_ids(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [32003, 5]}))
    assert load_model(folder).config.eos_token_ids == (*model.config.eos_token_ids, 5)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(InvalidInputError, match="'eos_token_id'"):
        load_model(folder)


def without_eos_in(folder: Path, *files: str) -> None:
    """Drops the EOS from each of ``files`` as transformers leaves it out (a Qwen2/Qwen3
    config.json has no ``eos_token_id``)."""
    for file in files:
        raw = json.loads((folder / file).read_text())
        raw.pop("eos_token" if file == "tokenizer_config.json" else "eos_token_id")
        (folder / file).write_text(json.dumps(raw))


def test_eos_comes_from_generation_config_when_config_json_has_none(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    without_eos_in(folder, "config.json")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 32003}))
    # generation_config.json's first, then the tokenizer's eos_token (32001)
    assert load_model(folder).config.eos_token_ids == (32003, 32001)


def test_eos_comes_from_the_tokenizer_when_no_config_names_one(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    without_eos_in(folder, "config.json", "generation_config.json")
    loaded = load_model(folder)
    assert loaded.config.eos_token_ids == (loaded.tokenizer.eos_token_id,) == (32001,)
    # and the engine accepts it (its constraint vocabulary needs an EOS)
    from ferrolm.engine import Engine
    from ferrolm.sampling_params import SamplingParams

    engine = Engine(loaded, kv_capacity=256)
    [result] = engine.generate([[32000, 12805]], SamplingParams(max_new_tokens=3))
    assert len(result.token_ids) == 3


def test_tokenizer_eos_is_added_after_the_configs_ids(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    (folder / "config.json").write_text(
        json.dumps(json.loads((folder / "config.json").read_text()) | {"eos_token_id": 5})
    )
    without_eos_in(folder, "generation_config.json")
    assert load_model(folder).config.eos_token_ids == (5, 32001)


def test_model_without_any_eos_is_refused_naming_the_three_places(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    without_eos_in(folder, "config.json", "generation_config.json", "tokenizer_config.json")
    with pytest.raises(InvalidInputError, match="config.json 'eos_token_id'.*generation_config.json.*'eos_token'"):
        load_model(folder)


def test_eos_id_beyond_the_vocabulary_is_refused(model: LoadedModel, tmp_path: Path) -> None:
    folder = copy_of_tiny(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [32001, 40000]}))
    with pytest.raises(InvalidInputError, match=r"\[40000\].*'vocab_size'"):
        load_model(folder)


def test_loading_without_weights_keeps_the_folder(model: LoadedModel) -> None:
    bare = load_model("tiny", with_weights=False)
    assert bare.weights == {} and bare.config == model.config
    assert bare.folder == tiny.tiny_folder()


def test_weights_are_the_same_on_every_machine(model: LoadedModel) -> None:
    # the bytes of the weights follow from the seed alone (see random_weights)
    def digest(name: str, rows: int | None = None) -> str:
        return hashlib.sha256(model.weights[name][:rows].tobytes()).hexdigest()

    assert digest("model.embed_tokens.weight") == "43a61bc96c718574bb201ad6e96c087da531789a1737adae4050b1810d44303b"
    # the rows of version 1's tokens are version 1's: the added tokens' rows came after them
    assert (
        digest("model.embed_tokens.weight", 32004) == "0c5919c25f7b0937711ab3e5a4b9a596e9fa572aa3dffe86522c11ef07eaa84e"
    )
    assert (
        digest("model.layers.3.mlp.down_proj.weight")
        == "cf774f4309fcbed4d65bbb1d05039ff184cecf0521b17a13d368c628454eb4fa"
    )
    assert model.weights["lm_head.weight"] is model.weights["model.embed_tokens.weight"]


def greedy(model: LoadedModel, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation, with the gap between the best and second-best logit per step."""
    runner = NumpyRunner(model.config, model.weights, num_slots=64)
    sequence = list(prompt)
    logits = runner.forward(ForwardBatch.from_requests([sequence], [list(range(len(sequence)))]))[0]
    out, margins = [], []
    for _ in range(steps):
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        out.append(int(np.argmax(logits)))
        sequence.append(out[-1])
        logits = runner.forward(ForwardBatch.from_requests([[out[-1]]], [list(range(len(sequence)))]))[0]
    return out, margins


def test_greedy_continuation_is_deterministic(model: LoadedModel) -> None:
    prompt = [int(i) for i in model.tokenizer.encode("Once upon a time")]
    assert prompt == [32000, 12805, 5304, 264, 892]
    first, margins = greedy(model, prompt, steps=8)
    second, _ = greedy(model, prompt, steps=8)
    assert first == second
    # far from ties, so rounding differences between machines cannot flip a choice
    assert min(margins) > 0.3
    assert first == [3094, 3094, 4278, 4278, 4278, 4278, 4278, 4278]


def random_text(rng: random.Random) -> str:
    pools = [
        "abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
        "  \n\n\t\r\n",
        "éèàüöçñßøåæœ",  # Latin-1 and beyond: two bytes each
        "αβγδεжзийклм",  # Greek and Cyrillic
        "日本語中文한국어漢字",  # three bytes
        "🙂🚀🎉👍🏽👨‍👩‍👧",  # four bytes, a skin-tone modifier and a ZWJ sequence
        "e\u0301a\u0308",  # combining marks
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randrange(0, 80)))


def test_tokenizer_round_trips_random_text(model: LoadedModel) -> None:
    rng = random.Random(7)
    for _ in range(300):
        text = random_text(rng)
        ids = model.tokenizer.encode(text, add_special_tokens=False)
        assert ids.dtype == np.int32
        assert model.tokenizer.decode(ids) == text


def test_token_bytes_concatenate_to_the_text(model: LoadedModel) -> None:
    # what the engine core's detokenizer does: join each token's bytes
    tok = model.tokenizer
    table = tok.token_bytes()
    assert len(table) == model.config.vocab_size
    rng = random.Random(8)
    for _ in range(100):
        text = random_text(rng)
        assert b"".join(table[i] for i in tok.encode(text, add_special_tokens=False)) == text.encode()
    assert table[32003] == b"<|im_end|>" and tok.special_token_ids == [32000, 32001, 32002, 32003]
    # the markers of tool calls and thinking: tokens of their own, kept in the text
    assert table[32004:32008] == [b"<tool_call>", b"</tool_call>", b"<think>", b"</think>"]
    assert tok.token_bytes(vocab_size=32064)[32008:] == [b""] * 56


def test_tokenizer_compresses_english(model: LoadedModel) -> None:
    text = (
        "The engine schedules requests, runs the model over a batch, and streams the new "
        "tokens back to each client as soon as they are sampled. Most of the time is spent "
        "in the forward pass, which is why the rest of the work should be cheap."
    )
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) < len(text.encode()) / 3.5
    assert int(ids.max()) < tiny.BPE_RANKS


def test_special_tokens_and_bos(model: LoadedModel) -> None:
    tok = model.tokenizer
    assert tok.vocab_size == model.config.vocab_size
    assert tok.bos_token_id == model.config.bos_token_id == 32000
    assert tok.eos_token_id == model.config.eos_token_ids[0]
    with_bos = tok.encode("hi")
    assert with_bos[0] == tok.bos_token_id and list(with_bos[1:]) == list(tok.encode("hi", add_special_tokens=False))
    ids = tok.encode("<|im_start|>x<|im_end|>", add_special_tokens=False)
    assert list(ids) == [32002, ids[1], 32003] and len(ids) == 3
    assert tok.decode(ids, skip_special_tokens=True) == "x"


def test_chat_template_renders_chatml(model: LoadedModel) -> None:
    tok = model.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt = tok.apply_chat_template(messages)
    assert prompt == (
        "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")
    ids = tok.encode(prompt, add_special_tokens=False)
    assert list(ids[:2]) == [32000, 32002] and int((ids == 32003).sum()) == 2


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
]


def test_chat_template_writes_tools_calls_and_results_hermes_style(model: LoadedModel) -> None:
    prompt = model.tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=TOOLS)
    assert prompt.startswith("<|begin_of_text|><|im_start|>system\nBe brief.\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "The forecast"' in prompt
    assert prompt.count("<|im_start|>system") == 1  # the system message goes with the tools
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        "<|im_end|>\n"
    ) in prompt
    assert "<|im_start|>tool\n<tool_response>\nrain\n</tool_response><|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = model.tokenizer.encode(prompt, add_special_tokens=False)
    # the tags are single tokens: two in the instructions, one per call
    assert int((ids == 32004).sum()) == 4 and int((ids == 32005).sum()) == 4


def test_transformers_renders_the_chat_template_the_same(model: LoadedModel) -> None:
    transformers = pytest.importorskip("transformers", reason="the comparison with Hugging Face's own rendering")
    theirs = transformers.AutoTokenizer.from_pretrained(str(model.folder))
    for messages, tools in [(TOOL_CONVERSATION, TOOLS), (TOOL_CONVERSATION[1:2], None)]:
        expected = theirs.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        assert model.tokenizer.apply_chat_template(messages, tools=tools) == expected
