#!/usr/bin/env bash
# On a CUDA machine: the torch runner's tests on the GPU (the server's device sampling
# against its CPU sampler included), then decode tokens/s of a
# 1B-class Llama (random bf16 weights built in-process, no download) at batch 1, 16 and 64
# against the memory-bandwidth limit. `make test` has installed torch into .venv.
#
#   scripts/gpu_check.sh                 # cuda, the 1B config
#   scripts/gpu_check.sh --smoke         # cpu, the tiny config: what CI runs so this cannot rot
#
# Extra arguments go to `ferrolm bench gpu` (e.g. --bandwidth-gbs 4800 --json gpu.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [[ "${1:-}" == "--smoke" ]]; then
    shift
    exec "$PY" -m ferrolm.cli bench gpu --device cpu --model tiny --batches 1,4 --context 32 --steps 4 "$@"
fi
FERROLM_TEST_DEVICE=cuda "$PY" -m pytest -q tests/test_model_torch_runner.py tests/test_model_transformers.py \
    tests/test_engine_torch.py tests/test_model_device_sampler.py tests/test_server_device_sampling.py
"$PY" -m ferrolm.cli bench gpu --device cuda --model 1b --batches 1,16,64 "$@"
