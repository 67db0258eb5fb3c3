"""Shared test setup: one suite for both tree backends, and the hypothesis profile.

``FERROLM_HYPOTHESIS_EXAMPLES=N`` raises the number of examples the property tests run
(default: a moderate number that keeps the whole suite well under two minutes on a
2-core machine); ``FERROLM_HYPOTHESIS_STEPS=N`` lengthens each stateful run.
"""

from __future__ import annotations

import os
from typing import Any

import ferrolm
import pytest
from hypothesis import HealthCheck, settings

BACKENDS = ("rust", "python")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = int(raw)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value


HYPOTHESIS_EXAMPLES = _env_int("FERROLM_HYPOTHESIS_EXAMPLES", 100)
HYPOTHESIS_STEPS = _env_int("FERROLM_HYPOTHESIS_STEPS", 60)

settings.register_profile(
    "ferrolm",
    max_examples=HYPOTHESIS_EXAMPLES,
    stateful_step_count=HYPOTHESIS_STEPS,
    # the machine is shared and noisy: no per-example deadline, no slowness health check
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("ferrolm")


def make_tree(backend: str, **kw: Any) -> ferrolm.RustRadixCache | ferrolm.PyRadixCache:
    """A radix cache of the named backend, built through the public factory."""
    return ferrolm.RadixCache(backend=backend, **kw)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Runs the test once per tree backend."""
    return request.param


@pytest.fixture
def make(backend: str):
    """``make(**kw)``: a tree of this test's backend."""

    def build(**kw: Any):
        return make_tree(backend, **kw)

    return build


@pytest.fixture(scope="session")
def tiny() -> Any:
    """The embedded tiny model, loaded once for the whole run."""
    from ferrolm.model import load_model

    return load_model("tiny")


def make_engine(tiny: Any, kv_capacity: int = 4096, **kw: Any) -> Any:
    """An engine over the already-loaded tiny model with a pool of ``kv_capacity`` slots."""
    from ferrolm.engine import Engine

    # FERROLM_TEST_RUNNER=torch runs the suites that build engines here on the torch runner
    runner = os.environ.get("FERROLM_TEST_RUNNER")
    if runner and "runner" not in kw:
        kw |= {"runner": runner, "device": "cpu"}
    if kw.get("runner", "numpy") in ("numpy", "torch"):
        # exact arithmetic for the suites that compare runs token for token, sampled ones
        # included: a float16 pool rounds keys and values that other batch shapes compute
        # a few ulps apart to different halves now and then, which moves a sampled token
        kw.setdefault("kv_cache_dtype", "float32")
    return Engine(tiny, kv_capacity=kv_capacity, **kw)


@pytest.fixture(scope="session")
def shared_server() -> Any:
    """One ``ferrolm serve`` (a KV pool of 8192 tokens, every other flag its default) for the
    server suites that need no flags of their own and leave it idle after each test
    (structured output, grammars, hostile schemas, tools): started once, by the first test
    that asks, and stopped at the end of the run, which saves a start per suite."""
    from ferrolm.server.testing import running_server

    with running_server("--max-total-tokens", "8192") as s:
        yield s
