"""The instance generator of the Kubernetes and GitHub corpora (``scripts/corpus_instances.py``):
what it writes is valid (or invalid) by ``jsonschema``'s verdict, it writes the same on
every run, and the committed instances are what it writes."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ferrolm.bench.corpus import CORPORA, verdicts

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "corpus_instances.py"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corpus_instances", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["corpus_instances"] = module
    spec.loader.exec_module(module)
    return module


SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["name", "kind", "replicas"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 20, "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"},
        "kind": {"enum": ["Deployment", "StatefulSet"]},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 50},
        "created": {"type": "string", "format": "date-time"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "owner": {"$ref": "#/definitions/user"},
        "ports": {"type": "array", "minItems": 1, "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]}},
    },
    "definitions": {"user": {"type": "object", "required": ["login"], "properties": {"login": {"type": "string"}}}},
}


def test_generated_documents_are_valid_and_mutations_invalid(gen: ModuleType) -> None:
    valid, invalid, notes = gen.generate("t", SCHEMA, [])
    assert not notes
    assert set(valid) == {"gen-minimal.json", "gen-rich-1.json", "gen-rich-2.json"}
    assert valid["gen-minimal.json"].keys() == {"name", "kind", "replicas"}
    for doc in valid.values():
        assert verdicts(SCHEMA, doc) == (True, True), doc
    assert set(invalid) == {f"gen-{k}.json" for k in gen.NEGATIVE_KINDS}
    for doc, what in invalid.values():
        assert verdicts(SCHEMA, doc) == (False, False), (doc, what)
    assert "outside the enum" in invalid["gen-enum.json"][1]
    assert "unexpectedMember" in invalid["gen-extra-member.json"][0]
    assert "required" in invalid["gen-missing-required.json"][1]
    # the same output on every run (seeded by the schema's name)
    assert gen.generate("t", SCHEMA, []) == (valid, invalid, notes)
    assert gen.generate("u", SCHEMA, [])[0] != valid


def test_a_schema_nothing_satisfies_is_reported_not_written(gen: ModuleType) -> None:
    schema = {"type": "string", "pattern": "^(a)\\1$"}  # a backreference: not written
    valid, invalid, notes = gen.generate("t", schema, [])
    assert valid == {} and invalid == {}
    assert len(notes) == 3 and all("no valid" in n for n in notes)
    impossible = {"allOf": [{"type": "string"}, {"type": "integer"}]}
    assert gen.generate("t", impossible, [])[0] == {}


@pytest.mark.parametrize(
    "pattern",
    [
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "^v[0-9]+\\.[0-9]+$",
        "^(TCP|UDP|SCTP)$",
        "[^/]+/[^/]+",
        "^\\d{3}-\\w+$",
        "^(?:[A-Z][a-z]+)+$",
    ],
)
def test_strings_are_written_for_patterns(gen: ModuleType, pattern: str) -> None:
    import random

    assert re.search(pattern, gen.string_for_pattern(pattern, random.Random(0)))


@pytest.mark.parametrize(
    "corpus,name", [("kubernetes", "configmap-v1"), ("kubernetes", "service-v1"), ("github", "star.created")]
)
def test_committed_instances_are_what_the_generator_writes(gen: ModuleType, corpus: str, name: str) -> None:
    root = CORPORA[corpus]
    valid, invalid, _ = gen.generate_for(root, name)
    assert valid and invalid
    committed_valid = {p.name: json.loads(p.read_text()) for p in (root / "test" / name).glob("gen-*.json")}
    committed_invalid = {p.name: json.loads(p.read_text()) for p in (root / "negative_test" / name).glob("gen-*.json")}
    assert committed_valid == valid
    assert committed_invalid == {k: doc for k, (doc, _) in invalid.items()}
    mutations = (root / "negative_test" / "MUTATIONS.txt").read_text()
    for file, (_, what) in invalid.items():
        assert f"{name}/{file}: {what}\n" in mutations
