"""Every eviction policy drives the engine's prefix cache: under KV pressure (so the tree
evicts), greedy outputs stay those of each prompt alone with the cache off, the cache
still hits, and the engine's invariants hold after every step. An unknown policy is
refused naming the field (``ferrolm serve --radix-eviction-policy`` reaching the engine:
``test_server_units.py``)."""

from __future__ import annotations

import pytest
from conftest import make_engine
from ferrolm.errors import InvalidInputError
from ferrolm.model import LoadedModel
from ferrolm.radix_py import POLICIES
from test_engine_identity import GREEDY, PROMPTS, run_batch


@pytest.fixture(scope="module")
def alone(tiny: LoadedModel) -> list[list[int]]:
    engine = make_engine(tiny, enable_prefix_cache=False)
    return [run_batch(engine, [p], GREEDY)[0] for p in PROMPTS]


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_keeps_outputs_under_kv_pressure(tiny: LoadedModel, alone: list[list[int]], policy: str) -> None:
    # one prompt after another twice over in a pool of 160 slots: the second round finds
    # some prefixes cached, and what is cached must be evicted as the round goes on
    engine = make_engine(tiny, kv_capacity=160, eviction_policy=policy)
    for _ in range(2):
        assert [run_batch(engine, [p], GREEDY)[0] for p in PROMPTS] == alone
    stats = engine.core.stats()
    # far more tokens went through the cache than the pool holds: the tree evicted
    assert stats["prompt_tokens"] + stats["generation_tokens"] > 3 * 160, stats
    assert stats["cache_hit_tokens"] > 0, stats
    assert stats["errors"] == 0, stats


def test_unknown_policy_names_the_field(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidInputError, match="eviction_policy") as e:
        make_engine(tiny, eviction_policy="arc")
    assert "slru" in str(e.value) and "tlru" in str(e.value)
