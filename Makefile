# ferrolm: `make run` and `make test` set everything up on a fresh machine.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-stamp
export VIRTUAL_ENV := $(abspath $(VENV))
# keep hypothesis examples and pytest cache out of the tree's status
export HYPOTHESIS_STORAGE_DIRECTORY := $(abspath $(VENV))/hypothesis

$(DEPS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "maturin>=1.7,<2" "numpy>=1.26" "xxhash>=3.4" \
		"safetensors>=0.4" "tokenizers>=0.19" "ml_dtypes>=0.3" "threadpoolctl>=3.1" "bpe-openai>=0.1.4" \
		"prometheus-client>=0.20" "pyzmq>=25" "msgpack>=1.0" "gguf>=0.17" "httpx>=0.27" "openai>=1.66" "anthropic>=0.60" \
		"pytest>=8" "hypothesis>=6.100" "mypy>=1.10" "ruff>=0.6" "jsonschema>=4" "matplotlib>=3.7"
	touch $@

# the torch runner's tests (the `torch` extra, transformers from `dev`): about 2 minutes
# and 5.7 GB (PyPI's torch wheel carries CUDA libraries) on a 2-core machine; `make run`
# does not need them
TORCH_STAMP := $(VENV)/.torch-stamp
$(TORCH_STAMP): $(DEPS_STAMP)
	$(BIN)/pip install --quiet "torch>=2.5" "transformers>=5" "peft>=0.13"
	touch $@

# the routers of the `test` extra (pyproject.toml), for tests/test_server_routers.py: about
# 100 MB of prebuilt wheels; without them those tests skip, saying why
ROUTERS_STAMP := $(VENV)/.routers-stamp
$(ROUTERS_STAMP): $(DEPS_STAMP)
	$(BIN)/pip install --quiet "sglang-router>=0.3.2" "vllm-router>=0.1.17"
	touch $@

.PHONY: venv  ## make the virtualenv with build and test dependencies
venv: $(DEPS_STAMP)

.PHONY: build  ## build the Rust core (release) into the virtualenv
build: $(DEPS_STAMP)
	$(BIN)/maturin develop --release --quiet

.PHONY: build-dev  ## build the Rust core (debug, faster to compile)
build-dev: $(DEPS_STAMP)
	$(BIN)/maturin develop --quiet

.PHONY: test  ## lint, Rust tests, Python tests, the stub check and the wheel: what CI runs
test: lint build test-rust test-python test-torch stubtest test-wheel

.PHONY: test-rust  ## cargo test of the core crates and the Rust front end (no Python needed)
test-rust:
	cargo test -p ferrolm-core -p ferrolm-constraint -p ferrolm-frontend

.PHONY: test-python  ## pytest against the built module
test-python: build $(TORCH_STAMP) $(ROUTERS_STAMP) replay-bin
	FERROLM_REPLAY_BIN=$(REPLAY_BIN) $(BIN)/python -m pytest

REPLAY_BIN := $(abspath target/release/ferrolm-replay)

.PHONY: replay-bin  ## the ferrolm-replay binary (engine traces without Python), target/release
replay-bin:
	cargo build --release --quiet -p ferrolm-core --bin ferrolm-replay

.PHONY: wheel  ## the abi3 wheel (release) in target/wheels
wheel: $(DEPS_STAMP)
	rm -f target/wheels/ferrolm-*.whl
	$(BIN)/maturin build --release --quiet --out target/wheels

.PHONY: test-wheel  ## install the wheel in a fresh virtualenv without Rust on PATH, run ferrolm from it
test-wheel: wheel
	PYTHON=$(PYTHON) scripts/test_wheel.sh

# the engine suites and the server suites whose outcome depends on the runner again, the
# engines of make_engine and the servers of running_server on the torch runner (CPU): the
# server's tokens and log-probabilities against the offline Engine's, greedy (the runner's
# device greedy), seeded and structured (openai); the step loop held, failing and dying
# around the runner's forward (engine_health); KV events per step (kv_events); grammar
# masks over the runner's logits (structured); 64 streams in one batch, disconnects and
# the soak (load). The others test HTTP, validation and parsing, which never see the
# runner: they run once.
TORCH_RUNNER_SUITES := tests/test_engine_*.py tests/test_server_openai.py tests/test_server_engine_health.py \
	tests/test_server_kv_events.py tests/test_server_structured.py tests/test_server_load.py tests/test_lora.py

.PHONY: test-torch  ## the engine suites and the runner-dependent server suites on the torch runner
test-torch: build $(TORCH_STAMP)
	FERROLM_TEST_RUNNER=torch $(BIN)/python -m pytest $(TORCH_RUNNER_SUITES)

.PHONY: stubtest  ## check python/ferrolm/_core.pyi against the built module
stubtest: build
	$(BIN)/python -m mypy.stubtest ferrolm._core --mypy-config-file pyproject.toml

.PHONY: run  ## the main job on the embedded default: serve the tiny model (OpenAI API) on 127.0.0.1:30000
run: build
	$(BIN)/ferrolm serve --model tiny

.PHONY: demo  ## generate with the tiny model from the command line, then benchmark the tree
demo: build
	$(BIN)/ferrolm generate --model tiny --stream --max-new-tokens 24 \
		--prompt "The radix tree lets requests that share a prefix" \
		--prompt "Once upon a time"
	$(BIN)/ferrolm bench tree

.PHONY: bench  ## every benchmark
bench: build
	$(BIN)/ferrolm bench tree
	$(BIN)/ferrolm bench engine

# SGLang's wheel without its dependencies: only its bundled Rust tree core extension is
# loaded (it links libtorch), for `ferrolm bench tree`'s side-by-side peer. Not part of
# `make test`; the peer's tests skip without it.
SGLANG_PEER := sglang==0.5.23
.PHONY: tree-peer  ## install SGLang's Rust tree core for `ferrolm bench tree` (no deps; needs torch)
tree-peer: $(TORCH_STAMP)
	$(BIN)/pip install --quiet --no-deps "$(SGLANG_PEER)"

PY_SOURCES := python tests scripts

.PHONY: lint  ## rustfmt, clippy, ruff (lint and format) and mypy: fails on any finding
lint: $(DEPS_STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy

.PHONY: format  ## rustfmt and ruff: rewrite the sources as lint wants them
format: $(DEPS_STAMP)
	cargo fmt --all
	$(BIN)/ruff check --fix $(PY_SOURCES)
	$(BIN)/ruff format $(PY_SOURCES)

.PHONY: clean  ## remove build outputs and the virtualenv
clean:
	rm -rf target $(VENV)

.PHONY: help  ## this list
help:
	@grep -E '^\.PHONY: [a-z-]+  ## ' $(MAKEFILE_LIST) | sed -E 's/^\.PHONY: ([a-z-]+)  ## (.*)/  make \1\t\2/' | expand -t 20
