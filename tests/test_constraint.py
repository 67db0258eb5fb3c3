"""The structured-output constraint engine through Python: grammars compiled from a real
tokenizer, masks into caller-owned numpy rows, and the engine producing documents that
validate, with typed errors for bad grammars and bad buffers."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from ferrolm import SamplingParams, _core
from ferrolm.engine import Engine
from ferrolm.errors import CorePanicError, InvalidInputError
from ferrolm.model import LoadedModel
from ferrolm.model.tiny import tiny_folder


@pytest.fixture(scope="module")
def vocab(tiny: LoadedModel) -> _core.Vocabulary:
    text = (tiny_folder() / "tokenizer.json").read_text()
    return _core.Vocabulary.from_tokenizer_json(text, eos_token_ids=list(tiny.config.eos_token_ids))


def allowed(vocab: _core.Vocabulary, m: _core.Matcher) -> set[int]:
    row = np.zeros(vocab.bitmask_words, np.int32)
    m.fill_next_token_bitmask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size]
    return set(np.flatnonzero(bits).tolist())


def test_vocabulary_from_tokenizer_json_matches_the_engine_table(tiny: LoadedModel, vocab: _core.Vocabulary) -> None:
    assert vocab.size == len(tiny.tokenizer.token_bytes())
    assert vocab.bitmask_words == (vocab.size + 31) // 32


def test_vocabulary_from_tiktoken_marks_eos_and_refuses_bad_lines() -> None:
    # "a", "b", "ab" by rank; "ab" is declared the EOS token
    vocab = _core.Vocabulary.from_tiktoken("YQ== 0\nYg== 1\nYWI= 2\n", eos_token_ids=[2])
    assert vocab.size == 3
    m = vocab.regex("a+").matcher()
    assert allowed(vocab, m) == {0}  # neither "b" nor EOS before the first "a"
    assert m.accept_token(0)
    assert allowed(vocab, m) == {0, 2}  # EOS where the document may end; "ab" is not text
    with pytest.raises(InvalidInputError) as e:
        _core.Vocabulary.from_tiktoken("not base64!! x\n")
    assert e.value.field == "vocabulary"


def test_vocabulary_compile_timeout_must_be_a_positive_number() -> None:
    for make in (
        lambda t: _core.Vocabulary([b"a", b"<eos>"], eos_token_ids=[1], compile_timeout_s=t),
        lambda t: _core.Vocabulary.from_tiktoken("YQ== 0\nIg== 1\nYg== 2\n", eos_token_ids=[2], compile_timeout_s=t),
    ):
        for bad in (float("nan"), 0.0, -1.0):
            with pytest.raises(InvalidInputError) as e:
                make(bad)
            assert e.value.field == "compile_timeout_s"
        assert make(1e9).json_schema('{"type": "string"}').matcher().accept_string('"a"')


def test_mask_equals_trying_every_token_and_leads_to_a_valid_document(
    tiny: LoadedModel, vocab: _core.Vocabulary
) -> None:
    pattern = r"(cat|dog)s? [0-9]{1,2}"
    m = vocab.regex(pattern).matcher()
    token_bytes = tiny.tokenizer.token_bytes()
    eos = set(tiny.config.eos_token_ids)
    text = b""
    for _ in range(12):
        mask = allowed(vocab, m)
        assert mask == {t for t in range(vocab.size) if m.is_token_allowed(t)}
        assert bool(mask & eos) == m.can_end(), "EOS exactly where the document may end"
        if m.can_end():
            break
        token = max(mask)  # an arbitrary allowed token: every one must lead somewhere valid
        assert m.accept_token(token)
        text += token_bytes[token]
    assert m.can_end()
    assert re.fullmatch(pattern, text.decode()), text


def test_accept_refuses_without_changing_state_and_rollback_restores(vocab: _core.Vocabulary) -> None:
    m = vocab.choice(["yes", "no"]).matcher()
    before = allowed(vocab, m)
    refused = next(t for t in range(vocab.size) if t not in before)
    assert not m.accept_token(refused)
    assert allowed(vocab, m) == before
    assert m.accept_string("ye")
    assert not m.can_end()
    assert m.forced_bytes() == b"s"
    assert m.accept_string("s") and m.can_end() and m.must_end()
    m.rollback(2)
    assert allowed(vocab, m) == before
    with pytest.raises(InvalidInputError) as e:
        m.rollback(5)
    assert e.value.field == "steps"


def test_batch_fill_matches_single_fills(vocab: _core.Vocabulary) -> None:
    grammars = [vocab.regex("[a-z]+"), vocab.json_object(), vocab.choice(["alpha", "beta"])]
    matchers = [g.matcher() for g in grammars]
    matchers[1].accept_string('{"k": ')
    rows = np.zeros((3, vocab.bitmask_words), np.int32)
    _core.fill_next_token_bitmask_batch(matchers, rows)
    for i, m in enumerate(matchers):
        single = np.zeros(vocab.bitmask_words, np.int32)
        m.fill_next_token_bitmask(single)
        assert np.array_equal(rows[i], single)


def test_bad_buffers_and_grammars_are_typed_errors(vocab: _core.Vocabulary) -> None:
    m = vocab.regex("a+").matcher()
    for bad in (np.zeros(vocab.bitmask_words - 1, np.int32), np.zeros(vocab.bitmask_words, np.int64), [0] * 4):
        with pytest.raises(InvalidInputError) as e:
            m.fill_next_token_bitmask(bad)  # type: ignore[arg-type]
        assert e.value.field == "bitmask"
    with pytest.raises(InvalidInputError) as e:
        _core.fill_next_token_bitmask_batch([m], np.zeros((2, vocab.bitmask_words), np.int32))
    assert e.value.field == "bitmask"
    cases = [
        (lambda: vocab.regex("(("), "regex"),
        (lambda: vocab.json_schema("{not json"), "json_schema"),
        # no value satisfies it
        (lambda: vocab.json_schema(json.dumps({"type": "object", "not": {}})), "json_schema"),
        # uniqueItems over an unbounded item domain: not expressible, so unsupported
        (lambda: vocab.json_schema(json.dumps(UNIQUE_INTEGERS)), "json_schema"),
        (lambda: vocab.json_schema(json.dumps({"$ref": "#/$defs/missing"})), "json_schema"),
        (lambda: vocab.json_object(whitespace="lots"), "whitespace"),
        (lambda: vocab.choice([]), "choice"),
    ]
    for make, field in cases:
        with pytest.raises(InvalidInputError) as e:
            make()
        assert e.value.field == field, e.value
    # lenient mode ignores what it cannot enforce
    m = vocab.json_schema(json.dumps(UNIQUE_INTEGERS), lenient=True).matcher()
    assert m.accept_string("[1,1]") and m.can_end()


UNIQUE_INTEGERS = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
}


def test_engine_output_validates_against_the_schema(tiny: LoadedModel) -> None:
    engine = Engine(tiny, kv_capacity=4096)
    # strict: only declared members, so the random model's document ends within the budget
    params = SamplingParams(max_new_tokens=120, temperature=1.0, json_schema=SCHEMA, json_schema_strict=True)
    for seed in range(6):
        params.seed = seed
        [r] = engine.generate("Reply in JSON:", params)
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), SCHEMA)
        assert set(json.loads(r.text)) <= set(SCHEMA["properties"])
    # the default (extra members allowed) may run to the budget on random weights; what ends is valid
    for seed in range(3):
        [r] = engine.generate(
            "Reply in JSON:", SamplingParams(max_new_tokens=160, temperature=1.0, seed=seed, json_schema=SCHEMA)
        )
        if r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.text), SCHEMA)
    [r] = engine.generate("x", SamplingParams(max_new_tokens=30, temperature=1.0, seed=1, regex=r"[0-9]{3}-[a-z]{2}"))
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", r.text), r.text
    [r] = engine.generate("x", SamplingParams(max_new_tokens=30, temperature=1.0, seed=2, choice=["red", "green"]))
    assert r.text in ("red", "green")
    flexible = SamplingParams(max_new_tokens=200, temperature=1.0, seed=4, json_object=True, whitespace="flexible")
    [r] = engine.generate("x", flexible)
    if r.finish_reason == "stop":
        assert isinstance(json.loads(r.text), dict)
    # strings (the last one may be cut off by the budget) may hold any spaces
    between_tokens = re.sub(r'"(?:[^"\\]|\\.)*(?:"|$)', '""', r.text)
    assert "     " not in between_tokens, "whitespace runs are capped"
    engine.core.check_invariants()


def test_free_text_until_the_trigger_then_strict(vocab: _core.Vocabulary) -> None:
    m = vocab.after_trigger("</think>", vocab.choice(["A", "B"])).matcher()
    assert m.accept_string("anything goes here, {not json} ")
    assert not m.can_end()
    assert m.accept_string("</think>")
    assert not m.accept_string("C"), "after the trigger only the grammar's documents"
    assert m.accept_string("B") and m.can_end()


def test_engine_structured_after_a_trigger(tiny: LoadedModel) -> None:
    engine = Engine(tiny, kv_capacity=4096)
    params = SamplingParams(max_new_tokens=60, temperature=1.0, seed=5, choice=["A", "B"], structured_after="X")
    [r] = engine.generate("x", params)
    # the output is free text, then (if the model wrote the trigger) exactly one choice
    if r.finish_reason == "stop":
        head, trigger, tail = r.text.partition("X")
        assert trigger == "X" and tail in ("A", "B"), r.text
    else:
        assert r.finish_reason == "length" and ("X" not in r.text or r.text.split("X", 1)[1] in ("", "A", "B"))


def test_engine_refuses_conflicting_or_foreign_grammars(tiny: LoadedModel, vocab: _core.Vocabulary) -> None:
    engine = Engine(tiny, kv_capacity=1024)
    with pytest.raises(InvalidInputError) as e:
        SamplingParams(regex="a", json_object=True)
    assert e.value.field == "json_object"
    with pytest.raises(InvalidInputError) as e:
        engine.submit("x", SamplingParams(regex="a", allowed_token_ids=[1]))
    assert e.value.field == "grammar"
    small = _core.Vocabulary([b"a", b"b", b"<eos>"], eos_token_ids=[2])
    with pytest.raises(InvalidInputError) as e:
        engine.core.submit(99, [1, 2], grammar=small.regex("a+"))
    assert e.value.field == "grammar"
    assert not engine.has_work()


# panics inside the constraint bindings


def small_vocab() -> _core.Vocabulary:
    return _core.Vocabulary([b"a", b"b", b"[", b"]", b",", b"<eos>"], eos_token_ids=[5])


def test_a_matcher_panic_is_a_core_panic_error_and_poisons_the_matcher() -> None:
    grammar = small_vocab().regex("a+")
    m = grammar.matcher()
    caught = None
    try:
        m._inject_panic()
    except Exception as e:  # what an engine loop catches: it must not be a BaseException
        caught = e
    assert isinstance(caught, CorePanicError) and isinstance(caught, RuntimeError)
    row = np.zeros(1, np.int32)
    calls = [
        lambda: m.accept_token(0),
        lambda: m.accept_string("a"),
        lambda: m.fill_next_token_bitmask(row),
        lambda: m.is_token_allowed(0),
        lambda: m.rollback(0),
        m.reset,
        m.can_end,
        m.must_end,
        m.is_ended,
        m.forced_bytes,
        lambda: m.num_steps,
        lambda: _core.fill_next_token_bitmask_batch([m], np.zeros((1, 1), np.int32)),
    ]
    for call in calls:
        with pytest.raises(CorePanicError, match="unusable"):
            call()
    # Other matchers of the same grammar are unaffected.
    other = grammar.matcher()
    assert other.accept_token(0) and other.can_end()


def test_a_vocabulary_panic_is_a_core_panic_error_and_the_vocabulary_stays_usable() -> None:
    v = small_vocab()
    with pytest.raises(CorePanicError):
        v._inject_panic()
    m = v.json_schema('{"type":"array","items":{"type":"array"}}').matcher()
    assert m.accept_string("[[],[a") is False and m.accept_string("[[],[]]") and m.can_end()


# hostile schemas: bounded compile size, refused endless recursion


def nested_arrays(depth: int) -> str:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps(schema)


def vm_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS line")


def doubling_refs(levels: int) -> str:
    """A small request whose every level uses the one below twice."""
    defs: dict[str, object] = {"l0": {"type": "string"}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/$defs/l{i - 1}"}
        defs[f"l{i}"] = {
            "anyOf": [{"type": "array", "items": below}, {"type": "object", "additionalProperties": below}]
        }
    return json.dumps({"$defs": defs, "$ref": f"#/$defs/l{levels}"})


def test_hostile_nesting_compiles_in_bounded_memory(vocab: _core.Vocabulary) -> None:
    # Nested arrays used to double their grammar per level: depth 20 (630 bytes) took
    # 22 GB, depth 18 left 2.5 GB behind. Each must now compile or be refused quickly.
    before = vm_rss_kib()
    for depth in [18, 20, 25, 40, 100]:
        m = vocab.json_schema(nested_arrays(depth)).matcher()
        assert m.accept_string("[" * depth + '"x"' + "]" * depth) and m.can_end()
    for levels in [10, 20, 30]:
        try:
            vocab.json_schema(doubling_refs(levels))
        except InvalidInputError as e:
            assert e.field == "grammar" and "KiB" in str(e), e
    grown_mib = (vm_rss_kib() - before) / 1024
    # Generous: grammars, mask caches and allocator slack are tens of MiB at most.
    assert grown_mib < 1024, f"RSS grew by {grown_mib:.0f} MiB"


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {
            "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
            "$ref": "#/$defs/a",
        },
        {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    ],
)
def test_schemas_no_finite_document_matches_are_refused_at_compile_time(
    vocab: _core.Vocabulary, schema: dict[str, object]
) -> None:
    with pytest.raises(InvalidInputError) as e:
        vocab.json_schema(json.dumps(schema))
    assert e.value.field == "json_schema"
    assert "no finite document matches" in str(e.value)


def test_recursive_schemas_with_a_way_out_still_compile(vocab: _core.Vocabulary) -> None:
    linked = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    m = vocab.json_schema(json.dumps(linked)).matcher()
    assert m.accept_string('{"v":1,"next":{"v":2}}') and m.can_end()


def test_json_schema_follows_the_spec_and_strict_closes_objects(tiny: LoadedModel, vocab: _core.Vocabulary) -> None:
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "x-internal": True,
            "links": [{"rel": "self"}],
        }
    )
    m = vocab.json_schema(schema).matcher()
    assert m.accept_string('{"name":"n","zzz":{"a":[1]}}'), "an absent additionalProperties allows extras"
    strict = vocab.json_schema(schema, strict=True).matcher()
    assert strict.accept_string('{"name":"n"')
    assert not strict.accept_string(',"zzz":1'), "strict mode: only declared members"
    assert strict.accept_string("}") and strict.can_end()
    normalized = json.loads(
        _core.json_schema_normalized(
            json.dumps(
                {
                    "$schema": "http://json-schema.org/draft-04/schema#",
                    "minimum": 1,
                    "exclusiveMinimum": True,
                    "id": "x",
                }
            )
        )
    )
    assert normalized == {"exclusiveMinimum": 1}
    with pytest.raises(InvalidInputError):
        SamplingParams(json_schema_strict=True)
    engine = Engine(tiny, kv_capacity=2048)
    loose = engine.grammar(SamplingParams(json_schema=schema)).matcher()  # type: ignore[union-attr]
    closed = engine.grammar(SamplingParams(json_schema=schema, json_schema_strict=True)).matcher()  # type: ignore[union-attr]
    assert loose.accept_string('{"name":"n","z":1}')
    assert not closed.accept_string('{"name":"n","z":1}')
