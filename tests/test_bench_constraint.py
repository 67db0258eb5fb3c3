"""Smoke test of ``ferrolm bench constraint`` on a tiny synthetic vocabulary: the report's
structure, and that valid documents are accepted token by token (no timing checked)."""

from __future__ import annotations

import json

import pytest
from ferrolm.bench import constraint as bc

MERGES = [
    b'":',
    b'",',
    b'","',
    b"na",
    b"me",
    b"name",
    b"tr",
    b"ue",
    b"true",
    b"nu",
    b"ll",
    b"null",
    b"00",
    b"20",
    b"-0",
]


@pytest.fixture(scope="module")
def vocab() -> bc.BenchVocab:
    return bc.synthetic_vocab(MERGES)


def test_bpe_merges_by_rank_and_round_trips(vocab: bc.BenchVocab) -> None:
    text = '{"name":"Ada","ok":true,"x":null,"d":"2024-01-02"}'
    tokens = vocab.encode(text)
    assert vocab.decode(tokens) == text.encode()
    assert vocab.ranks[b"name"] in tokens and vocab.ranks[b"true"] in tokens and vocab.ranks[b'":'] in tokens
    assert len(tokens) < len(text.encode())
    assert bc.bpe_encode(vocab.ranks, b"nametrue") == [vocab.ranks[b"name"], vocab.ranks[b"true"]]


