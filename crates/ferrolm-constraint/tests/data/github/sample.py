"""Draws the sample in this folder from a clone of github.com/octokit/webhooks:
``python sample.py PATH_TO_CLONE [COUNT]``. Schemas are the webhook payload schemas of
``payload-schemas/api.github.com/<event>/<action>.schema.json`` that have at least one
example payload (``payload-examples/api.github.com/<event>/``, matched by its ``action``
member; ``event.schema.json`` for events without actions), picked by the SHA-1 of
``<event>.<action>``. Each schema refers to shared ones (``common/*.schema.json``); they
are bundled into one self-contained file: every common schema reached is copied under
``definitions`` (draft-07, the schemas' draft) without its ``$schema`` and ``$id``, and
each ``$ref`` to one becomes ``#/definitions/<name>``; nothing else changes. Up to 2
example payloads of at most 30 kB each are copied unmodified to ``test/<name>/``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = "payload-schemas/api.github.com"
EXAMPLES = "payload-examples/api.github.com"
MAX_EXAMPLE = 30_000
KEEP_EXAMPLES = 2


def tree(repo: str, under: str) -> list[tuple[int, str]]:
    out = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "-l", "HEAD", under],
                         check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        size = meta.split()[3]
        if size.isdigit():
            rows.append((int(size), path))
    return rows


def show(repo: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], check=True, capture_output=True).stdout


def common_name(ref: str) -> str | None:
    """``common/user.schema.json`` or ``user.schema.json`` (from a common schema) -> ``user``."""
    if ref.startswith("#") or not ref.endswith(".schema.json"):
        return None
    return ref.rsplit("/", 1)[-1][: -len(".schema.json")]


def bundle(repo: str, schema: Any) -> Any:
    definitions: dict[str, Any] = {}

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            name = common_name(v) if k == "$ref" and isinstance(v, str) else None
            if name is not None:
                if name not in definitions:
                    definitions[name] = {}  # placeholder: cycles end here
                    common = json.loads(show(repo, f"{ROOT}/common/{name}.schema.json"))
                    common.pop("$schema", None)
                    common.pop("$id", None)
                    definitions[name] = rewrite(common)
                out[k] = f"#/definitions/{name}"
            else:
                out[k] = rewrite(v)
        return out

    root = rewrite(schema)
    if definitions:
        root["definitions"] = {k: definitions[k] for k in sorted(definitions)}
    return root


def main() -> None:
    repo, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    schemas = {}
    for _, path in tree(repo, ROOT):
        parts = path[len(ROOT) + 1:].split("/")
        if len(parts) == 2 and parts[0] != "common" and parts[1].endswith(".schema.json"):
            action = parts[1][: -len(".schema.json")]
            schemas[f"{parts[0]}.{action}"] = path
    examples: dict[str, list[tuple[str, bytes]]] = {}
    for size, path in sorted(tree(repo, EXAMPLES), key=lambda r: r[1]):
        parts = path[len(EXAMPLES) + 1:].split("/")
        if len(parts) != 2 or not path.endswith(".json") or size > MAX_EXAMPLE:
            continue
        data = show(repo, path)
        action = json.loads(data).get("action", "event")
        examples.setdefault(f"{parts[0]}.{action}", []).append((parts[1], data))
    names = [n for n in schemas if n in examples]
    names.sort(key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    for name in sorted(names[:count]):
        schema = bundle(repo, json.loads(show(repo, schemas[name])))
        (HERE / "schemas").mkdir(exist_ok=True)
        (HERE / "schemas" / f"{name}.json").write_text(
            json.dumps(schema, separators=(",", ":"), ensure_ascii=False) + "\n", encoding="utf-8")
        for file, data in examples[name][:KEEP_EXAMPLES]:
            target = HERE / "test" / name / file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    commit = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cI"], check=True,
                            capture_output=True, text=True).stdout.split()
    print(f"{min(count, len(names))} of {len(names)} schemas with examples ({len(schemas)} in all); "
          f"commit {commit[0]} ({commit[1]})")


if __name__ == "__main__":
    main()
