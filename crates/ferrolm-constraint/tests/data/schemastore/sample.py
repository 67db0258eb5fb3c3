"""Draws the sample in this folder from a clone of github.com/SchemaStore/schemastore:
``python sample.py PATH_TO_CLONE [COUNT]``. Schemas are those of ``src/schemas/json``
with at least one JSON instance under ``src/test/<name>/``, under 60 kB, picked by the
SHA-1 of their name (not by whether ferrolm compiles them); each keeps up to 6 positive
and 4 negative JSON instances of at most 64 kB (``src/negative_test/<name>/``)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_SCHEMA = 60_000
MAX_INSTANCE = 64_000


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


def main() -> None:
    repo, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 120
    instances: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for kind in ("test", "negative_test"):
        for size, path in tree(repo, f"src/{kind}"):
            parts = path.split("/")
            if len(parts) == 4 and path.endswith(".json") and size <= MAX_INSTANCE:
                instances.setdefault((kind, parts[2]), []).append((size, path))
    schemas = {Path(p).stem: (s, p) for s, p in tree(repo, "src/schemas/json") if p.endswith(".json")}
    names = [n for n, (s, _) in schemas.items() if s <= MAX_SCHEMA and ("test", n) in instances]
    names.sort(key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    for name in sorted(names[:count]):
        (HERE / "schemas").mkdir(exist_ok=True)
        (HERE / "schemas" / f"{name}.json").write_bytes(show(repo, schemas[name][1]))
        for kind, keep in (("test", 6), ("negative_test", 4)):
            for _, path in sorted(instances.get((kind, name), []), key=lambda r: r[1])[:keep]:
                target = HERE / kind / name / Path(path).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(show(repo, path))
    commit = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cI"], check=True,
                            capture_output=True, text=True).stdout.split()
    print(f"{min(count, len(names))} of {len(names)} eligible schemas; commit {commit[0]} ({commit[1]})")


if __name__ == "__main__":
    main()
