"""Cache-aware routing over ferrolm replicas on loopback: an index rebuilt from the KV
event streams alone (``ferrolm.kv_index``) predicts, before every request, the cached
prompt tokens the chosen replica then reports (in whole blocks), for a multi-turn
workload with eviction running; and, where ``ai-dynamo-runtime`` is installed, NVIDIA
Dynamo's own KV indexer fed the same streams predicts the same."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("zmq", reason="pyzmq is a dependency of ferrolm (make test installs it)")

from ferrolm.bench.route import Fleet, Replica, multi_turn_workload, replica_flags  # noqa: E402
from ferrolm.server.testing import free_port, running_server, wait_until  # noqa: E402

REPLICAS = 3
BLOCK = 8
KV_TOKENS = 200  # each replica's pool: the conversations below outgrow it
MAX_NEW = 6


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        replicas = []
        for i in range(REPLICAS):
            pub, replay = free_port(), free_port()
            server = stack.enter_context(
                running_server(
                    *replica_flags(pub, replay, BLOCK, KV_TOKENS, f"kv@replica-{i}@tiny"),
                    "--chunked-prefill-size",
                    "64",
                )
            )
            replicas.append(Replica(f"replica-{i}", server.url, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"))
        f = Fleet(replicas, BLOCK)
        yield f
        f.close()


@pytest.mark.parametrize("policy", ["round_robin", "routed"])
def test_the_events_predict_every_reported_cache_hit(fleet: Fleet, policy: str) -> None:
    fleet.flush()  # the index sees AllBlocksCleared from each replica
    assert all(fleet.index.num_blocks(r.name) == 0 for r in fleet.replicas)
    removed_before = fleet.removed_blocks
    openings, turns = multi_turn_workload(
        seed=7, conversations=6, turns=4, system_prompts=2, system_len=40, user_len=(8, 20), salted=1
    )
    stats = fleet.run(openings, turns, policy, MAX_NEW)
    assert stats.mismatches == [], stats.mismatches
    assert stats.predictions_right == stats.requests == len(turns)
    assert stats.cached_tokens > 0, "the workload should hit the cache"
    assert fleet.removed_blocks > removed_before, "eviction should run"
    assert min(stats.per_replica.values()) > 0, "every replica served"


def test_routing_by_the_index_beats_round_robin(fleet: Fleet) -> None:
    openings, turns = multi_turn_workload(
        seed=3, conversations=6, turns=4, system_prompts=2, system_len=40, user_len=(8, 20)
    )
    rates = {}
    for policy in ("round_robin", "routed"):
        fleet.flush()
        rates[policy] = fleet.run(openings, turns, policy, MAX_NEW).hit_rate
    assert rates["routed"] > rates["round_robin"], rates


# ---- NVIDIA Dynamo's indexer, fed the same streams ----


def dynamo_python() -> str | None:
    """A Python with ``ai-dynamo-runtime``: this one, or ``FERROLM_DYNAMO_PYTHON``."""
    if importlib.util.find_spec("dynamo") is not None and importlib.util.find_spec("dynamo.indexer") is not None:
        return sys.executable
    other = os.environ.get("FERROLM_DYNAMO_PYTHON")
    return other if other and shutil.which(other) else None


@contextlib.contextmanager
def dynamo_indexer(python: str) -> Iterator[str]:
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"ferrolm-dynamo-indexer-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "dynamo.indexer", "--port", str(port), "--threads", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the Dynamo indexer exited: {log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=60)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
        log.unlink(missing_ok=True)


def test_dynamos_indexer_predicts_every_reported_cache_hit(fleet: Fleet) -> None:
    python = dynamo_python()
    if python is None:
        pytest.skip(
            "ai-dynamo-runtime is not installed here (pip install ai-dynamo-runtime, or point "
            "FERROLM_DYNAMO_PYTHON at a Python that has it); the same check runs above with ferrolm's index"
        )
    fleet.flush()
    openings, turns = multi_turn_workload(
        seed=11, conversations=6, turns=4, system_prompts=2, system_len=40, user_len=(8, 20)
    )  # Dynamo's /query takes no cache_salt
    removed_before = fleet.removed_blocks
    ids = {r.name: i + 1 for i, r in enumerate(fleet.replicas)}
    with dynamo_indexer(python) as url, httpx.Client(base_url=url, timeout=30) as dynamo:
        for r in fleet.replicas:
            dynamo.post(
                "/register",
                json={
                    "instance_id": ids[r.name],
                    "endpoint": r.endpoint,
                    "model_name": "tiny",
                    "block_size": BLOCK,
                    "replay_endpoint": r.replay_endpoint,
                },
            ).raise_for_status()

        def dynamo_overlap(prompt: list[int]) -> dict[str, int]:
            scores = dynamo.post("/query", json={"token_ids": prompt, "model_name": "tiny"}).json()["scores"]
            return {r.name: sum(scores.get(str(ids[r.name]), {}).values()) for r in fleet.replicas}

        def settled(read, want):
            last = {}

            def agrees() -> bool:
                nonlocal last
                last = read()
                return last == want

            with contextlib.suppress(AssertionError):
                wait_until(agrees, timeout=30)
            return last

        history = [list(o) for o in openings]
        hits = 0
        for i, turn in enumerate(turns):
            prompt = history[turn.conversation] + turn.user
            usable = (len(prompt) - 1) // BLOCK * BLOCK
            ours = {r.name: fleet.index.overlap(r.name, prompt, turn.cache_salt) for r in fleet.replicas}
            # Dynamo follows the same streams on its own schedule: give it until it agrees
            # with ferrolm's index (which is complete: it counted the replicas' batches)
            got = settled(lambda: dynamo_overlap(prompt), ours)
            assert got == ours, (i, got, ours)
            replica = fleet.replicas[i % len(fleet.replicas)]
            output, cached = fleet.send(replica, prompt, turn.cache_salt, MAX_NEW)
            assert cached // BLOCK * BLOCK == min(got[replica.name], usable), (i, replica.name, cached, got)
            fleet.sync(replica)
            history[turn.conversation] = prompt + output
            hits += min(got[replica.name], usable)
        assert hits > 0 and fleet.removed_blocks > removed_before, "the workload hits the cache and evicts"
