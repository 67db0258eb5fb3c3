"""Records the engine trace that ``crates/ferrolm-core/tests/replay.rs`` replays: the tiny
model (CPU, numpy runner) under a small KV pool and prefill budget, with requests that
arrive over several steps, share a system prompt, chunk their prefill, get retracted,
stop on a string, sample twice from one prompt, follow a JSON grammar, get aborted and
time out in the queue. Deterministic (greedy or seeded sampling), so running it again
writes the same requests and tokens (only the times differ).

    .venv/bin/python scripts/record_replay_fixture.py crates/ferrolm-core/tests/data/tiny_engine.trace.jsonl
"""

from __future__ import annotations

import sys

from ferrolm.engine import Engine
from ferrolm.sampling_params import SamplingParams

SYSTEM = "You are a careful assistant who answers in one short sentence, without any preamble. "
QUESTIONS = [
    "What does a radix tree store?",
    "Why do requests share a prefix cache?",
    "What is chunked prefill?",
    "When is a request retracted?",
    "What does the KV pool hold?",
    "Name a color.",
]
LONG = " ".join(["The scheduler admits waiting requests while the step budget allows."] * 4)


def record(path: str) -> None:
    engine = Engine(
        "tiny",
        kv_capacity=192,
        max_prefill_tokens=24,
        max_running_requests=6,
        seed=3,
        record_trace=path,
        blas_threads=1,
    )
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    engine.submit(LONG, greedy)  # longer than the budget and the fast lane: chunked
    aborted = None
    for step in range(400):
        if step < len(QUESTIONS):
            engine.submit(SYSTEM + QUESTIONS[step], greedy)  # the system prompt is a cache hit from step 2 on
        if step == 2:
            engine.submit(SYSTEM + "Say one word.", SamplingParams(max_new_tokens=30, temperature=0.0, stop=["e"]))
            aborted = engine.submit(SYSTEM + "Tell a long story.", greedy)
        if step == 3:
            # two samples of one prompt: the second waits for the first to cache it
            engine._submit(
                engine.encode(SYSTEM + "Pick a number."),
                SamplingParams(max_new_tokens=12, temperature=0.9, seed=11),
                {},
                n=2,
            )
            engine.submit("Reply in JSON.", SamplingParams(max_new_tokens=16, temperature=0.0, json_object=True))
        if step == 4:
            engine.submit("Too late.", greedy, queue_timeout=1e-9)  # expires at the next step
        if step == 9:
            assert aborted is not None and engine.abort(aborted)
        engine.step()
        if step > len(QUESTIONS) and not engine.has_work():
            break
    stats = engine.core.stats()
    print(stats, file=sys.stderr)


if __name__ == "__main__":
    record(sys.argv[1])
