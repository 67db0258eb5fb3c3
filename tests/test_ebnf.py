"""Grammars in GBNF / EBNF (llama.cpp's notation, which xgrammar reads too) through Python:
``Vocabulary.ebnf`` on the tiny model's tokenizer, ``SamplingParams.ebnf`` in the engine,
and the HTTP fields that carry a grammar (SGLang's ``ebnf``, vLLM's ``guided_grammar``,
llama.cpp's ``grammar``), with 400s naming the field for grammars that do not compile.
The constraint crate's own tests check the translation against an independent oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ferrolm import SamplingParams, _core
from ferrolm.engine import Engine
from ferrolm.errors import InvalidInputError
from ferrolm.model import LoadedModel
from ferrolm.model.tiny import tiny_folder
from ferrolm.server.testing import RunningServer

GRAMMARS = Path(__file__).resolve().parents[1] / "crates" / "ferrolm-constraint" / "tests" / "data" / "gbnf"

# Nested JSON arrays of small numbers: recursive (the engine calls a rule per bracket),
# and every output is checked by json.loads.
NESTED = r"""
root  ::= array
array ::= "[" (value ("," value)*)? "]"
value ::= [0-9] | array   # a digit, or arrays within arrays
"""


@pytest.fixture(scope="module")
def vocab(tiny: LoadedModel) -> _core.Vocabulary:
    text = (tiny_folder() / "tokenizer.json").read_text()
    return _core.Vocabulary.from_tokenizer_json(text, eos_token_ids=list(tiny.config.eos_token_ids))


def allowed(vocab: _core.Vocabulary, m: _core.Matcher) -> set[int]:
    row = np.zeros(vocab.bitmask_words, np.int32)
    m.fill_next_token_bitmask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size]
    return set(np.flatnonzero(bits).tolist())


def nested_ok(value: Any) -> bool:
    return isinstance(value, list) and all((isinstance(v, int) and 0 <= v <= 9) or nested_ok(v) for v in value)


def test_json_gbnf_through_the_binding(tiny: LoadedModel, vocab: _core.Vocabulary) -> None:
    grammar = vocab.ebnf((GRAMMARS / "json.gbnf").read_text())
    m = grammar.matcher()
    assert m.accept_string('{"a": [1, {"b": null}], "c": "x"}') and m.can_end()
    assert not grammar.matcher().accept_string('{"a": 01}')
    assert not grammar.matcher().accept_string("[1]")
    # walk the mask: every allowed token is one the matcher accepts; EOS where it may end
    m = grammar.matcher()
    token_bytes = tiny.tokenizer.token_bytes()
    eos = set(tiny.config.eos_token_ids)
    text = b""
    for _ in range(16):
        mask = allowed(vocab, m)
        assert mask == {t for t in range(vocab.size) if m.is_token_allowed(t)}
        assert bool(mask & eos) == m.can_end()
        token = min(mask - eos)  # an arbitrary allowed token
        assert m.accept_token(token)
        text += token_bytes[token]
    # the text so far can still be finished as JSON: close what is open
    assert text.startswith(b"{")


def test_grammar_errors_are_typed_and_name_the_field(vocab: _core.Vocabulary) -> None:
    with pytest.raises(InvalidInputError) as e:
        vocab.ebnf('root ::= item+\nitem ::= "a" | missing\n')
    assert e.value.field == "ebnf"
    assert "line 2, column 16" in str(e.value) and "undefined rule `missing`" in str(e.value)
    with pytest.raises(InvalidInputError) as e:
        vocab.ebnf('start: "a"')  # Lark
    assert e.value.field == "ebnf" and "Lark" in str(e.value)
    with pytest.raises(InvalidInputError) as e:
        vocab.ebnf('root ::= "c" root (" " root)* | "a"')  # needs more than one character of lookahead
    assert e.value.field == "ebnf" and "unsupported grammar (rule `root`)" in str(e.value)
    with pytest.raises(InvalidInputError) as e:
        vocab.ebnf("root ::= ([a-z]{100000}){100000}")
    assert e.value.field == "grammar"


def test_engine_output_parses_under_the_grammar(tiny: LoadedModel) -> None:
    engine = Engine(tiny, kv_capacity=4096)
    finished = 0
    for seed in range(6):
        [r] = engine.generate("x", SamplingParams(max_new_tokens=40, temperature=1.0, seed=seed, ebnf=NESTED))
        if r.finish_reason == "stop":
            finished += 1
            assert nested_ok(json.loads(r.text)), r.text
        else:  # out of budget: a prefix of a document
            assert r.text.startswith("["), r.text
    assert finished >= 2
    with pytest.raises(InvalidInputError) as e:
        engine.submit("x", SamplingParams(ebnf='root ::= ("a"'))
    assert e.value.field == "ebnf" and "line 1, column 10" in str(e.value)
    engine.core.check_invariants()
    assert not engine.has_work()


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


FIELDS = [
    pytest.param("/v1/completions", {"prompt": "x"}, "guided_grammar", id="vllm-guided_grammar"),
    pytest.param("/v1/completions", {"prompt": "x"}, "ebnf", id="sglang-ebnf"),
    pytest.param(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "grammar", id="llama.cpp-grammar"
    ),
    pytest.param("/generate", {"text": "x"}, "sampling_params.ebnf", id="native-ebnf"),
]


def generated_text(path: str, body: dict[str, Any]) -> tuple[str, str]:
    if path == "/generate":
        return body["text"], body["meta_info"]["finish_reason"]["type"]
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return text, choice["finish_reason"]


def with_field(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field.startswith("sampling_params."):
        return {
            **body,
            "sampling_params": {field.split(".", 1)[1]: value, "max_new_tokens": 40, "temperature": 1.0, "seed": 3},
        }
    return {**body, field: value, "max_tokens": 40, "temperature": 1.0, "seed": 3}


@pytest.mark.parametrize(("path", "body", "field"), FIELDS)
def test_grammar_fields_constrain_the_output(
    server: RunningServer, path: str, body: dict[str, Any], field: str
) -> None:
    r = httpx.post(f"{server.url}{path}", json=with_field(body, field, NESTED), timeout=60)
    assert r.status_code == 200, r.text
    text, finish = generated_text(path, r.json())
    if finish == "stop":
        assert nested_ok(json.loads(text)), text
    else:
        assert text.startswith("["), text


@pytest.mark.parametrize(("path", "body", "field"), FIELDS)
def test_a_grammar_that_does_not_compile_is_a_400_naming_the_field(
    server: RunningServer, path: str, body: dict[str, Any], field: str
) -> None:
    r = httpx.post(f"{server.url}{path}", json=with_field(body, field, 'root ::= "a" | b'), timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field, error
    assert "line 1, column 16" in error["message"] and "undefined rule `b`" in error["message"], error


def test_two_grammar_fields_are_refused(server: RunningServer) -> None:
    body = {"prompt": "x", "guided_grammar": NESTED, "ebnf": NESTED}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_grammar", r.text


# ---- the same grammars in xgrammar (where it reads them) accept the same texts ----

DOCUMENTS = {
    "arithmetic.gbnf": ["1=2\n", "a +b=c\n", "(a+b) *3 = x\n1=1\n", "( a )=b\n", "1=2", "a + b=c\n", "=1\n"],
    "c.gbnf": [
        "int main(){return 0;}",
        "int f(int x){if(x<1){return 1;}else{return x*f(x-1);}}",
        "int f(){while(a<b){x = -( a+b );}}",
        "int f(){x = (a+b);}",
        "int f(){",
        "",
    ],
    "chess.gbnf": ["1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8+\n", "1. e4 e5\n"],
    "list.gbnf": ["- one\n", "- a\n- b, c\n", "- \n", "-a\n"],
    "japanese.gbnf": ["こんにちは", "カタカナ 漢字\nです。", "hello"],
    "english.gbnf": ["Hello, world!", "a b\tc\n(1+2)=3", "héllo", "a  b"],
    "json_arr_2023.gbnf": ['[\n1, {"a": [true, "x\\n"]}]', "[\n]", "[]", '[\n"\\x"]'],
}


def test_xgrammar_accepts_the_same_texts() -> None:
    xgr = pytest.importorskip(
        "xgrammar",
        reason="xgrammar is an optional peer (the crate's Earley oracle checks the same translation without it)",
    )
    import random

    from xgrammar.testing import _is_grammar_accept_string

    vocab = _core.Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>"], eos_token_ids=[256])
    rng = random.Random(3)
    compared = 0
    for name, documents in DOCUMENTS.items():
        text = (GRAMMARS / name).read_text()
        ours, theirs = vocab.ebnf(text), xgr.Grammar.from_ebnf(text)
        variants = list(documents)
        for doc in documents:  # near misses: a character dropped, doubled or swapped for another
            for _ in range(6):
                i = rng.randrange(len(doc) + 1)
                variants.append(
                    rng.choice(
                        [
                            doc[:i] + doc[i + 1 :],
                            doc[:i] + doc[i : i + 1] + doc[i:],
                            doc[:i] + rng.choice("a1 ()\n{}[],=-") + doc[i + 1 :],
                        ]
                    )
                )
        for doc in variants:
            m = ours.matcher()
            accepted = m.accept_string(doc) and m.can_end()
            assert accepted == _is_grammar_accept_string(theirs, doc), (name, doc)
            compared += 1
    assert compared > 200
