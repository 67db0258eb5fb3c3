#!/usr/bin/env bash
# The wheel as a user gets it: installs target/wheels/ferrolm-*.whl (`make wheel`) into a
# fresh virtualenv, with no Rust toolchain on PATH and an empty model cache, and runs
# `ferrolm generate --model tiny` and `ferrolm replay` from it, outside the source tree
# (so nothing is imported from python/). Dependencies come from pip's usual index and
# cache; torch is not installed (the numpy runner serves the tiny model).
#
#   scripts/test_wheel.sh [WHEEL]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
WHEEL=${1:-$(ls -t target/wheels/ferrolm-*-abi3-*.whl 2>/dev/null | head -n 1)}
if [[ -z "$WHEEL" || ! -f "$WHEEL" ]]; then
    echo "test_wheel: no wheel in target/wheels (run make wheel)" >&2
    exit 1
fi
WHEEL=$(realpath "$WHEEL")

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# PATH without any directory holding cargo, rustc or rustup
STRIPPED=""
IFS=: read -ra DIRS <<< "$PATH"
for dir in "${DIRS[@]}"; do
    [[ -z "$dir" || -x "$dir/cargo" || -x "$dir/rustc" || -x "$dir/rustup" ]] && continue
    STRIPPED=${STRIPPED:+$STRIPPED:}$dir
done

"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "$WHEEL"

cd "$WORK"
export PATH="$WORK/venv/bin:$STRIPPED" FERROLM_CACHE="$WORK/cache"
unset VIRTUAL_ENV PYTHONPATH FERROLM_LOG
for tool in cargo rustc rustup; do
    if command -v "$tool" > /dev/null; then
        echo "test_wheel: $tool is still on PATH ($(command -v "$tool"))" >&2
        exit 1
    fi
done
if python -c "import torch" 2> /dev/null; then
    echo "test_wheel: torch got into the fresh virtualenv" >&2
    exit 1
fi
installed=$(python -c "import ferrolm, ferrolm._core; print(ferrolm.__file__)")
[[ "$installed" == "$WORK/venv/"* ]] || { echo "test_wheel: ferrolm imported from $installed" >&2; exit 1; }

out=$(ferrolm generate --model tiny --prompt "The wheel works" --max-new-tokens 8)
echo "$out"
grep -Eq '^\[(length|stop), [0-9]+ tokens\]$' <<< "$out" || { echo "test_wheel: generate printed no result" >&2; exit 1; }

# the trace replay ships in the extension: no binary needed
ferrolm replay -q --expect-same "$ROOT/crates/ferrolm-core/tests/data/tiny_engine.trace.jsonl"
echo "test_wheel: ok ($(basename "$WHEEL"))"
