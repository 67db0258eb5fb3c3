"""``ferrolm bench constraint``: the structured-output constraint engine against its peers
(llguidance, xgrammar, outlines-core, each when importable), in one run, on the same
schemas, documents and tokenizer.

Schemas: the JSON-Schema-Test-Suite draft 2020-12 core schemas (the files committed in
``crates/ferrolm-constraint/tests/data/json-schema-test-suite``), deduplicated, plus a set
of hand-written API-payload schemas with one valid document each. Every engine compiles
every schema (compact JSON, no whitespace; ferrolm with its defaults: absent
``additionalProperties`` forbids extra members, ``format`` is generated). The compile rate
and p50 / p95 / max compile time (over the schemas it compiled) are reported per engine.

Documents: the hand-written ones, and the suite's valid instances serialized compactly with
members in schema order; suite instances outside what a generating engine means by the
schema are left out and counted (a member the schema does not declare while
``additionalProperties`` is absent, a string under ``format``, which the suite treats as an
annotation). Each document is tokenized by the vocabulary's BPE (tiktoken when installed,
else a pure-Python rank merge with an approximate pre-tokenizer) and walked token by token:
fill the next-token bitmask (timed), check the document's token is allowed, accept it; at
the end EOS must be allowed. A document refused anywhere counts as wrongly rejected. Mask
p50 / p99 are over every token of every document of the schemas the engine compiled; the
"head to head" lines compare ferrolm and each peer on the schemas both compiled.

Warm: each document walked a second time by a fresh matcher of the same grammar (fill
times only), for a schema that many requests share; reported on its own line.

Batch: 64 matchers at seeded random positions in documents of schemas every engine
compiled, one fill of the 64 rows per call, mean over rounds (ferrolm: the batch call;
llguidance: its parallel executor; outlines-core: a loop, it has no batch call).

ferrolm caches masks per grammar state, so later documents of a schema, and the batch
rounds, mostly hit the cache; the first walk of each grammar is cold.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import gzip
import importlib.util
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 64
BATCH_ROUNDS = 10

# The pre-tokenization patterns of the two encodings (tiktoken_ext.openai_public).
PAT_STR = {
    "o200k_base": "|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
    "cl100k_base": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
}
# Without tiktoken (and its `regex` module): an approximation with Python's `re`
# (\p{L} ~ [^\W\d_], \p{N} ~ \d, ``_`` punctuation), close on ASCII JSON.
_APPROX_PAT = re.compile(r"""'(?i:[sdmt]|ll|ve|re)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d{1,3}| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")

SUITE_DIR = Path(__file__).resolve().parents[3] / "crates/ferrolm-constraint/tests/data/json-schema-test-suite/draft2020-12"


# --------------------------------------------------------------------------- vocabulary


@dataclasses.dataclass
class BenchVocab:
    """A tokenizer's ranks plus an EOS token appended as a special token (id = len(ranks))."""

    name: str
    ranks: dict[bytes, int]
    eos: int
    tiktoken_encoding: Any = None  # tiktoken.Encoding, when tiktoken is installed
    pat: re.Pattern[str] | None = None

    @property
    def size(self) -> int:
        return self.eos + 1

    def token_bytes(self) -> list[bytes]:
        tokens = [b""] * self.eos
        for b, r in self.ranks.items():
            tokens[r] = b
        return tokens + [b"<|endoftext|>"]

    def encode(self, text: str) -> list[int]:
        if self.tiktoken_encoding is not None:
            return list(self.tiktoken_encoding.encode_ordinary(text))
        pat = self.pat or _APPROX_PAT
        out: list[int] = []
        for piece in pat.findall(text):
            out.extend(bpe_encode(self.ranks, piece.encode()))
        return out

    def decode(self, tokens: Iterable[int]) -> bytes:
        tb = self._inverse()
        return b"".join(tb[t] for t in tokens)

    def _inverse(self) -> dict[int, bytes]:
        inv = self.__dict__.get("_inv")
        if inv is None:
            inv = {r: b for b, r in self.ranks.items()}
            self.__dict__["_inv"] = inv
        return inv


def bpe_encode(ranks: dict[bytes, int], piece: bytes) -> list[int]:
    """tiktoken's byte-pair merge: repeatedly merge the adjacent pair of lowest rank."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_rank = -1, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


def tiktoken_file(name: str) -> Path:
    """The gzipped rank file in the bpe-openai package, found without importing it."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bpe-openai package is not installed (pip install bpe-openai)")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "data" / f"{name}.tiktoken.gz"
        if path.exists():
            return path
    raise RuntimeError(f"no {name}.tiktoken.gz in bpe_openai/data")


def load_vocab(name: str) -> BenchVocab:
    if name not in PAT_STR:
        raise ValueError(f"unknown vocabulary {name!r} (o200k_base or cl100k_base)")
    ranks: dict[bytes, int] = {}
    with gzip.open(tiktoken_file(name), "rt") as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    eos = len(ranks)
    if sorted(ranks.values()) != list(range(eos)):
        raise RuntimeError(f"{name}: ranks are not 0..{eos - 1}")
    vocab = BenchVocab(name, ranks, eos)
    try:
        import tiktoken

        vocab.tiktoken_encoding = tiktoken.Encoding(
            name, pat_str=PAT_STR[name], mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eos}
        )
    except ImportError:
        print("note: tiktoken is not installed; documents are tokenized by a pure-Python BPE "
              "with an approximate pre-tokenizer", file=sys.stderr)
    return vocab


def synthetic_vocab(merges: Sequence[bytes] = ()) -> BenchVocab:
    """All 256 bytes plus ``merges`` (each must be a concatenation of earlier tokens), for tests."""
    ranks = {bytes([i]): i for i in range(256)}
    for m in merges:
        ranks.setdefault(m, len(ranks))
    return BenchVocab("synthetic", ranks, len(ranks))


# --------------------------------------------------------------------------- schemas and documents


@dataclasses.dataclass
class Case:
    name: str
    schema: str  # JSON text
    documents: list[str]
    source: str  # "suite" or "hand"


def _ref_target(schema: dict[str, Any], root: Any) -> Any:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        part = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def order_value(value: Any, schema: Any, root: Any, depth: int = 0) -> Any:
    """``value`` with object members in the order of the schema's ``properties`` (the
    order a generating engine writes them), as the constraint crate's conformance test does."""
    if not isinstance(schema, dict) or depth >= 16:
        return value
    for literal in [schema["const"]] if "const" in schema else []:
        if literal == value:
            return literal
    for literal in schema.get("enum", []) if isinstance(schema.get("enum"), list) else []:
        if literal == value and type(literal) is type(value):
            return literal
    target = _ref_target(schema, root)
    if target is not None:
        return order_value(value, target, root, depth + 1)
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            return order_value(value, branches[0], root, depth + 1)
    if isinstance(value, dict):
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        ordered = {k: order_value(value[k], sub, root, depth + 1) for k, sub in props.items() if k in value}
        ordered.update((k, v) for k, v in value.items() if k not in ordered)
        return ordered
    if isinstance(value, list):
        prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
        rest = schema.get("items")
        return [order_value(v, prefix[i] if i < len(prefix) else rest, root, depth + 1) for i, v in enumerate(value)]
    return value