def test_suite_documents_follow_schema_order_and_generation_reading() -> None:
    schema = {"properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    assert bc.compact(bc.order_value({"a": "x", "b": 1.0}, schema, schema)) == '{"b":1,"a":"x"}'
    assert bc.within_generation_reading({"a": "x"}, schema, schema)
    assert not bc.within_generation_reading({"c": 1}, schema, schema)  # undeclared member
    assert bc.within_generation_reading({"c": 1}, {**schema, "additionalProperties": True}, schema)
    assert not bc.within_generation_reading("nope", {"format": "email"}, {})
    cases, stats = bc.suite_cases()
    assert stats["schemas"] == len(cases) > 300
    assert 0 < stats["documents"] <= stats["valid_instances"] - stats["left_out"]


def test_hand_written_documents_are_valid() -> None:
    import jsonschema  # a dev dependency

    assert 20 <= len(bc.hand_schemas()) <= 40
    for name, schema, doc in bc.hand_schemas():
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        errors = [e.message for e in validator.iter_errors(json.loads(bc.compact(doc)))]
        assert not errors, (name, errors)


def test_report_structure_and_documents_accepted(vocab: bc.BenchVocab) -> None:
    hand = [c for c in bc.hand_cases() if c.name in ("user", "order", "tool_call", "org_chart")]
    suite, _ = bc.suite_cases()
    suite = [c for c in suite if c.documents][:6]
    cases = hand + suite
    report = bc.bench(vocab, cases, ["ferrolm", "xgrammar"], seed=1, batch=4, batch_rounds=2)
    json.dumps(report)  # serializable
    assert report["schemas"] == {
        "total": len(cases),
        "suite": len(suite),
        "hand": len(hand),
        "schemastore": 0,
        "kubernetes": 0,
        "github": 0,
    }
    assert report["vocab_size"] == vocab.size == 256 + len(MERGES) + 1
    assert "xgrammar" in report["skipped"] or "xgrammar" in report["engines"]
    ours = report["engines"]["ferrolm"]
    by_hand = ours["by_source"]["hand"]
    assert (by_hand["schemas"], by_hand["compiled"], by_hand["documents"], by_hand["rejected_valid"]) == (
        len(hand),
        len(hand),
        len(hand),
        0,
    )
    assert 0 < by_hand["compile_ms"]["p50"] <= by_hand["compile_ms"]["p95"]
    assert ours["attempted"] == len(cases) and ours["compiled"] >= len(hand)
    assert ours["rejected_valid"] == 0, ours["rejections"]
    assert ours["documents"] >= len(hand) and ours["tokens"] > ours["documents"]
    for key in ("p50", "p95", "max"):
        assert ours["compile_ms"][key] > 0
    assert 0 < ours["mask_us"]["p50"] <= ours["mask_us"]["p99"]
    # every fill of every document, walked a second time
    assert ours["warm_mask_us"]["fills"] == ours["tokens"]
    assert 0 < ours["warm_mask_us"]["p50"] <= ours["warm_mask_us"]["p99"]
    assert ours["batch64_us"] is not None and ours["batch64_us"] > 0
    table = bc.format_table(report)
    assert "ferrolm" in table and "floor: no valid document rejected: met" in table
    assert "second walk of the same documents" in table


def test_a_wrong_document_is_reported_as_rejected(vocab: bc.BenchVocab) -> None:
    case = bc.Case(
        "t",
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        ['{"n":1}', '{"n":"x"}'],
        "hand",
    )
    report = bc.bench(vocab, [case], ["ferrolm"], batch=2, batch_rounds=1)
    [rejection] = report["engines"]["ferrolm"]["rejections"]
    assert rejection["document"] == '{"n":"x"}' and rejection["token_index"] > 0


def test_add_parser_defaults() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    bc.add_parser(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["constraint", "--max-schemas", "5", "--json", "out.json"])
    assert (args.vocab, args.max_schemas, args.seed, args.json) == ("o200k_base", 5, 0, "out.json")
    assert args.corpus == "suite"
    for corpus in ("schemastore", "kubernetes", "github", "all"):
        assert parser.parse_args(["constraint", "--corpus", corpus]).corpus == corpus
    with pytest.raises(SystemExit):
        parser.parse_args(["constraint", "--corpus", "nope"])
    assert args.func is bc.run


def test_schemastore_corpus_cases_are_benched(vocab: bc.BenchVocab) -> None:
    cases, stats = bc.schemastore_cases()
    assert stats["schemas"] == len(cases) >= 100 and stats["documents"] > 100
    assert stats["valid_instances"] >= stats["documents"] and stats["invalid_instances"] > 0
    picked = [c for c in cases if c.name in ("bigquery-table", "ninjs-1.4", "prettierrc")]
    assert len(picked) == 3 and all(c.source == "schemastore" and c.documents for c in picked)
    report = bc.bench(vocab, picked, ["ferrolm"], batch=2, batch_rounds=1)
    ours = report["engines"]["ferrolm"]
    assert report["schemas"]["schemastore"] == 3 and ours["by_source"]["schemastore"]["schemas"] == 3
    assert ours["compiled"] >= 2 and ours["rejected_valid"] == 0, ours["rejections"]
    assert "schemastore" in bc.format_table(report)


@pytest.mark.parametrize("corpus", ["kubernetes", "github"])
def test_generated_corpora_cases_are_benched_per_source(vocab: bc.BenchVocab, corpus: str) -> None:
    cases, stats = bc.corpus_cases(corpus)
    assert stats["schemas"] == len(cases) >= 38 and stats["documents"] >= 100
    assert stats["invalid_instances"] >= 100 and all(c.source == corpus for c in cases)
    small = sorted((c for c in cases if c.documents), key=lambda c: len(c.schema))[:2]
    other, _ = bc.schemastore_cases()
    picked = small + [c for c in other if c.name == "prettierrc"]
    report = bc.bench(vocab, picked, ["ferrolm"], batch=2, batch_rounds=1)
    ours = report["engines"]["ferrolm"]
    assert report["schemas"][corpus] == 2 and report["schemas"]["schemastore"] == 1
    assert ours["by_source"][corpus]["compiled"] == 2 and ours["rejected_valid"] == 0, ours["rejections"]
    assert ours["by_source"][corpus]["documents"] == sum(len(c.documents) for c in small)
    table = bc.format_table(report)
    assert "per corpus" in table and corpus in table


def test_a_peer_under_a_time_budget_stops_attempting(vocab: bc.BenchVocab) -> None:
    """Any peer (in process too) stops after its budget; compiled counts are of those attempted."""
    cases = [c for c in bc.hand_cases()][:4]
    engine = bc.FerrolmEngine(vocab)
    tokenized = {c.name: [vocab.encode(d) for d in c.documents] for c in cases}
    spent = bc.run_engine(engine, cases, tokenized, vocab.size, vocab.eos, budget_s=0.0)
    assert spent.attempted == 0 and "time budget of 0 s spent: 0 of 4" in spent.note
    assert bc.summarize(spent, cases)["by_source"]["hand"]["schemas"] == 0
    full = bc.run_engine(engine, cases, tokenized, vocab.size, vocab.eos, budget_s=None)
    assert full.attempted == 4 and not full.note
    assert bc.summarize(full, cases)["by_source"]["hand"]["schemas"] == 4
    # past the walk budget, schemas are compiled and timed, documents accepted without masks
    unwalked = bc.run_engine(engine, cases, tokenized, vocab.size, vocab.eos, walk_budget_s=0.0)
    assert len(unwalked.compiled) == len(unwalked.compile_ms) == 4 and len(unwalked.mask_us) == 1
    assert "the documents of 1 of the 4 schemas compiled walked" in unwalked.note
    assert len(unwalked.checked) == 3 and not unwalked.rejected  # the others accepted without masks
    by_hand = bc.summarize(unwalked, cases)["by_source"]["hand"]
    assert (by_hand["compiled"], by_hand["documents"]) == (4, 4)
    wrong = bc.Case("wrong", cases[0].schema, ['{"nope":'], "hand")
    tokenized["wrong"] = [vocab.encode(d) for d in wrong.documents]
    refused = bc.run_engine(engine, [cases[0], wrong], tokenized, vocab.size, vocab.eos, walk_budget_s=0.0)
    assert refused.checked == {"wrong"} and [r["case"] for r in refused.rejected] == ["wrong"]


def test_floors_compare_compiled_schemas_with_llguidance() -> None:
    def engine(names: list[str], errors: dict[str, str]) -> dict[str, object]:
        return {
            "compiled": len(names),
            "per_schema": {n: {} for n in names},
            "compile_errors": errors,
            "rejected_valid": 0,
            "compile_ms": {"p50": 1.0, "p95": 2.0},
            "mask_us": {"p50": 1.0, "p99": 2.0},
        }

    report = {
        "engines": {
            "ferrolm": engine(["a", "b", "c"], {"d": "unsupported x"}),
            "llguidance": engine(["a", "d"], {"b": "y", "c": "z"}),
        }
    }
    assert bc.missed_by_ferrolm(report, "llguidance") == {"d": "unsupported x"}
    floors = dict(bc.floor_checks(report))
    assert floors["compiles more schemas than llguidance"] is True
    assert floors["compiles at least 95% of the schemas llguidance compiles (50%)"] is False


def test_speed_floors_compare_the_schemas_both_compile() -> None:
    def engine(p50: float) -> dict[str, object]:
        return {
            "compiled": 2,
            "per_schema": {"a": {}, "b": {}},
            "compile_errors": {},
            "rejected_valid": 0,
            "compile_ms": {"p50": p50, "p95": p50},
            "mask_us": {"p50": p50, "p99": p50},
        }

    # Overall, ferrolm looks slower (it also compiled harder schemas); on the schemas
    # both compile it is faster in compile p50 and mask p99, slower in compile p95.
    both = {
        "schemas": 2,
        "ferrolm": {"compile_ms_p50": 1.0, "compile_ms_p95": 9.0, "mask_us_p50": 1.0, "mask_us_p99": 5.0},
        "peer": {"compile_ms_p50": 2.0, "compile_ms_p95": 3.0, "mask_us_p50": 8.0, "mask_us_p99": 6.0},
    }
    report = {"engines": {"ferrolm": engine(50.0), "llguidance": engine(2.0)}, "head_to_head": {"llguidance": both}}
    floors = dict(bc.floor_checks(report))
    on = "on the 2 schemas both compile"
    assert floors[f"compile p50 no worse than llguidance's {on}"] is True
    assert floors[f"mask p99 no worse than llguidance's {on}"] is True
    assert floors[f"compile p95 no worse than llguidance's {on}"] is False
    assert floors["compile p95 under 50 ms"] is False  # over every schema ferrolm compiled
    # Without a head-to-head section no speed comparison is claimed.
    del report["head_to_head"]
    assert not any("no worse" in name for name in dict(bc.floor_checks(report)))
