"""Generates test instances for the schema corpora that have none of their own (Kubernetes,
GitHub webhooks; see their SOURCE.txt): ``python scripts/corpus_instances.py DIR...`` with
``python/`` on the path. For each ``DIR/schemas/<name>.json`` it writes

- ``DIR/test/<name>/gen-*.json``: valid documents synthesized from the schema, one with
  the required members only and two richer ones (some optional members, maps and arrays
  with an entry or two, values chosen from the member's name, format, pattern, bounds);
- ``DIR/negative_test/<name>/gen-*.json``: invalid ones, each a valid document (a
  generated one or one already in ``test/``) with one change a validator must catch: a
  value of the wrong type, a required member removed, a value outside an ``enum``, a
  member an ``additionalProperties: false`` object does not declare, a bound or
  ``pattern`` broken; ``DIR/negative_test/MUTATIONS.txt`` says what each one changed.

Every valid document is checked by ``jsonschema`` with formats as annotations and with the
formats the engine asserts asserted; every invalid one must fail both. A document that
does not pass is dropped (and counted). The output depends only on the schemas and the
documents in ``test/`` (seeded by the schema's name), so rerunning rewrites the same files."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

from ferrolm.bench.corpus import format_checker, validator_class

MAX_DEPTH = 7  # beyond it, objects get their required members only
RICH_OPTIONAL = (2, 5)  # optional members per object in rich documents (at depth 0: twice)
ATTEMPTS = 6
MAX_RICH_BYTES = 8000  # a rich document larger than this (or twice the minimal one) is redrawn
NEGATIVE_KINDS = ("wrong-type", "missing-required", "enum", "extra-member", "bound")
FORMATS = format_checker()


class Unsatisfiable(Exception):
    pass


# --------------------------------------------------------------------------- values

# Plausible strings by member name (lowercased, without `_`/`-`), before generic fallbacks.
NAMED_STRINGS = {
    "name": "web",
    "namespace": "default",
    "image": "nginx:1.27",
    "imagepullpolicy": "IfNotPresent",
    "protocol": "TCP",
    "path": "/healthz",
    "mountpath": "/data",
    "host": "example.com",
    "hostname": "web-0",
    "schedule": "*/5 * * * *",
    "key": "app",
    "value": "web",
    "apiversion": "v1",
    "kind": "ConfigMap",
    "login": "octocat",
    "email": "octocat@example.com",
    "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e",
    "ref": "refs/heads/main",
    "title": "Fix the build",
    "body": "Looks good to me.",
    "description": "A short description.",
    "message": "Update README.md",
    "state": "open",
    "type": "User",
    "role": "admin",
    "label": "bug",
    "color": "d73a4a",
    "nodeid": "MDQ6VXNlcjE=",
    "fullname": "octocat/hello-world",
    "language": "Python",
    "defaultbranch": "main",
    "branch": "main",
    "version": "1.0.0",
    "tag": "v1.0.0",
    "storageclassname": "standard",
    "serviceaccountname": "default",
    "port": "http",
    "targetport": "http",
    "reason": "Ready",
    "status": "True",
    "cpu": "500m",
    "memory": "128Mi",
    "command": "sh",
    "args": "--verbose",
    "group": "apps",
    "resource": "pods",
    "verb": "get",
    "verbs": "get",
    "resources": "pods",
    "apigroups": "apps",
    "username": "jane",
}
FORMAT_STRINGS = {
    "date-time": "2024-05-14T09:30:00Z",
    "date": "2024-05-14",
    "time": "09:30:00Z",
    "email": "octocat@example.com",
    "uri": "https://example.com/octocat",
    "uri-reference": "/octocat",
    "uri-template": "https://example.com/{id}",
    "uuid": "3f1c2a4e-8b7d-4c6a-9e21-5d4b3a2f1e0c",
    "ipv4": "10.0.0.12",
    "ipv6": "2001:db8::1",
    "hostname": "api.example.com",
    "byte": "aGVsbG8=",
    "int-or-string": "80",
    "duration": "P1D",
}
NAMED_NUMBERS = {
    "port": 8080,
    "containerport": 8080,
    "replicas": 3,
    "id": 1296269,
    "number": 42,
    "count": 2,
    "size": 108,
    "timeoutseconds": 5,
    "periodseconds": 10,
    "weight": 50,
    "priority": 1000,
}
MAP_KEYS = {
    "labels": ["app", "tier"],
    "annotations": ["example.com/owner", "example.com/team"],
    "matchlabels": ["app", "tier"],
    "data": ["config.yaml", "LOG_LEVEL"],
    "selector": ["app", "tier"],
}


def _norm(key: str | None) -> str:
    return re.sub(r"[_\-]", "", (key or "").lower())


def _chars_of(items: list[Any], negate: bool) -> list[str]:
    """Characters a character class admits, pleasant ones first."""
    pleasant = "abcdefghijklmnopqrstuvwxyz0123456789-_.ABCDEFGHIJKLMNOPQRSTUVWXYZ /:@"
    admitted = []
    for ch in pleasant + "".join(chr(c) for c in range(33, 127)):
        hit = False
        for op, av in items:
            name = str(op)
            if name == "LITERAL" and ord(ch) == av:
                hit = True
            elif name == "RANGE" and av[0] <= ord(ch) <= av[1]:
                hit = True
            elif name == "CATEGORY":
                cat = str(av)
                tests = {
                    "CATEGORY_DIGIT": ch.isdigit(),
                    "CATEGORY_NOT_DIGIT": not ch.isdigit(),
                    "CATEGORY_WORD": ch.isalnum() or ch == "_",
                    "CATEGORY_NOT_WORD": not (ch.isalnum() or ch == "_"),
                    "CATEGORY_SPACE": ch.isspace(),
                    "CATEGORY_NOT_SPACE": not ch.isspace(),
                }
                hit = tests.get(cat, False)
        if hit != negate:
            admitted.append(ch)
    return admitted


def string_for_pattern(pattern: str, rng: random.Random) -> str:
    """A string the regular expression matches (the shortest-ish, pleasant characters);
    raises Unsatisfiable for constructs it does not write (backreferences, lookaround)."""
    try:
        parsed = sre_parse.parse(pattern)
    except Exception as e:
        raise Unsatisfiable(f"pattern {pattern!r}: {e}") from e

    def emit(seq: Any) -> str:
        out = []
        for op, av in seq:
            name = str(op)
            if name == "LITERAL":
                out.append(chr(av))
            elif name == "NOT_LITERAL":
                out.append("a" if av != ord("a") else "b")
            elif name == "ANY":
                out.append("a")
            elif name == "IN":
                negate = bool(av) and str(av[0][0]) == "NEGATE"
                chars = _chars_of(av[1:] if negate else av, negate)
                if not chars:
                    raise Unsatisfiable(f"pattern {pattern!r}: an empty class")
                out.append(chars[0])
            elif name == "BRANCH":
                out.append(emit(av[1][0]))
            elif name == "SUBPATTERN":
                out.append(emit(av[-1]))
            elif name == "ATOMIC_GROUP":
                out.append(emit(av))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, hi, sub = av
                n = lo if lo > 0 else min(1, hi)
                out.append("".join(emit(sub) for _ in range(n)))
            elif name == "AT":
                pass
            elif name == "CATEGORY":
                out.append({"CATEGORY_DIGIT": "1", "CATEGORY_SPACE": " "}.get(str(av), "a"))
            else:
                raise Unsatisfiable(f"pattern {pattern!r}: {name} not written")
        return "".join(out)

    text = emit(parsed)
    if not re.search(pattern, text):
        raise Unsatisfiable(f"pattern {pattern!r}: wrote {text!r}, which it does not match")
    return text


class Synthesizer:
    """Writes documents a schema accepts. ``rich`` adds optional members; ``rng`` picks
    which, and among enum values and branches."""

    def __init__(self, root: Any, rng: random.Random, rich: bool) -> None:
        self.root = root
        self.rng = rng
        self.rich = rich
        self.validator_cls = _validator_cls(root)

    # -- schema helpers

    def resolve(self, schema: Any, depth: int = 0) -> Any:
        if not isinstance(schema, dict) or "$ref" not in schema or depth > 32:
            return schema
        target = pointer(self.root, schema["$ref"])
        if target is None:
            raise Unsatisfiable(f"unresolved $ref {schema['$ref']}")
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        merged = self.resolve(target, depth + 1)
        return {**merged, **rest} if isinstance(merged, dict) and rest else merged

    def merged(self, schema: Any) -> Any:
        """The schema with its ``allOf`` members merged in (see ``merge``)."""
        schema = self.resolve(schema)
        if not isinstance(schema, dict) or "allOf" not in schema:
            return schema
        out = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = self.merged(part)
            if part is False:
                raise Unsatisfiable("allOf with false")
            if isinstance(part, dict):
                out = merge(out, part)
        return out

    def accepts(self, schema: Any, value: Any) -> bool:
        if isinstance(schema, dict):
            schema = {
                **schema,
                **{k: self.root[k] for k in ("definitions", "$defs") if isinstance(self.root, dict) and k in self.root},
            }
        return bool(self.validator_cls(schema, format_checker=FORMATS).is_valid(value))

    # -- values

    def value(self, schema: Any, key: str | None = None, depth: int = 0) -> Any:
        if depth > 40:
            raise Unsatisfiable("too deep")
        if schema is True or schema == {}:
            return self.string(None, key)
        if schema is False:
            raise Unsatisfiable("false schema")
        schema = self.merged(schema)
        if not isinstance(schema, dict):
            return self.string(None, key)
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            rest = {k: v for k, v in schema.items() if k != "enum"}
            choices = [v for v in schema["enum"] if self.accepts(rest, v)]
            choices = [v for v in choices if v is not None] or choices
            if not choices:
                raise Unsatisfiable("no enum value fits")
            return copy.deepcopy(self.rng.choice(choices) if self.rich else choices[0])
        for keyword in ("oneOf", "anyOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                base = {k: v for k, v in schema.items() if k != keyword}
                order = list(range(len(branches)))
                if self.rich:
                    self.rng.shuffle(order)
                for i in order:
                    branch = self.merged(branches[i])
                    combined = {**base, **branch} if isinstance(branch, dict) else branch
                    if (
                        isinstance(combined, dict)
                        and isinstance(base.get("properties"), dict)
                        and isinstance(branch, dict)
                    ):
                        combined["properties"] = {**base["properties"], **branch.get("properties", {})}
                        combined["required"] = list(
                            dict.fromkeys(base.get("required", []) + branch.get("required", []))
                        )
                    try:
                        v = self.value(combined, key, depth + 1)
                    except Unsatisfiable:
                        continue
                    if self.accepts(schema, v):
                        return v
                raise Unsatisfiable(f"no {keyword} branch written")
        kind = self.pick_type(schema, key)
        if kind == "object":
            return self.object(schema, key, depth)
        if kind == "array":
            return self.array(schema, key, depth)
        if kind == "string":
            return self.string(schema, key)
        if kind in ("integer", "number"):
            return self.number(schema, key, kind)
        if kind == "boolean":
            return self.rng.random() < 0.5 if self.rich else True
        return None

    def pick_type(self, schema: dict[str, Any], key: str | None) -> str:
        types = schema.get("type")
        if isinstance(types, str):
            return types
        if isinstance(types, list) and types:
            concrete = [t for t in types if t != "null"]
            return concrete[0] if concrete else "null"
        if any(k in schema for k in ("properties", "required", "additionalProperties", "patternProperties")):
            return "object"
        if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
            return "number"
        return "string"

    def object(self, schema: dict[str, Any], key: str | None, depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required = [k for k in schema.get("required", []) if isinstance(k, str)]
        keys = list(required)
        optional = [k for k in props if k not in required]
        if self.rich and depth < MAX_DEPTH and optional:
            lo, hi = RICH_OPTIONAL
            n = self.rng.randint(lo, hi) * (2 if depth == 0 else 1)
            keys += self.rng.sample(optional, min(n, len(optional)))
        out: dict[str, Any] = {}
        for k in [k for k in props if k in keys] + [k for k in keys if k not in props]:
            sub = props.get(k, self.extra_schema(schema, k))
            out[k] = self.value(sub, k, depth + 1)
        extra = schema.get("additionalProperties")
        wanted = int(schema.get("minProperties", 0)) - len(out)
        if isinstance(extra, dict) and not props and (self.rich and depth < MAX_DEPTH or wanted > 0):
            names = MAP_KEYS.get(_norm(key), ["alpha", "beta"])
            for name in names[: max(wanted, self.rng.randint(1, 2))]:
                out[name] = self.value(extra, name, depth + 1)
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict) and patterns and (wanted > len(out) or (self.rich and not props)):
            pattern, sub = next(iter(patterns.items()))
            out[string_for_pattern(pattern, self.rng)] = self.value(sub, None, depth + 1)
        return out

    def extra_schema(self, schema: dict[str, Any], name: str) -> Any:
        for pattern, sub in (schema.get("patternProperties") or {}).items():
            if re.search(pattern, name):
                return sub
        extra = schema.get("additionalProperties", True)
        return True if extra is None else extra

    def array(self, schema: dict[str, Any], key: str | None, depth: int) -> list[Any]:
        lo = int(schema.get("minItems", 0))
        hi = int(schema.get("maxItems", 1 << 30))
        n = max(lo, (self.rng.randint(1, 2) if self.rich and depth < MAX_DEPTH else 0))
        n = min(n, hi)
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else None
        items = schema.get("items", True)
        if isinstance(items, list):  # draft-04 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        out: list[Any] = []
        for i in range(n * 3):
            if len(out) == n:
                break
            sub = prefix[i] if prefix is not None and i < len(prefix) else items
            v = self.value(sub, (key or "")[:-1] if key and key.endswith("s") else key, depth + 1)
            if schema.get("uniqueItems") and v in out:
                v = self.vary(v, i)
                if v in out:
                    continue
            out.append(v)
        if len(out) < lo:
            raise Unsatisfiable("minItems")
        return out

    @staticmethod
    def vary(v: Any, i: int) -> Any:
        if isinstance(v, str):
            return f"{v}-{i + 1}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v + i + 1
        return v

    def string(self, schema: dict[str, Any] | None, key: str | None) -> str:
        schema = schema or {}
        if isinstance(schema.get("pattern"), str):
            return string_for_pattern(schema["pattern"], self.rng)
        fmt = schema.get("format")
        named = _norm(key)
        if isinstance(fmt, str) and fmt in FORMAT_STRINGS:
            text = FORMAT_STRINGS[fmt]
        elif named in NAMED_STRINGS:
            text = NAMED_STRINGS[named]
        elif named.endswith("url"):
            text = f"https://api.github.com/repos/octocat/hello-world/{named[:-3] or 'x'}"
        elif named.endswith("at") or named.endswith("timestamp") or named.endswith("time"):
            text = FORMAT_STRINGS["date-time"]
        else:
            text = f"example-{named or 'value'}"[:40]
        lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", 1 << 30))
        if len(text) < lo:
            text = text + "x" * (lo - len(text))
        if len(text) > hi:
            text = text[:hi]
        return text

    def number(self, schema: dict[str, Any], key: str | None, kind: str) -> int | float:
        lo: float = -(1 << 31)
        hi: float = 1 << 31
        mn, mx = schema.get("minimum"), schema.get("maximum")
        xmn, xmx = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if isinstance(mn, (int, float)) and not isinstance(mn, bool):
            lo = mn + 1 if xmn is True else mn
        if isinstance(xmn, (int, float)) and not isinstance(xmn, bool):
            lo = max(lo, xmn + 1)
        if isinstance(mx, (int, float)) and not isinstance(mx, bool):
            hi = mx - 1 if xmx is True else mx
        if isinstance(xmx, (int, float)) and not isinstance(xmx, bool):
            hi = min(hi, xmx - 1)
        v: float = NAMED_NUMBERS.get(_norm(key), self.rng.randint(1, 100) if self.rich else 1)
        v = min(max(v, lo), hi)
        step = schema.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0:
            v = step * max(1, round(v / step))
        if kind == "integer":
            v = int(v) if float(v).is_integer() else int(v) + 1
        return v


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Both schemas' constraints in one, where simple: properties united (a name both
    declare gets both schemas), required united, types and enums intersected, other
    keywords taken from ``a`` first (the generated value is validated anyway)."""
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
        elif k == "properties" and isinstance(v, dict) and isinstance(out[k], dict):
            props = dict(out[k])
            for name, sub in v.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[k] = props
        elif k == "required" and isinstance(v, list):
            out[k] = list(dict.fromkeys(list(out[k]) + v))
        elif k == "type":
            mine = out[k] if isinstance(out[k], list) else [out[k]]
            theirs = v if isinstance(v, list) else [v]
            both = [t for t in mine if t in theirs or (t == "integer" and "number" in theirs)]
            both += [t for t in theirs if t == "integer" and "number" in mine and t not in both]
            out[k] = both
        elif k == "enum" and isinstance(v, list) and isinstance(out[k], list):
            out[k] = [x for x in out[k] if x in v]
    return out