def within_generation_reading(value: Any, schema: Any, root: Any, depth: int = 0) -> bool:
    """False where the suite calls ``value`` valid only because the spec is looser than a
    generating engine's reading: an object member neither in ``properties`` nor
    ``required`` while ``additionalProperties`` is absent, or a string under ``format``."""
    if not isinstance(schema, dict) or depth >= 16:
        return True
    target = _ref_target(schema, root)
    if target is not None and not within_generation_reading(value, target, root, depth + 1):
        return False
    if isinstance(value, str) and "format" in schema:
        return False
    for keyword in ("anyOf", "oneOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            if not any(within_generation_reading(value, b, root, depth + 1) for b in branches):
                return False
    branches = schema.get("allOf")
    if isinstance(branches, list) and not all(within_generation_reading(value, b, root, depth + 1) for b in branches):
        return False
    if isinstance(value, dict):
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else []
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                if not within_generation_reading(v, props[k], root, depth + 1):
                    return False
            elif k in required:
                continue
            elif extra is None:
                return False
            elif not within_generation_reading(v, extra, root, depth + 1):
                return False
    if isinstance(value, list):
        prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
        rest = schema.get("items")
        for i, v in enumerate(value):
            if not within_generation_reading(v, prefix[i] if i < len(prefix) else rest, root, depth + 1):
                return False
    return True


def _normalize(value: Any) -> Any:
    """Integral floats as integers (the engines generate integers without a fraction)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


def compact(value: Any) -> str:
    return json.dumps(_normalize(value), separators=(",", ":"), ensure_ascii=False)


def suite_cases(root: Path = SUITE_DIR) -> tuple[list[Case], dict[str, int]]:
    """One case per distinct suite schema (top-level files), with its valid instances."""
    by_text: dict[str, Case] = {}
    stats = {"schemas": 0, "valid_instances": 0, "documents": 0, "left_out": 0}
    for path in sorted(root.glob("*.json")):
        for i, group in enumerate(json.loads(path.read_text())):
            schema = group["schema"]
            text = json.dumps(schema, ensure_ascii=False)
            case = by_text.setdefault(text, Case(f"{path.stem}#{i}", text, [], "suite"))
            for test in group["tests"]:
                if not test["valid"]:
                    continue
                stats["valid_instances"] += 1
                if not within_generation_reading(test["data"], schema, schema):
                    stats["left_out"] += 1
                    continue
                doc = compact(order_value(test["data"], schema, schema))
                if doc not in case.documents:
                    case.documents.append(doc)
    cases = list(by_text.values())
    stats["schemas"] = len(cases)
    stats["documents"] = sum(len(c.documents) for c in cases)
    return cases, stats


# Realistic API payloads (members of each document in schema order).
_ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 120},
        "city": {"type": "string"},
        "postal_code": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
        "country": {"type": "string", "enum": ["US", "CA", "GB", "DE", "FR", "JP", "BR", "IN"]},
    },
    "required": ["street", "city", "postal_code", "country"],
    "additionalProperties": False,
}
_MONEY = {
    "type": "object",
    "properties": {"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}},
    "required": ["amount", "currency"],
    "additionalProperties": False,
}

HAND_SCHEMAS: list[tuple[str, dict[str, Any], Any]] = [
    (
        "user",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "name": {"type": "string", "minLength": 1, "maxLength": 80},
                "email": {"type": "string", "format": "email"},
                "age": {"type": "integer", "minimum": 13, "maximum": 120},
                "created_at": {"type": "string", "format": "date-time"},
                "is_admin": {"type": "boolean"},
            },
            "required": ["id", "name", "email", "created_at"],
            "additionalProperties": False,
        },
        {"id": "3f1c2a9e-8b7d-4c2e-9f10-2d4b6a8c0e12", "name": "Alice Martin", "email": "alice.martin@example.com",
         "age": 34, "created_at": "2024-03-15T09:26:53Z", "is_admin": False},
    ),
    (
        "address",
        _ADDRESS,
        {"street": "1600 Amphitheatre Parkway", "city": "Mountain View", "postal_code": "94043", "country": "US"},
    ),
    (
        "order",
        {
            "type": "object",
            "$defs": {"address": _ADDRESS, "money": _MONEY},
            "properties": {
                "order_id": {"type": "string", "pattern": "^ORD-[0-9]{8}$"},
                "customer_id": {"type": "string", "format": "uuid"},
                "status": {"type": "string", "enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 50,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
                            "unit_price": {"$ref": "#/$defs/money"},
                        },
                        "required": ["sku", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "shipping_address": {"$ref": "#/$defs/address"},
                "placed_at": {"type": "string", "format": "date-time"},
                "notes": {"type": ["string", "null"]},
            },
            "required": ["order_id", "customer_id", "status", "items", "shipping_address", "placed_at"],
            "additionalProperties": False,
        },
        {"order_id": "ORD-20240117", "customer_id": "9b2e4f6a-1c3d-4e5f-8a7b-6c5d4e3f2a1b", "status": "shipped",
         "items": [{"sku": "KB-101", "quantity": 2, "unit_price": {"amount": 49.99, "currency": "USD"}},
                   {"sku": "MS-220", "quantity": 1, "unit_price": {"amount": 19.5, "currency": "USD"}}],
         "shipping_address": {"street": "350 Fifth Avenue", "city": "New York", "postal_code": "10118", "country": "US"},
         "placed_at": "2024-01-17T14:02:11+01:00", "notes": None},
    ),
    (
        "event",
        {
            "type": "object",
            "properties": {
                "event_id": {"type": "string", "format": "uuid"},
                "type": {"type": "string", "enum": ["page_view", "click", "signup", "purchase", "logout"]},
                "timestamp": {"type": "string", "format": "date-time"},
                "user_id": {"type": ["string", "null"]},
                "properties": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "referrer": {"type": "string"},
                        "duration_ms": {"type": "integer", "minimum": 0},
                    },
                    "additionalProperties": False,
                },
            },
            "required": ["event_id", "type", "timestamp"],
            "additionalProperties": False,
        },
        {"event_id": "0d9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a", "type": "page_view", "timestamp": "2024-06-01T00:00:00.123Z",
         "user_id": None, "properties": {"path": "/pricing", "duration_ms": 5320}},
    ),
    (
        "product",
        {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{2,4}-[0-9]{3,6}$"},
                "title": {"type": "string", "maxLength": 200},
                "description": {"type": "string"},
                "price": _MONEY,
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
                "in_stock": {"type": "boolean"},
                "dimensions": {
                    "type": "object",
                    "properties": {"width_cm": {"type": "number"}, "height_cm": {"type": "number"}, "depth_cm": {"type": "number"}},
                    "required": ["width_cm", "height_cm", "depth_cm"],
                    "additionalProperties": False,
                },
            },
            "required": ["sku", "title", "price", "in_stock"],
            "additionalProperties": False,
        },
        {"sku": "DESK-4410", "title": "Standing desk, oak veneer", "description": "Electric height adjustment from 62 to 127 cm.",
         "price": {"amount": 549, "currency": "EUR"}, "tags": ["office", "furniture", "ergonomic"], "in_stock": True,
         "dimensions": {"width_cm": 140, "height_cm": 72.5, "depth_cm": 70}},
    ),
    (
        "payment",
        {
            "type": "object",
            "properties": {
                "payment_id": {"type": "string", "format": "uuid"},
                "amount": _MONEY,
                "method": {
                    "anyOf": [
                        {"type": "object", "properties": {"kind": {"const": "card"}, "last4": {"type": "string", "pattern": "^[0-9]{4}$"},
                                                          "brand": {"type": "string", "enum": ["visa", "mastercard", "amex"]}},
                         "required": ["kind", "last4", "brand"], "additionalProperties": False},
                        {"type": "object", "properties": {"kind": {"const": "bank_transfer"}, "iban": {"type": "string"}},
                         "required": ["kind", "iban"], "additionalProperties": False},
                        {"type": "object", "properties": {"kind": {"const": "wallet"}, "provider": {"type": "string"}},
                         "required": ["kind", "provider"], "additionalProperties": False},
                    ]
                },
                "captured": {"type": "boolean"},
                "created": {"type": "string", "format": "date-time"},
            },
            "required": ["payment_id", "amount", "method", "captured", "created"],
            "additionalProperties": False,
        },
        {"payment_id": "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d", "amount": {"amount": 120.0, "currency": "GBP"},
         "method": {"kind": "bank_transfer", "iban": "GB29NWBK60161331926819"}, "captured": True, "created": "2024-02-29T23:59:59Z"},
    ),
    (
        "invoice",
        {
            "type": "object",
            "$defs": {
                "line": {
                    "type": "object",
                    "properties": {"description": {"type": "string"}, "hours": {"type": "number", "minimum": 0},
                                   "rate": {"type": "number", "minimum": 0}},
                    "required": ["description", "hours", "rate"],
                    "additionalProperties": False,
                }
            },
            "properties": {
                "invoice_number": {"type": "integer", "minimum": 1},
                "issued": {"type": "string", "format": "date"},
                "due": {"type": "string", "format": "date"},
                "client": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
                           "required": ["name", "email"], "additionalProperties": False},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
                "paid": {"type": "boolean"},
            },
            "required": ["invoice_number", "issued", "due", "client", "lines", "paid"],
            "additionalProperties": False,
        },
        {"invoice_number": 1042, "issued": "2024-04-01", "due": "2024-05-01", "client": {"name": "Globex Corp", "email": "ap@globex.io"},
         "lines": [{"description": "API integration", "hours": 12.5, "rate": 95}, {"description": "Code review", "hours": 3, "rate": 95}],
         "paid": False},
    ),
    (
        "weather",
        {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "observed_at": {"type": "string", "format": "date-time"},
                "temperature_c": {"type": "number", "minimum": -90, "maximum": 60},
                "humidity_pct": {"type": "integer", "minimum": 0, "maximum": 100},
                "conditions": {"type": "string", "enum": ["clear", "cloudy", "rain", "snow", "fog", "storm"]},
                "wind": {"type": "object", "properties": {"speed_kmh": {"type": "number", "minimum": 0},
                                                          "direction": {"type": "string", "enum": ["N", "NE", "E", "SE", "S", "SW", "W", "NW"]}},
                         "required": ["speed_kmh", "direction"], "additionalProperties": False},
            },
            "required": ["location", "observed_at", "temperature_c", "humidity_pct", "conditions"],
            "additionalProperties": False,
        },
        {"location": "Reykjavik, IS", "observed_at": "2024-11-30T08:00:00Z", "temperature_c": -3.5, "humidity_pct": 81,
         "conditions": "snow", "wind": {"speed_kmh": 24.1, "direction": "NW"}},
    ),
    (
        "calendar_event",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1},
                "start": {"type": "string", "format": "date-time"},
                "end": {"type": "string", "format": "date-time"},
                "attendees": {"type": "array", "items": {"type": "object", "properties": {
                    "email": {"type": "string", "format": "email"},
                    "response": {"type": "string", "enum": ["accepted", "declined", "tentative", "needs_action"]},
                    "optional": {"type": "boolean"}}, "required": ["email", "response"], "additionalProperties": False}},
                "recurrence": {"type": "string", "enum": ["none", "daily", "weekly", "monthly"]},
                "location": {"type": ["string", "null"]},
            },
            "required": ["title", "start", "end", "attendees"],
            "additionalProperties": False,
        },
        {"title": "Quarterly planning", "start": "2024-07-08T10:00:00-04:00", "end": "2024-07-08T11:30:00-04:00",
         "attendees": [{"email": "dana@example.org", "response": "accepted"}, {"email": "li.wei@example.org", "response": "tentative", "optional": True}],
         "recurrence": "none", "location": "Room 4B"},
    ),
    (
        "search_request",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 256},
                "filters": {"type": "object", "properties": {
                    "category": {"type": "string", "enum": ["books", "electronics", "clothing", "home", "toys"]},
                    "min_price": {"type": "number", "minimum": 0},
                    "max_price": {"type": "number", "minimum": 0},
                    "brands": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": False},
                "sort": {"type": "string", "enum": ["relevance", "price_asc", "price_desc", "newest"]},
                "page": {"type": "integer", "minimum": 1, "maximum": 1000},
                "page_size": {"type": "integer", "minimum": 1, "maximum": 100},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        {"query": "noise cancelling headphones", "filters": {"category": "electronics", "max_price": 300, "brands": ["Sony", "Bose"]},
         "sort": "price_asc", "page": 1, "page_size": 20},
    ),
    (
        "paginated_users",
        {
            "type": "object",
            "$defs": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}, "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
                                                                "email": {"type": "string", "format": "email"}, "active": {"type": "boolean"}},
                               "required": ["id", "username", "email", "active"], "additionalProperties": False}},
            "properties": {
                "data": {"type": "array", "items": {"$ref": "#/$defs/user"}},
                "page": {"type": "integer", "minimum": 1},
                "total": {"type": "integer", "minimum": 0},
                "next_cursor": {"type": ["string", "null"]},
            },
            "required": ["data", "page", "total", "next_cursor"],
            "additionalProperties": False,
        },
        {"data": [{"id": 1, "username": "amartin", "email": "a.martin@example.com", "active": True},
                  {"id": 2, "username": "bkowalski", "email": "bk@example.pl", "active": False},
                  {"id": 7, "username": "chen_l", "email": "chen@example.cn", "active": True}],
         "page": 1, "total": 3, "next_cursor": None},
    ),
    (
        "error_response",
        {
            "type": "object",
            "properties": {
                "error": {"type": "object", "properties": {
                    "code": {"type": "string", "enum": ["invalid_request", "not_found", "rate_limited", "internal"]},
                    "message": {"type": "string"},
                    "status": {"type": "integer", "minimum": 400, "maximum": 599},
                    "details": {"type": "array", "items": {"type": "object", "properties": {"field": {"type": "string"}, "issue": {"type": "string"}},
                                                           "required": ["field", "issue"], "additionalProperties": False}},
                    "request_id": {"type": "string", "format": "uuid"}},
                    "required": ["code", "message", "status"], "additionalProperties": False},
            },
            "required": ["error"],
            "additionalProperties": False,
        },
        {"error": {"code": "invalid_request", "message": "The field 'email' must be a valid address.", "status": 422,
                   "details": [{"field": "email", "issue": "format"}], "request_id": "7e6d5c4b-3a29-4180-9f7e-6d5c4b3a2918"}},
    ),
    (
        "tool_call",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": ["get_weather", "search_web", "send_email", "create_ticket"]},
                "arguments": {"anyOf": [
                    {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                     "required": ["city", "unit"], "additionalProperties": False},
                    {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "minimum": 1, "maximum": 20}},
                     "required": ["query"], "additionalProperties": False},
                    {"type": "object", "properties": {"to": {"type": "string", "format": "email"}, "subject": {"type": "string"}, "body": {"type": "string"}},
                     "required": ["to", "subject", "body"], "additionalProperties": False},
                ]},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        {"name": "send_email", "arguments": {"to": "ops@example.com", "subject": "Disk usage at 91%",
                                              "body": "Host db-3 crossed the 90% threshold at 02:14 UTC.\nPlease rotate the logs."}},
    ),
    (
        "blog_post",
        {
            "type": "object",
            "$defs": {"author": {"type": "object", "properties": {"name": {"type": "string"}, "url": {"type": "string", "format": "uri"}},
                                 "required": ["name"], "additionalProperties": False}},
            "properties": {
                "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
                "title": {"type": "string"},
                "authors": {"type": "array", "items": {"$ref": "#/$defs/author"}, "minItems": 1, "maxItems": 5},
                "published": {"type": "string", "format": "date"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 30}},
                "draft": {"type": "boolean"},
                "word_count": {"type": "integer", "minimum": 0},
            },
            "required": ["slug", "title", "authors", "published"],
            "additionalProperties": False,
        },
        {"slug": "rust-behind-pyo3", "title": "Hot paths in Rust, behind PyO3", "authors": [{"name": "Sam Okafor", "url": "https://example.dev/sam"}],
         "published": "2024-09-12", "tags": ["rust", "python", "performance"], "draft": False, "word_count": 2140},
    ),
    (
        "flight_booking",
        {
            "type": "object",
            "properties": {
                "booking_ref": {"type": "string", "pattern": "^[A-Z0-9]{6}$"},
                "passengers": {"type": "array", "minItems": 1, "maxItems": 9, "items": {"type": "object", "properties": {
                    "first_name": {"type": "string"}, "last_name": {"type": "string"},
                    "date_of_birth": {"type": "string", "format": "date"},
                    "seat": {"type": "string", "pattern": "^[0-9]{1,2}[A-K]$"}},
                    "required": ["first_name", "last_name", "date_of_birth"], "additionalProperties": False}},
                "segments": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                    "flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{1,4}$"},
                    "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "departs": {"type": "string", "format": "date-time"},
                    "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]}},
                    "required": ["flight", "from", "to", "departs", "cabin"], "additionalProperties": False}},
                "total": _MONEY,
            },
            "required": ["booking_ref", "passengers", "segments", "total"],
            "additionalProperties": False,
        },
        {"booking_ref": "X7K2QP", "passengers": [{"first_name": "Maria", "last_name": "Gonzalez", "date_of_birth": "1988-12-03", "seat": "14C"}],
         "segments": [{"flight": "IB6251", "from": "MAD", "to": "JFK", "departs": "2024-08-02T12:25:00+02:00", "cabin": "economy"},
                      {"flight": "IB6250", "from": "JFK", "to": "MAD", "departs": "2024-08-16T22:10:00-04:00", "cabin": "economy"}],
         "total": {"amount": 812.4, "currency": "EUR"}},
    ),
    (
        "support_ticket",
        {
            "type": "object",
            "properties": {
                "ticket_id": {"type": "integer", "minimum": 100000, "maximum": 999999},
                "subject": {"type": "string", "maxLength": 150},
                "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
                "status": {"type": "string", "enum": ["open", "pending", "solved", "closed"]},
                "requester": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
                              "required": ["email"], "additionalProperties": False},
                "assignee_id": {"type": ["integer", "null"]},
                "comments": {"type": "array", "items": {"type": "object", "properties": {
                    "author": {"type": "string"}, "body": {"type": "string"}, "public": {"type": "boolean"},
                    "created_at": {"type": "string", "format": "date-time"}},
                    "required": ["author", "body", "public", "created_at"], "additionalProperties": False}},
            },
            "required": ["ticket_id", "subject", "priority", "status", "requester"],
            "additionalProperties": False,
        },
        {"ticket_id": 482913, "subject": "Cannot export report to CSV", "priority": "high", "status": "open",
         "requester": {"name": "Priya Natarajan", "email": "priya@acme.example"}, "assignee_id": None,
         "comments": [{"author": "Priya Natarajan", "body": "The export button spins forever since Tuesday.", "public": True,
                       "created_at": "2024-05-21T16:45:09Z"}]},
    ),
    (
        "sentiment",
        {
            "type": "object",
            "properties": {
                "label": {"type": "string", "enum": ["positive", "neutral", "negative"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "aspects": {"type": "array", "items": {"type": "object", "properties": {
                    "aspect": {"type": "string"}, "label": {"type": "string", "enum": ["positive", "neutral", "negative"]}},
                    "required": ["aspect", "label"], "additionalProperties": False}},
            },
            "required": ["label", "confidence"],
            "additionalProperties": False,
        },
        {"label": "negative", "confidence": 0.87, "aspects": [{"aspect": "battery life", "label": "negative"}, {"aspect": "screen", "label": "positive"}]},
    ),
    (
        "entity_extraction",
        {
            "type": "object",
            "properties": {
                "entities": {"type": "array", "items": {"type": "object", "properties": {
                    "text": {"type": "string"},
                    "type": {"type": "string", "enum": ["PERSON", "ORG", "LOCATION", "DATE", "MONEY", "PRODUCT"]},
                    "start": {"type": "integer", "minimum": 0}, "end": {"type": "integer", "minimum": 0}},
                    "required": ["text", "type", "start", "end"], "additionalProperties": False}},
            },
            "required": ["entities"],
            "additionalProperties": False,
        },
        {"entities": [{"text": "Acme Corp", "type": "ORG", "start": 0, "end": 9}, {"text": "Berlin", "type": "LOCATION", "start": 27, "end": 33},
                      {"text": "March 3, 2025", "type": "DATE", "start": 37, "end": 50}]},
    ),
    (
        "resume",
        {
            "type": "object",
            "$defs": {
                "job": {"type": "object", "properties": {"company": {"type": "string"}, "title": {"type": "string"},
                                                         "start": {"type": "string", "format": "date"}, "end": {"type": ["string", "null"], "format": "date"},
                                                         "highlights": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
                        "required": ["company", "title", "start"], "additionalProperties": False}},
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "skills": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "experience": {"type": "array", "items": {"$ref": "#/$defs/job"}},
                "years_of_experience": {"type": "integer", "minimum": 0, "maximum": 60},
            },
            "required": ["name", "email", "skills", "experience"],
            "additionalProperties": False,
        },
        {"name": "Jordan Lee", "email": "jordan.lee@example.net", "skills": ["Rust", "Python", "distributed systems"],
         "experience": [{"company": "Initech", "title": "Senior Engineer", "start": "2019-06-01", "end": None,
                         "highlights": ["Cut p99 latency of the billing API by 40%", "Led the migration to Kubernetes"]},
                        {"company": "Hooli", "title": "Engineer", "start": "2015-09-14", "end": "2019-05-31"}],
         "years_of_experience": 9},
    ),
    (
        "recipe",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "servings": {"type": "integer", "minimum": 1, "maximum": 24},
                "prep_minutes": {"type": "integer", "minimum": 0},
                "ingredients": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                    "item": {"type": "string"}, "quantity": {"type": "number", "minimum": 0},
                    "unit": {"type": "string", "enum": ["g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece"]}},
                    "required": ["item", "quantity", "unit"], "additionalProperties": False}},
                "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "vegetarian": {"type": "boolean"},
            },
            "required": ["name", "servings", "ingredients", "steps"],
            "additionalProperties": False,
        },
        {"name": "Shakshuka", "servings": 4, "prep_minutes": 25,
         "ingredients": [{"item": "eggs", "quantity": 6, "unit": "piece"}, {"item": "crushed tomatoes", "quantity": 800, "unit": "g"},
                         {"item": "cumin", "quantity": 1, "unit": "tsp"}],
         "steps": ["Soften onion and pepper in olive oil.", "Add tomatoes and spices; simmer 10 minutes.", "Crack in the eggs, cover, cook until set."],
         "vegetarian": True},
    ),
    (
        "iot_reading",
        {
            "type": "object",
            "properties": {
                "device_id": {"type": "string", "format": "uuid"},
                "firmware": {"type": "string", "pattern": "^v[0-9]+\\.[0-9]+\\.[0-9]+$"},
                "readings": {"type": "array", "items": {"type": "object", "properties": {
                    "sensor": {"type": "string", "enum": ["temperature", "pressure", "humidity", "co2"]},
                    "value": {"type": "number"}, "at": {"type": "string", "format": "date-time"}},
                    "required": ["sensor", "value", "at"], "additionalProperties": False}, "maxItems": 32},
                "battery_pct": {"type": "integer", "minimum": 0, "maximum": 100},
                "ip": {"type": "string", "format": "ipv4"},
            },
            "required": ["device_id", "readings"],
            "additionalProperties": False,
        },
        {"device_id": "c0ffee00-1234-4abc-8def-0123456789ab", "firmware": "v2.14.3",
         "readings": [{"sensor": "temperature", "value": 21.7, "at": "2024-10-05T06:30:00Z"}, {"sensor": "co2", "value": 612, "at": "2024-10-05T06:30:00Z"}],
         "battery_pct": 76, "ip": "192.168.10.42"},
    ),
    (
        "org_chart",
        {
            "$defs": {"employee": {"type": "object", "properties": {
                "name": {"type": "string"}, "title": {"type": "string"},
                "reports": {"type": "array", "items": {"$ref": "#/$defs/employee"}}},
                "required": ["name", "title"], "additionalProperties": False}},
            "$ref": "#/$defs/employee",
        },
        {"name": "Grace Hopper", "title": "CTO", "reports": [
            {"name": "Ken Thompson", "title": "Director, Systems", "reports": [{"name": "Dennis Ritchie", "title": "Principal Engineer"}]},
            {"name": "Barbara Liskov", "title": "Director, Languages"}]},
    ),
    (
        "config",
        {
            "type": "object",
            "properties": {
                "service": {"type": "string", "pattern": "^[a-z][a-z0-9-]{1,30}$"},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 64},
                "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                "log_level": {"type": "string", "enum": ["debug", "info", "warn", "error"]},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "healthcheck": {"type": "object", "properties": {"path": {"type": "string"}, "interval_s": {"type": "integer", "minimum": 1, "maximum": 300}},
                                "required": ["path", "interval_s"], "additionalProperties": False},
                "features": {"type": "array", "items": {"type": "string", "enum": ["tracing", "metrics", "canary", "autoscale"]}},
            },
            "required": ["service", "replicas", "port", "log_level"],
            "additionalProperties": False,
        },
        {"service": "checkout-api", "replicas": 6, "port": 8443, "log_level": "info",
         "env": {"DATABASE_URL": "postgres://db.internal:5432/checkout", "FEATURE_FLAGS": "fast-pay"},
         "healthcheck": {"path": "/healthz", "interval_s": 15}, "features": ["tracing", "metrics"]},
    ),
    (
        "quiz",
        {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "questions": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object", "properties": {
                    "question": {"type": "string"},
                    "choices": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 5},
                    "answer_index": {"type": "integer", "minimum": 0, "maximum": 4},
                    "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]}},
                    "required": ["question", "choices", "answer_index"], "additionalProperties": False}},
            },
            "required": ["topic", "questions"],
            "additionalProperties": False,
        },
        {"topic": "HTTP", "questions": [
            {"question": "Which status code means Too Many Requests?", "choices": ["404", "429", "503"], "answer_index": 1, "difficulty": "easy"},
            {"question": "Which method is idempotent?", "choices": ["POST", "PUT"], "answer_index": 1}]},
    ),
    (
        "shipment_tracking",
        {
            "type": "object",
            "properties": {
                "tracking_number": {"type": "string", "pattern": "^1Z[0-9A-Z]{16}$"},
                "carrier": {"type": "string", "enum": ["UPS", "FedEx", "DHL", "USPS"]},
                "status": {"type": "string", "enum": ["label_created", "in_transit", "out_for_delivery", "delivered", "exception"]},
                "estimated_delivery": {"type": ["string", "null"], "format": "date"},
                "history": {"type": "array", "items": {"type": "object", "properties": {
                    "at": {"type": "string", "format": "date-time"}, "location": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["at", "description"], "additionalProperties": False}},
            },
            "required": ["tracking_number", "carrier", "status", "history"],
            "additionalProperties": False,
        },
        {"tracking_number": "1Z999AA10123456784", "carrier": "UPS", "status": "in_transit", "estimated_delivery": "2024-12-04",
         "history": [{"at": "2024-12-01T18:22:00-05:00", "location": "Louisville, KY", "description": "Departed facility"},
                     {"at": "2024-12-01T09:03:00-05:00", "description": "Label created"}]},
    ),
    (
        "medical_appointment",
        {
            "type": "object",
            "properties": {
                "patient": {"type": "object", "properties": {
                    "mrn": {"type": "string", "pattern": "^[0-9]{8}$"}, "name": {"type": "string"},
                    "birth_date": {"type": "string", "format": "date"}, "sex": {"type": "string", "enum": ["female", "male", "other", "unknown"]}},
                    "required": ["mrn", "name", "birth_date"], "additionalProperties": False},
                "provider_npi": {"type": "string", "pattern": "^[0-9]{10}$"},
                "slot": {"type": "string", "format": "date-time"},
                "duration_min": {"type": "integer", "enum": [15, 30, 45, 60]},
                "reason": {"type": "string", "maxLength": 500},
                "telehealth": {"type": "boolean"},
            },
            "required": ["patient", "provider_npi", "slot", "duration_min"],
            "additionalProperties": False,
        },
        {"patient": {"mrn": "00482915", "name": "Tomás Ruiz", "birth_date": "1975-02-28", "sex": "male"}, "provider_npi": "1234567893",
         "slot": "2024-03-11T08:15:00-07:00", "duration_min": 30, "reason": "Follow-up on blood pressure medication", "telehealth": False},
    ),
    (
        "sql_query_plan",
        {
            "type": "object",
            "properties": {
                "table": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
                "columns": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "where": {"type": "array", "items": {"type": "object", "properties": {
                    "column": {"type": "string"}, "op": {"type": "string", "enum": ["=", "!=", "<", "<=", ">", ">=", "in", "like"]},
                    "value": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "array", "items": {"type": "string"}}]}},
                    "required": ["column", "op", "value"], "additionalProperties": False}},
                "order_by": {"type": "object", "properties": {"column": {"type": "string"}, "direction": {"type": "string", "enum": ["asc", "desc"]}},
                             "required": ["column", "direction"], "additionalProperties": False},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10000},
            },
            "required": ["table", "columns"],
            "additionalProperties": False,
        },
        {"table": "orders", "columns": ["id", "customer_id", "total"],
         "where": [{"column": "status", "op": "in", "value": ["paid", "shipped"]}, {"column": "total", "op": ">=", "value": 100}],
         "order_by": {"column": "created_at", "direction": "desc"}, "limit": 50},
    ),
    (
        "github_issue",
        {
            "type": "object",
            "properties": {
                "number": {"type": "integer", "minimum": 1},
                "title": {"type": "string"},
                "state": {"type": "string", "enum": ["open", "closed"]},
                "labels": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "color": {"type": "string", "pattern": "^[0-9a-f]{6}$"}},
                                                      "required": ["name", "color"], "additionalProperties": False}},
                "assignees": {"type": "array", "items": {"type": "string"}},
                "milestone": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"title": {"type": "string"}, "due_on": {"type": "string", "format": "date-time"}},
                                                          "required": ["title"], "additionalProperties": False}]},
                "created_at": {"type": "string", "format": "date-time"},
                "body": {"type": "string"},
            },
            "required": ["number", "title", "state", "labels", "created_at"],
            "additionalProperties": False,
        },
        {"number": 1287, "title": "Segfault when rollback crosses a segment trigger", "state": "open",
         "labels": [{"name": "bug", "color": "d73a4a"}, {"name": "constraint", "color": "0e8a16"}], "assignees": ["octocat"],
         "milestone": {"title": "v0.3", "due_on": "2025-01-31T00:00:00Z"}, "created_at": "2024-12-02T11:47:30Z",
         "body": "Steps:\n1. compile `{\"type\":\"object\"}` after `</think>`\n2. roll back 3 tokens\n\nExpected: no crash."},
    ),
    (
        "bank_transaction",
        {
            "type": "object",
            "properties": {
                "transaction_id": {"type": "string", "format": "uuid"},
                "account_iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"},
                "booked_at": {"type": "string", "format": "date-time"},
                "amount": {"type": "number"},
                "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "CHF"]},
                "counterparty": {"type": "string"},
                "category": {"type": "string", "enum": ["groceries", "rent", "salary", "utilities", "travel", "other"]},
                "pending": {"type": "boolean"},
            },
            "required": ["transaction_id", "account_iban", "booked_at", "amount", "currency", "category", "pending"],
            "additionalProperties": False,
        },
        {"transaction_id": "e2a1f3b4-5c6d-4e7f-a8b9-c0d1e2f3a4b5", "account_iban": "DE89370400440532013000", "booked_at": "2024-10-31T07:12:44Z",
         "amount": -1250.0, "currency": "EUR", "counterparty": "Hausverwaltung Schmidt GmbH", "category": "rent", "pending": False},
    ),
    (
        "translation",
        {
            "type": "object",
            "properties": {
                "source_lang": {"type": "string", "enum": ["en", "de", "fr", "es", "ja", "zh"]},
                "target_lang": {"type": "string", "enum": ["en", "de", "fr", "es", "ja", "zh"]},
                "segments": {"type": "array", "items": {"type": "object", "properties": {"source": {"type": "string"}, "target": {"type": "string"}},
                                                        "required": ["source", "target"], "additionalProperties": False}, "minItems": 1},
            },
            "required": ["source_lang", "target_lang", "segments"],
            "additionalProperties": False,
        },
        {"source_lang": "en", "target_lang": "ja", "segments": [{"source": "Your order has shipped.", "target": "ご注文の商品を発送しました。"},
                                                                   {"source": "Thank you!", "target": "ありがとうございます！"}]},
    ),
]


def hand_cases() -> list[Case]:
    return [Case(name, json.dumps(schema), [compact(doc)], "hand") for name, schema, doc in HAND_SCHEMAS]


# --------------------------------------------------------------------------- engines


class Engine:
    """One constraint library behind a common face. ``compile`` raises on failure."""

    name = ""
    out_of_process = False  # compile and walk each schema in a forked child, under a timeout

    def compile(self, schema: str) -> Any:
        raise NotImplementedError

    def matcher(self, grammar: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, row: np.ndarray) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def fill_batch(self, matchers: list[Any], mask: np.ndarray) -> None:
        for i, m in enumerate(matchers):
            self.fill(m, mask[i])


class FerrolmEngine(Engine):
    name = "ferrolm"

    def __init__(self, vocab: BenchVocab) -> None:
        from ferrolm import _core

        self._core = _core
        self.vocab = _core.Vocabulary(vocab.token_bytes(), special_token_ids=[vocab.eos], eos_token_ids=[vocab.eos])

    def compile(self, schema: str) -> Any:
        return self.vocab.json_schema(schema)

    def matcher(self, grammar: Any) -> Any:
        return grammar.matcher()

    def fill(self, matcher: Any, row: np.ndarray) -> None:
        matcher.fill_next_token_bitmask(row)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def fill_batch(self, matchers: list[Any], mask: np.ndarray) -> None:
        self._core.fill_next_token_bitmask_batch(matchers, mask)


class LlguidanceEngine(Engine):
    name = "llguidance"

    def __init__(self, vocab: BenchVocab) -> None:
        import llguidance
        import llguidance.numpy

        self._llg = llguidance
        self._np = llguidance.numpy
        if vocab.tiktoken_encoding is None:
            raise RuntimeError("needs tiktoken to build its tokenizer")
        self.tokenizer = llguidance.LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]
            encoder=vocab.ranks, special_tokens={"<|endoftext|>": vocab.eos}, pattern=PAT_STR[vocab.name],
            eos_token=vocab.eos, n_vocab=vocab.size,
        )
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: str) -> Any:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return grammar

    def matcher(self, grammar: Any) -> Any:
        return self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)

    def fill(self, matcher: Any, row: np.ndarray) -> None:
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token)) and not matcher.is_error()

    def fill_batch(self, matchers: list[Any], mask: np.ndarray) -> None:
        self._np.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], mask)


class OutlinesEngine(Engine):
    name = "outlines-core"
    out_of_process = True  # its compile takes seconds to minutes on a 200k vocabulary

    def __init__(self, vocab: BenchVocab) -> None:
        import outlines_core

        self._oc = outlines_core
        tokens: dict[bytes, list[int]] = {}
        for b, r in vocab.ranks.items():
            tokens.setdefault(b, []).append(r)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos, tokens)
        self.words = (vocab.size + 31) // 32

    def compile(self, schema: str) -> Any:
        regex = self._oc.json_schema.build_regex_from_schema(schema, whitespace_pattern="")
        return self._oc.Index(regex, self.vocabulary)

    def matcher(self, grammar: Any) -> Any:
        return self._oc.Guide(grammar)

    def fill(self, matcher: Any, row: np.ndarray) -> None:
        matcher.write_mask_into(row.ctypes.data, row.size, 4)

    def accept(self, matcher: Any, token: int) -> bool:
        try:
            matcher.advance(token, return_tokens=False)
        except Exception:
            return False
        return True


def make_engines(vocab: BenchVocab, names: Sequence[str]) -> tuple[list[Engine], dict[str, str]]:
    """The engines that load; the others with the reason they were skipped."""
    engines: list[Engine] = []
    skipped: dict[str, str] = {}
    factories: dict[str, Callable[[BenchVocab], Engine]] = {
        "ferrolm": FerrolmEngine,
        "llguidance": LlguidanceEngine,
        "outlines-core": OutlinesEngine,
    }
    for name in names:
        if name == "xgrammar":
            try:
                import xgrammar  # noqa: F401
            except Exception as e:  # ImportError, or its torch import failing
                skipped[name] = f"not importable ({type(e).__name__}: {e}); xgrammar needs torch, which this bench does not install"
            else:
                skipped[name] = "importable, but its Python API needs torch tensors for masks; not wired in"
            continue
        try:
            t0 = time.perf_counter()
            engines.append(factories[name](vocab))
            print(f"  {name}: vocabulary loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        except Exception as e:
            skipped[name] = f"{type(e).__name__}: {e}"
    return engines, skipped


# --------------------------------------------------------------------------- measurement


def _bit(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


@dataclasses.dataclass
class EngineRun:
    compiled: dict[str, Any] = dataclasses.field(default_factory=dict)  # case name -> grammar
    compile_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    compile_errors: dict[str, str] = dataclasses.field(default_factory=dict)
    mask_us: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # case name -> per-token times
    # The same documents walked again: what a schema used by many requests costs.
    warm_mask_us: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    rejected: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    documents: int = 0
    batch_us: float | None = None
    attempted: int = 0
    note: str = ""


def walk_document(engine: Engine, grammar: Any, tokens: list[int], eos: int, row: np.ndarray,
                  times: list[float]) -> tuple[bool, int, str]:
    """Fill, check and accept each token, then check EOS; returns (ok, position, why)."""
    m = engine.matcher(grammar)
    for pos, tok in enumerate(tokens + [eos]):
        t0 = time.perf_counter_ns()
        engine.fill(m, row)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        if not _bit(row, tok):
            return False, pos, "token not in the mask" if tok != eos else "EOS not allowed at the end"
        if tok != eos and not engine.accept(m, tok):
            return False, pos, "accept refused a token the mask allowed"
    return True, len(tokens), ""


def run_engine(engine: Engine, cases: list[Case], tokenized: dict[str, list[list[int]]], vocab_size: int, eos: int,
               timeout_s: float = 10.0, budget_s: float | None = None) -> EngineRun:
    if engine.out_of_process:
        return run_engine_forked(engine, cases, tokenized, vocab_size, eos, timeout_s, budget_s)
    out = EngineRun()
    row = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    for case in cases:
        out.attempted += 1
        t0 = time.perf_counter_ns()
        try:
            grammar = engine.compile(case.schema)
        except Exception as e:
            out.compile_errors[case.name] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            continue
        out.compile_ms[case.name] = (time.perf_counter_ns() - t0) / 1e6
        out.compiled[case.name] = grammar
        times: list[float] = []
        for doc, tokens in zip(case.documents, tokenized[case.name]):
            out.documents += 1
            ok, pos, why = walk_document(engine, grammar, tokens, eos, row, times)
            if not ok:
                out.rejected.append({"case": case.name, "document": doc, "token_index": pos, "why": why})
        out.mask_us[case.name] = times
        out.warm_mask_us[case.name] = warm_walks(engine, grammar, case, tokenized[case.name], eos, row)
    return out


def warm_walks(engine: Engine, grammar: Any, case: Case, tokens: list[list[int]], eos: int, row: np.ndarray) -> list[float]:
    """Fill times of a second walk of each document, by a fresh matcher of the same grammar."""
    times: list[float] = []
    for toks in tokens:
        walk_document(engine, grammar, toks, eos, row, times)
    return times


def _one_case(engine: Engine, case: Case, tokens: list[list[int]], vocab_size: int, eos: int) -> dict[str, Any]:
    row = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    t0 = time.perf_counter_ns()
    try:
        grammar = engine.compile(case.schema)
    except Exception as e:
        return {"error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
    res: dict[str, Any] = {"compile_ms": (time.perf_counter_ns() - t0) / 1e6, "times": [], "rejected": []}
    for doc, toks in zip(case.documents, tokens):
        ok, pos, why = walk_document(engine, grammar, toks, eos, row, res["times"])
        if not ok:
            res["rejected"].append({"case": case.name, "document": doc, "token_index": pos, "why": why})
    res["warm_times"] = warm_walks(engine, grammar, case, tokens, eos, row)
    return res


def run_engine_forked(engine: Engine, cases: list[Case], tokenized: dict[str, list[list[int]]], vocab_size: int, eos: int,
                      timeout_s: float, budget_s: float | None) -> EngineRun:
    """Each schema in a forked child (compile and walk), killed after ``timeout_s`` (counted
    as not compiled); schemas after ``budget_s`` of wall time in all are not attempted. For
    engines whose compile can take minutes. The compiled grammars stay in the children, so
    the batch is not measured."""
    import os
    import select
    import signal

    out = EngineRun()
    start = time.perf_counter()
    for case in cases:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            out.note = f"time budget of {budget_s:.0f} s spent: {out.attempted} of {len(cases)} schemas attempted"
            break
        out.attempted += 1
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(r)
                data = json.dumps(_one_case(engine, case, tokenized[case.name], vocab_size, eos)).encode()
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        chunks: list[bytes] = []
        deadline = time.perf_counter() + timeout_s
        timed_out = False
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        os.close(r)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if timed_out:
            out.compile_errors[case.name] = f"timeout after {timeout_s:.0f} s (compile and walk)"
            continue
        try:
            res = json.loads(b"".join(chunks))
        except ValueError:
            out.compile_errors[case.name] = "child process died"
            continue
        if "error" in res:
            out.compile_errors[case.name] = res["error"]
            continue
        out.compiled[case.name] = None
        out.compile_ms[case.name] = res["compile_ms"]
        out.mask_us[case.name] = res["times"]
        out.warm_mask_us[case.name] = res["warm_times"]
        out.documents += len(case.documents)
        out.rejected.extend(res["rejected"])
    return out


def batch_positions(cases: list[Case], tokenized: dict[str, list[list[int]]], names: set[str], rng: random.Random,
                    n: int) -> list[tuple[str, list[int]]]:
    """``n`` (case, token prefix) pairs drawn from the documents of the cases in ``names``."""
    pool = [(c.name, toks) for c in cases if c.name in names for toks in tokenized[c.name] if toks]
    if not pool:
        return []
    picks = []
    for _ in range(n):
        name, toks = rng.choice(pool)
        picks.append((name, toks[: rng.randrange(len(toks))]))
    return picks


def time_batch(engine: Engine, run: EngineRun, positions_per_round: list[list[tuple[str, list[int]]]], vocab_size: int) -> float | None:
    if engine.out_of_process or not positions_per_round or not positions_per_round[0]:
        return None
    mask = np.zeros((len(positions_per_round[0]), (vocab_size + 31) // 32), dtype=np.int32)
    total = 0.0
    for positions in positions_per_round:
        matchers = []
        for name, prefix in positions:
            m = engine.matcher(run.compiled[name])
            for t in prefix:
                if not engine.accept(m, t):
                    break
            matchers.append(m)
        t0 = time.perf_counter_ns()
        engine.fill_batch(matchers, mask)
        total += (time.perf_counter_ns() - t0) / 1e3
    return total / len(positions_per_round)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def summarize(run: EngineRun, cases: list[Case]) -> dict[str, Any]:
    compile_ms = list(run.compile_ms.values())
    tokens = [t for ts in run.mask_us.values() for t in ts]
    warm = [t for ts in run.warm_mask_us.values() for t in ts]
    by_source = {}
    for source in ("suite", "hand"):
        names = [c.name for c in cases if c.source == source]
        by_source[source] = {"schemas": len(names), "compiled": sum(n in run.compiled for n in names)}
    return {
        "schemas": len(cases),
        "attempted": run.attempted,
        "note": run.note,
        "compiled": len(run.compiled),
        "compile_rate": len(run.compiled) / run.attempted if run.attempted else 0.0,
        "by_source": by_source,
        "compile_ms": {"p50": _pct(compile_ms, 50), "p95": _pct(compile_ms, 95), "max": max(compile_ms) if compile_ms else None},
        "documents": run.documents,
        "tokens": len(tokens),
        "mask_us": {"p50": _pct(tokens, 50), "p99": _pct(tokens, 99), "max": max(tokens) if tokens else None},
        "warm_mask_us": {"p50": _pct(warm, 50), "p99": _pct(warm, 99), "fills": len(warm)},
        "batch64_us": run.batch_us,
        "rejected_valid": len(run.rejected),
        "rejections": run.rejected,
        "compile_errors": run.compile_errors,
        "per_schema": {n: {"compile_ms": run.compile_ms[n], "mask_us_p50": _pct(run.mask_us.get(n, []), 50),
                           "mask_us_max": max(run.mask_us[n]) if run.mask_us.get(n) else None} for n in run.compile_ms},
    }


def head_to_head(ours: EngineRun, peer: EngineRun) -> dict[str, Any]:
    """Both engines on the schemas both compiled."""
    both = [n for n in ours.compiled if n in peer.compiled]
    res: dict[str, Any] = {"schemas": len(both)}
    for label, run in (("ferrolm", ours), ("peer", peer)):
        c = [run.compile_ms[n] for n in both]
        t = [x for n in both for x in run.mask_us.get(n, [])]
        res[label] = {"compile_ms_p50": _pct(c, 50), "compile_ms_p95": _pct(c, 95), "mask_us_p50": _pct(t, 50), "mask_us_p99": _pct(t, 99)}
    return res


def bench(vocab: BenchVocab, cases: list[Case], engine_names: Sequence[str] = ("ferrolm", "llguidance", "xgrammar", "outlines-core"),
          seed: int = 0, batch: int = BATCH, batch_rounds: int = BATCH_ROUNDS, timeout_s: float = 10.0,
          peer_budget_s: float | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Runs every engine on ``cases``; returns the report (JSON-serializable)."""
    t0 = time.perf_counter()
    tokenized = {c.name: [vocab.encode(d) for d in c.documents] for c in cases}
    for c in cases:  # the tokenization must spell the document
        for d, toks in zip(c.documents, tokenized[c.name]):
            if vocab.decode(toks) != d.encode():
                raise RuntimeError(f"{c.name}: tokenization does not round-trip")
    log(f"tokenized {sum(len(v) for v in tokenized.values())} documents in {time.perf_counter() - t0:.2f} s")
    engines, skipped = make_engines(vocab, engine_names)
    runs: dict[str, EngineRun] = {}
    for engine in engines:
        t1 = time.perf_counter()
        runs[engine.name] = run_engine(engine, cases, tokenized, vocab.size, vocab.eos, timeout_s,
                                       None if engine.name == "ferrolm" else peer_budget_s)
        r = runs[engine.name]
        log(f"{engine.name}: {len(r.compiled)}/{r.attempted} compiled, walked in {time.perf_counter() - t1:.1f} s {r.note}")
    in_process = [e for e in engines if not e.out_of_process]
    if in_process:
        common = set.intersection(*(set(runs[e.name].compiled) for e in in_process))
        rng = random.Random(seed)
        rounds = [batch_positions(cases, tokenized, common, rng, batch) for _ in range(batch_rounds)]
        for engine in engines:
            runs[engine.name].batch_us = time_batch(engine, runs[engine.name], rounds, vocab.size)
    report: dict[str, Any] = {
        "vocab": vocab.name,
        "vocab_size": vocab.size,
        "tokenizer": "tiktoken" if vocab.tiktoken_encoding is not None else "pure-python bpe",
        "seed": seed,
        "schemas": {"total": len(cases), "suite": sum(c.source == "suite" for c in cases), "hand": sum(c.source == "hand" for c in cases)},
        "documents": sum(len(c.documents) for c in cases),
        "document_tokens": sum(len(t) for v in tokenized.values() for t in v),
        "engines": {name: summarize(run, cases) for name, run in runs.items()},
        "skipped": skipped,
        "head_to_head": {name: head_to_head(runs["ferrolm"], run) for name, run in runs.items() if name != "ferrolm" and "ferrolm" in runs},
    }
    return report


# --------------------------------------------------------------------------- report


def _f(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"vocab {report['vocab']} ({report['vocab_size']} tokens, tokenized by {report['tokenizer']}); "
        f"{report['schemas']['total']} schemas ({report['schemas']['suite']} suite, {report['schemas']['hand']} hand-written), "
        f"{report['documents']} valid documents, {report['document_tokens']} tokens",
        "",
        f"{'engine':<14}{'compiled':>10}{'suite':>9}{'hand':>7}{'compile ms p50':>16}{'p95':>9}{'max':>9}"
        f"{'mask us p50':>13}{'p99':>9}{'batch64 us':>12}{'docs':>6}{'rejected':>10}",
    ]
    for name, s in report["engines"].items():
        bs = s["by_source"]
        lines.append(
            f"{name:<14}{s['compile_rate'] * 100:>9.0f}%{bs['suite']['compiled']:>5}/{bs['suite']['schemas']:<3}"
            f"{bs['hand']['compiled']:>3}/{bs['hand']['schemas']:<3}{_f(s['compile_ms']['p50'], '.2f'):>16}"
            f"{_f(s['compile_ms']['p95'], '.2f'):>9}{_f(s['compile_ms']['max'], '.1f'):>9}{_f(s['mask_us']['p50']):>13}"
            f"{_f(s['mask_us']['p99']):>9}{_f(s['batch64_us'], '.0f'):>12}{s['documents']:>6}{s['rejected_valid']:>10}"
        )
    lines.append("mask us on a second walk of the same documents (a schema many requests share): " + ", ".join(
        f"{name} p50 {_f(s['warm_mask_us']['p50'])} p99 {_f(s['warm_mask_us']['p99'])}" for name, s in report["engines"].items()))
    for name, s in report["engines"].items():
        if s["note"]:
            lines.append(f"{name:<14}{s['note']} (compiled % is of those attempted)")
    for name, why in report["skipped"].items():
        lines.append(f"{name:<14}skipped: {why}")
    ours = report["engines"].get("ferrolm")
    if ours and ours["per_schema"]:
        slow = sorted(ours["per_schema"].items(), key=lambda kv: -kv[1]["compile_ms"])[:4]
        lines.append("ferrolm slowest compiles: " + ", ".join(f"{n} {v['compile_ms']:.0f} ms" for n, v in slow))
        worst = sorted(ours["per_schema"].items(), key=lambda kv: -(kv[1]["mask_us_max"] or 0))[:4]
        lines.append("ferrolm slowest masks: " + ", ".join(f"{n} {v['mask_us_max']:.0f} us" for n, v in worst))
    if report["head_to_head"]:
        lines.append("")
        lines.append("head to head, on the schemas both compiled (ferrolm / peer):")
        for name, h in report["head_to_head"].items():
            a, b = h["ferrolm"], h["peer"]
            lines.append(
                f"  vs {name:<14}{h['schemas']:>4} schemas   compile p50 {_f(a['compile_ms_p50'], '.2f')} / {_f(b['compile_ms_p50'], '.2f')} ms"
                f"   p95 {_f(a['compile_ms_p95'], '.2f')} / {_f(b['compile_ms_p95'], '.2f')} ms"
                f"   mask p50 {_f(a['mask_us_p50'])} / {_f(b['mask_us_p50'])} us   p99 {_f(a['mask_us_p99'])} / {_f(b['mask_us_p99'])} us"
            )
    for name, s in report["engines"].items():
        for r in s["rejections"][:5]:
            lines.append(f"{name} rejected {r['case']} at token {r['token_index']} ({r['why']}): {r['document'][:160]}")
        if len(s["rejections"]) > 5:
            lines.append(f"{name}: ... {len(s['rejections']) - 5} more rejections (see --json)")
    floors = floor_checks(report)
    if floors:
        lines.append("")
        lines.extend(f"floor: {text}: {'met' if ok else 'MISSED'}" for text, ok in floors)
    return "\n".join(lines)


def floor_checks(report: dict[str, Any]) -> list[tuple[str, bool]]:
    """The issue's floors, where the numbers to judge them are in the report."""
    ours = report["engines"].get("ferrolm")
    if ours is None:
        return []
    checks = [("no valid document rejected", ours["rejected_valid"] == 0)]
    p95 = ours["compile_ms"]["p95"]
    if p95 is not None:
        checks.append(("compile p95 under 50 ms", p95 < 50))
    llg = report["engines"].get("llguidance")
    if llg is not None and llg["mask_us"]["p50"] is not None and ours["mask_us"]["p50"] is not None:
        checks.append(("mask p50 no worse than llguidance's", ours["mask_us"]["p50"] <= llg["mask_us"]["p50"]))
        checks.append(("mask p99 no worse than llguidance's", ours["mask_us"]["p99"] <= llg["mask_us"]["p99"]))
        checks.append(("compile p50 no worse than llguidance's", ours["compile_ms"]["p50"] <= llg["compile_ms"]["p50"]))
    return checks


def select_cases(cases: list[Case], max_schemas: int | None, seed: int) -> list[Case]:
    """Hand-written and suite cases alternating, the suite's in a seeded order, up to
    ``max_schemas`` (a peer under a time budget thus attempts a mix of both)."""
    hand = [c for c in cases if c.source == "hand"]
    rest = [c for c in cases if c.source != "hand"]
    random.Random(seed).shuffle(rest)
    chosen = [c for pair in zip(hand, rest) for c in pair] + hand[len(rest):] + rest[len(hand):]
    return chosen if max_schemas is None else chosen[:max_schemas]


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    log = lambda s: print(f"[{time.perf_counter() - t0:6.1f}s] {s}", file=sys.stderr)  # noqa: E731
    vocab = load_vocab(args.vocab)
    log(f"loaded {vocab.name}: {vocab.size} tokens (EOS {vocab.eos})")
    suite, suite_stats = suite_cases(Path(args.suite))
    log(f"suite: {suite_stats['schemas']} distinct schemas, {suite_stats['documents']} documents from "
        f"{suite_stats['valid_instances']} valid instances ({suite_stats['left_out']} left out: undeclared members or strings under format)")
    cases = select_cases(hand_cases() + suite, args.max_schemas, args.seed)
    report = bench(vocab, cases, args.engines, seed=args.seed, timeout_s=args.timeout_s,
                   peer_budget_s=args.peer_budget_s if args.peer_budget_s > 0 else None, log=log)
    report["suite"] = suite_stats
    report["command"] = " ".join(["ferrolm", "bench", "constraint", *sys.argv[3:]]) if len(sys.argv) > 2 else "ferrolm bench constraint"
    report["wall_s"] = time.perf_counter() - t0
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False))
        print(f"wrote {args.json}")
    missed = any(not ok for _, ok in floor_checks(report))
    return 1 if missed and args.strict else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("constraint", help="structured-output masks against llguidance / xgrammar / outlines-core",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="o200k_base", choices=sorted(PAT_STR))
    p.add_argument("--max-schemas", type=int, default=None, help="the first N of hand-written and (seeded) suite schemas, alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--engines", nargs="+", default=["ferrolm", "llguidance", "xgrammar", "outlines-core"])
    p.add_argument("--timeout-s", type=float, default=10.0,
                   help="per-schema limit for engines run out of process (outlines-core: compile and walk)")
    p.add_argument("--peer-budget-s", type=float, default=120.0,
                   help="wall time each out-of-process peer may spend in all (0: no limit); later schemas are not attempted")
    p.add_argument("--suite", default=str(SUITE_DIR), help="the JSON-Schema-Test-Suite draft2020-12 folder")
    p.add_argument("--strict", action="store_true", help="exit 1 when a floor is missed")
    p.set_defaults(func=run)
