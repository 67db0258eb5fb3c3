"""The real-world schema corpus: a sample of the JSON SchemaStore catalog with its positive
and negative test instances (``crates/ferrolm-constraint/tests/data/schemastore``, see its
SOURCE.txt). ``jsonschema`` decides which instances are valid; a valid instance is then
written the way a generating engine writes it: compact, integral numbers without a
fraction, and object members in the order the engine generates them (declared ones in
schema order, then the others), following the schema as the engine reads it
(``_core.json_schema_normalized``: references resolved, older drafts rewritten)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[3] / "crates/ferrolm-constraint/tests/data/schemastore"

# the most orderings tried per document (each anyOf/oneOf/$ref alternative may order
# members differently)
MAX_ORDERINGS = 8


@dataclasses.dataclass
class CorpusSchema:
    name: str
    schema: Any
    text: str  # the schema file's text
    valid: list[Any]  # instances jsonschema accepts
    invalid: list[Any]  # instances jsonschema rejects
    undecided: list[tuple[str, str]]  # (file, why): not JSON, or jsonschema could not decide


def _decide(schema: Any, instance: Any) -> bool:
    """Whether ``jsonschema`` (the schema's draft, formats as annotations) accepts ``instance``."""
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    return bool(cls(schema).is_valid(instance))


def load_corpus(root: Path = CORPUS_DIR) -> list[CorpusSchema]:
    """Every schema of the corpus with its instances sorted by ``jsonschema``'s verdict."""
    out = []
    for path in sorted((root / "schemas").glob("*.json")):
        text = path.read_text(encoding="utf-8-sig")
        schema = json.loads(text)
        entry = CorpusSchema(path.stem, schema, text, [], [], [])
        for kind in ("test", "negative_test"):
            for doc_path in sorted((root / kind / path.stem).glob("*.json")):
                try:
                    instance = json.loads(doc_path.read_text(encoding="utf-8-sig"))
                except ValueError as e:
                    entry.undecided.append((f"{kind}/{doc_path.name}", f"not JSON: {e}"))
                    continue
                try:
                    ok = _decide(schema, instance)
                except Exception as e:  # an unresolvable remote $ref, a schema jsonschema refuses
                    entry.undecided.append((f"{kind}/{doc_path.name}", f"{type(e).__name__}: {e}"[:200]))
                    continue
                (entry.valid if ok else entry.invalid).append(instance)
        out.append(entry)
    return out


class Orderer:
    """Writes instances with members in the order the engine generates them, following the
    normalized schema: a ``$ref`` target's members, then an ``anyOf``/``oneOf`` branch's
    (each branch the value satisfies is an alternative), the first ``allOf`` schema's, the
    schema's own, the other ``allOf`` schemas'; undeclared members after them."""

    def __init__(self, normalized: Any) -> None:
        self.root = normalized
        self.defs = normalized.get("$defs", {}) if isinstance(normalized, dict) else {}

    def _target(self, ref: Any) -> Any:
        if ref == "#":
            return self.root
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref[len("#/$defs/"):].replace("%25", "%").replace("~1", "/").replace("~0", "~")
            return self.defs.get(name)
        return None

    def _satisfies(self, value: Any, schema: Any) -> bool:
        from jsonschema import Draft202012Validator

        if isinstance(schema, dict):
            schema = {**schema, "$defs": self.defs}
        try:
            return bool(Draft202012Validator(schema).is_valid(value))
        except Exception:
            return True

    def _parts(self, value: Any, schema: Any, depth: int) -> list[list[Any]]:
        """Alternatives, each the list of schemas whose declarations apply, in order."""
        if not isinstance(schema, dict) or depth > 24:
            return [[schema]]
        alternatives: list[list[Any]] = [[]]

        def then(options: list[list[Any]]) -> None:
            nonlocal alternatives
            alternatives = [a + o for a in alternatives for o in options][:MAX_ORDERINGS]

        target = self._target(schema.get("$ref"))
        if target is not None:
            then(self._parts(value, target, depth + 1))
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                fitting = [b for b in branches if self._satisfies(value, b)] or branches
                then([p for b in fitting for p in self._parts(value, b, depth + 1)])
        if "if" in schema:
            # `if` is read as anyOf [if ∧ then, not if ∧ else]: the branch's members first
            # (those of `if`, or of its negation, may lead)
            branch = schema.get("then") if self._satisfies(value, schema["if"]) else schema.get("else")
            rest = self._parts(value, branch, depth + 1) if isinstance(branch, dict) else [[]]
            then([[schema["if"]] + r for r in rest] + rest)
        all_of = schema.get("allOf") if isinstance(schema.get("allOf"), list) else []
        if all_of:
            then(self._parts(value, all_of[0], depth + 1))
        then([[schema]])
        for extra in all_of[1:]:
            then(self._parts(value, extra, depth + 1))
        return alternatives

    def orderings(self, value: Any, schema: Any = None, depth: int = 0) -> list[Any]:
        schema = self.root if schema is None and depth == 0 else schema
        if depth > 48 or not isinstance(value, (dict, list)):
            return [value]
        out: list[Any] = []
        for parts in self._parts(value, schema, depth):
            if isinstance(value, dict):
                declared: dict[str, Any] = {}
                for part in parts:
                    props = part.get("properties") if isinstance(part, dict) else None
                    if isinstance(props, dict):
                        for k, sub in props.items():
                            declared.setdefault(k, sub)
                ordered = {k: self.orderings(value[k], sub, depth + 1)[0] for k, sub in declared.items() if k in value}
                for k, v in value.items():
                    if k not in ordered:
                        ordered[k] = self.orderings(v, self._extra_schema(parts, k), depth + 1)[0]
                candidate: Any = ordered
            else:
                candidate = [self.orderings(v, self._item_schema(parts, i), depth + 1)[0] for i, v in enumerate(value)]
            if candidate not in out:
                out.append(candidate)
        return out[:MAX_ORDERINGS]

    @staticmethod
    def _extra_schema(parts: list[Any], name: str) -> Any:
        import re

        for part in parts:
            if not isinstance(part, dict):
                continue
            patterns = part.get("patternProperties")
            if isinstance(patterns, dict):
                for pattern, sub in patterns.items():
                    try:
                        if re.search(pattern, name):
                            return sub
                    except re.error:
                        pass
            if "additionalProperties" in part:
                return part["additionalProperties"]
        return True

    @staticmethod
    def _item_schema(parts: list[Any], index: int) -> Any:
        for part in parts:
            if not isinstance(part, dict):
                continue
            prefix = part.get("prefixItems")
            if isinstance(prefix, list) and index < len(prefix):
                return prefix[index]
            if "items" in part:
                return part["items"]
        return True


def _normalize_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_normalize_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize_numbers(v) for k, v in value.items()}
    return value


def compact(value: Any) -> str:
    """Compact JSON as the engine writes it (integral numbers without a fraction)."""
    return json.dumps(_normalize_numbers(value), separators=(",", ":"), ensure_ascii=False)


def documents(orderer: Orderer, instance: Any) -> list[str]:
    """The texts the engine could generate for ``instance`` (one per ordering)."""
    return list(dict.fromkeys(compact(v) for v in orderer.orderings(instance)))
