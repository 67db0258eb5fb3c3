"""Real-world schemas: a sample of the JSON SchemaStore catalog with its test instances
(``crates/ferrolm-constraint/tests/data/schemastore``). With the o200k and cl100k
vocabularies, every schema ferrolm compiles must accept every instance ``jsonschema``
accepts (members written in the order the engine generates them, the one documented
restriction), token by token, each token inside the mask, EOS allowed at the end; and must
refuse every instance ``jsonschema`` rejects. Run with ``-s`` for the counts."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ferrolm import _core
from ferrolm.bench import constraint as bc
from ferrolm.bench.corpus import CorpusSchema, Orderer, documents, load_corpus
from ferrolm.errors import InvalidInputError

# tokens per document whose mask is checked (beyond it, tokens are only accepted)
MASKED_TOKENS = 400


@pytest.fixture(scope="module")
def corpus() -> list[CorpusSchema]:
    return load_corpus()


def test_corpus_sample_is_present_and_decided(corpus: list[CorpusSchema]) -> None:
    assert len(corpus) >= 100
    assert sum(len(c.valid) for c in corpus) >= 150
    assert sum(len(c.invalid) for c in corpus) >= 50


def walk(vocab: bc.BenchVocab, grammar: _core.Grammar, text: str, row: np.ndarray) -> str | None:
    """None if the document is accepted token by token and may end there, else why not."""
    m = grammar.matcher()
    for i, token in enumerate(vocab.encode(text)):
        if i < MASKED_TOKENS:
            m.fill_next_token_bitmask(row)
            if not (int(row[token >> 5]) >> (token & 31)) & 1:
                return f"token {i} ({vocab.decode([token])!r}) not in the mask"
        if not m.accept_token(token):
            return f"token {i} ({vocab.decode([token])!r}) refused"
    if not m.accept_token(vocab.eos):
        return "cannot end"
    return None


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_corpus_valid_documents_are_accepted_and_invalid_ones_refused(
    corpus: list[CorpusSchema], name: str
) -> None:
    vocab = bc.load_vocab(name)
    core = _core.Vocabulary(vocab.token_bytes(), special_token_ids=[vocab.eos], eos_token_ids=[vocab.eos])
    row = np.zeros(core.bitmask_words, np.int32)
    counts = {"schemas": len(corpus), "compiled": 0, "valid": 0, "valid_accepted": 0, "invalid": 0,
              "invalid_refused": 0}
    refusals: dict[str, str] = {}
    mistakes: list[str] = []
    for entry in corpus:
        try:
            grammar = core.json_schema(entry.text)
        except InvalidInputError as e:
            refusals[entry.name] = str(e)
            continue
        counts["compiled"] += 1
        orderer = Orderer(json.loads(_core.json_schema_normalized(entry.text)))
        for instance in entry.valid:
            counts["valid"] += 1
            texts = documents(orderer, instance)
            why = [walk(vocab, grammar, t, row) for t in texts]
            if any(w is None for w in why):
                counts["valid_accepted"] += 1
            else:
                mistakes.append(f"{entry.name}: valid {texts[0][:300]} refused: {why[0]}")
        for instance in entry.invalid:
            counts["invalid"] += 1
            texts = documents(orderer, instance)
            accepted = [t for t in texts if accepts(grammar, t, vocab.eos)]
            if accepted:
                mistakes.append(f"{entry.name}: invalid {accepted[0][:300]} accepted")
            else:
                counts["invalid_refused"] += 1
    print(f"\n{name}: {counts}")
    for schema, why in sorted(refusals.items()):
        print(f"  refused {schema}: {why[:160]}")
    assert not mistakes, "\n".join(mistakes)
    # a floor against regressions: 66 of the 120 compiled when this was written
    assert counts["compiled"] >= 60 and counts["valid"] >= 110


def accepts(grammar: _core.Grammar, text: str, eos: int) -> Any:
    m = grammar.matcher()
    return m.accept_string(text) and m.accept_token(eos)


def test_orderer_follows_refs_branches_and_all_of() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"base": {"properties": {"id": {"type": "integer"}}}},
        "allOf": [{"$ref": "#/definitions/base"}, {"properties": {"name": {"type": "string"}}}],
        "properties": {"tags": {"type": "array", "items": {"properties": {"k": {}, "v": {}}}}},
    }
    orderer = Orderer(json.loads(_core.json_schema_normalized(json.dumps(schema))))
    instance = {"x": 1.0, "tags": [{"v": 1, "k": 2}], "name": "n", "id": 3}
    assert documents(orderer, instance)[0] == '{"id":3,"tags":[{"k":2,"v":1}],"name":"n","x":1}'