def pointer(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _validator_cls(schema: Any) -> Any:
    return validator_class(schema)


# --------------------------------------------------------------------------- mutations


def sites(
    synth: Synthesizer, schema: Any, value: Any, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """(path, governing schema, value) for every value of a valid document, following the
    schema (``$ref``s, ``allOf`` merged, the ``oneOf``/``anyOf`` branch the value satisfies)."""
    try:
        schema = synth.merged(schema)
    except Unsatisfiable:
        return
    if not isinstance(schema, dict):
        return
    for keyword in ("oneOf", "anyOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            fitting = [b for b in branches if synth.accepts(b, value)]
            if len(fitting) != 1:
                return  # ambiguous: no mutation below here
            base = {k: v for k, v in schema.items() if k != keyword}
            branch = synth.merged(fitting[0])
            schema = {**base, **branch} if isinstance(branch, dict) else base
    yield path, schema, value
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for k, v in value.items():
            yield from sites(synth, props.get(k, synth.extra_schema(schema, k)), v, path + (k,))
    elif isinstance(value, list):
        items = schema.get("items", True)
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        if isinstance(items, list):
            prefix, items = items, schema.get("additionalItems", True)
        for i, v in enumerate(value):
            yield from sites(synth, prefix[i] if i < len(prefix) else items, v, path + (i,))


def set_at(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    doc = copy.deepcopy(doc)
    if not path:
        return new
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return doc


# Replacement values for a wrong-type mutation, with the JSON types each one has.
WRONG = [("twelve", {"string"}), (12345, {"integer", "number"}), (True, {"boolean"}), ([1], {"array"})]


def mutations(synth: Synthesizer, doc: Any) -> Iterator[tuple[str, tuple[Any, ...], Any, str]]:
    """(kind, path, mutated document, what changed) candidates, in a seeded order."""
    found = list(sites(synth, synth.root, doc))
    synth.rng.shuffle(found)
    found.sort(key=lambda site: not site[0])  # the root last: a change inside says more
    for path, schema, value in found:
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
        if types and "enum" not in schema and "const" not in schema:
            for wrong, has in WRONG:
                if not has & set(types):
                    yield (
                        "wrong-type",
                        path,
                        set_at(doc, path, wrong),
                        f"{'/'.join(map(str, path))}: {types} -> {wrong!r}",
                    )
                    break
        if isinstance(value, dict):
            for k in schema.get("required", []):
                if k in value:
                    smaller = {kk: vv for kk, vv in value.items() if kk != k}
                    yield (
                        "missing-required",
                        path,
                        set_at(doc, path, smaller),
                        f"{'/'.join(map(str, path))}: required {k!r} removed",
                    )
                    break
            if schema.get("additionalProperties") is False and not schema.get("patternProperties"):
                bigger = {**value, "unexpectedMember": 1}
                yield (
                    "extra-member",
                    path,
                    set_at(doc, path, bigger),
                    f"{'/'.join(map(str, path))}: undeclared 'unexpectedMember' added",
                )
        if isinstance(schema.get("enum"), list) and isinstance(value, str):
            yield (
                "enum",
                path,
                set_at(doc, path, "not-a-listed-value"),
                f"{'/'.join(map(str, path))}: {value!r} -> outside the enum",
            )
        if isinstance(value, str) and isinstance(schema.get("maxLength"), int):
            yield (
                "bound",
                path,
                set_at(doc, path, "x" * (schema["maxLength"] + 1)),
                f"{'/'.join(map(str, path))}: longer than maxLength",
            )
        if isinstance(value, str) and isinstance(schema.get("pattern"), str):
            for bad in ("", "!!", " x ", "\u00e9\u00e9"):
                if not re.search(schema["pattern"], bad):
                    yield (
                        "bound",
                        path,
                        set_at(doc, path, bad),
                        f"{'/'.join(map(str, path))}: {bad!r} outside the pattern",
                    )
                    break
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(schema.get("minimum"), (int, float)):
                yield (
                    "bound",
                    path,
                    set_at(doc, path, schema["minimum"] - 1),
                    f"{'/'.join(map(str, path))}: below minimum",
                )
            if isinstance(schema.get("maximum"), (int, float)):
                yield (
                    "bound",
                    path,
                    set_at(doc, path, schema["maximum"] + 1),
                    f"{'/'.join(map(str, path))}: above maximum",
                )
        if isinstance(value, list) and isinstance(schema.get("minItems"), int) and schema["minItems"] > 0:
            yield (
                "bound",
                path,
                set_at(doc, path, value[: schema["minItems"] - 1]),
                f"{'/'.join(map(str, path))}: fewer than minItems",
            )


# --------------------------------------------------------------------------- driver


def seed_of(*parts: str) -> int:
    return int.from_bytes(hashlib.sha1("/".join(parts).encode()).digest()[:8], "big")


def is_valid(cls: Any, schema: Any, doc: Any) -> tuple[bool, bool]:
    return bool(cls(schema).is_valid(doc)), bool(cls(schema, format_checker=FORMATS).is_valid(doc))


def generate(
    name: str, schema: Any, existing: list[Any]
) -> tuple[dict[str, Any], dict[str, tuple[Any, str]], list[str]]:
    """(valid documents by file name, invalid ones by file name with what changed, notes)."""
    cls = _validator_cls(schema)
    valid: dict[str, Any] = {}
    notes: list[str] = []
    cap = MAX_RICH_BYTES
    for label, rich in (("minimal", False), ("rich-1", True), ("rich-2", True)):
        for attempt in range(ATTEMPTS):
            synth = Synthesizer(schema, random.Random(seed_of(name, label, str(attempt))), rich)
            try:
                doc = synth.value(schema)
            except Unsatisfiable as e:
                why = str(e)
                continue
            size = len(json.dumps(doc))
            if not rich:
                cap = max(cap, 2 * size)  # required members alone may be large (GitHub's)
            elif size > cap:
                why = f"{size} bytes, over {cap}"
                continue
            if is_valid(cls, schema, doc) == (True, True):
                if doc not in valid.values() and doc not in existing:
                    valid[f"gen-{label}.json"] = doc
                break
            errors = list(cls(schema, format_checker=FORMATS).iter_errors(doc)) or list(cls(schema).iter_errors(doc))
            why = errors[0].message[:120]
        else:
            notes.append(f"{name}: no valid {label} document ({why})")
    invalid: dict[str, tuple[Any, str]] = {}
    bases = sorted(list(valid.values()) + existing, key=lambda d: len(json.dumps(d)))  # the smallest first
    for kind in NEGATIVE_KINDS:
        done = False
        for b, base in enumerate(bases):
            synth = Synthesizer(schema, random.Random(seed_of(name, kind, str(b))), True)
            for got, _path, doc, what in mutations(synth, base):
                if got != kind:
                    continue
                if is_valid(cls, schema, doc) == (False, False) and doc not in [d for d, _ in invalid.values()]:
                    invalid[f"gen-{kind}.json"] = (doc, what)
                    done = True
                    break
            if done:
                break
    return valid, invalid, notes


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n", encoding="utf-8")


def generate_for(root: Path, name: str) -> tuple[dict[str, Any], dict[str, tuple[Any, str]], list[str]]:
    """``generate`` for ``root/schemas/<name>.json``, with the valid documents of
    ``root/test/<name>/`` that are not generated as further bases for invalid ones."""
    schema = json.loads((root / "schemas" / f"{name}.json").read_text(encoding="utf-8"))
    cls = _validator_cls(schema)
    existing = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((root / "test" / name).glob("*.json"))
        if not p.name.startswith("gen-")
    ]
    existing = [e for e in existing if is_valid(cls, schema, e) == (True, True)]
    return generate(name, schema, existing)


def main(dirs: list[str]) -> int:
    for d in dirs:
        root = Path(d)
        counts = {"schemas": 0, "valid": 0, "invalid": 0}
        log: list[str] = []
        all_notes: list[str] = []
        for old in list(root.glob("test/*/gen-*.json")) + list(root.glob("negative_test/*/gen-*.json")):
            old.unlink()
        for schema_path in sorted((root / "schemas").glob("*.json")):
            name = schema_path.stem
            valid, invalid, notes = generate_for(root, name)
            all_notes += notes
            counts["schemas"] += 1
            for file, doc in valid.items():
                write_json(root / "test" / name / file, doc)
            for file, (doc, what) in invalid.items():
                write_json(root / "negative_test" / name / file, doc)
                log.append(f"{name}/{file}: {what}")
            counts["valid"] += len(valid)
            counts["invalid"] += len(invalid)
        if log:
            (root / "negative_test").mkdir(exist_ok=True)
            (root / "negative_test" / "MUTATIONS.txt").write_text(
                "What each generated invalid document changed (scripts/corpus_instances.py):\n" + "\n".join(log) + "\n",
                encoding="utf-8",
            )
        print(f"{root.name}: {counts}")
        for note in all_notes:
            print(f"  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
