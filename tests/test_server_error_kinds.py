"""A finished request's error becomes an HTTP status by its kind (as the core and the
engine client set it), never by matching the message's wording."""

from __future__ import annotations

from ferrolm.engine import Delta
from ferrolm.server.engine_client import unavailable_delta
from ferrolm.server.generation import error_of, merge_deltas


def finished(kind: str | None, message: str = "something went wrong") -> Delta:
    return Delta(1, [], "", [], [], finish_reason="error", error=message, error_kind=kind)


def test_status_comes_from_the_kind_not_the_wording() -> None:
    assert error_of(finished("queue_timeout")).status == 503
    assert error_of(finished("queue_timeout")).code == "queue_timeout"
    # the old wording of a queue timeout, under another kind, is not a 503
    assert error_of(finished("sampling", "waited in the queue longer than 1 s")).status == 500
    assert error_of(finished("step_failed")).status == 500
    assert error_of(finished(None)).status == 500


def test_a_request_the_engine_cannot_finish_is_a_503() -> None:
    e = error_of(unavailable_delta(3, "the engine process exited"))
    assert (e.status, e.code) == (503, "engine_unavailable")
    assert "exited" in e.message


def test_merged_deltas_keep_the_last_ones_error_and_counts() -> None:
    a = Delta(1, [5], "a", [-0.5], [[]])
    b = Delta(1, [6], "b", [-0.25], [[]], finish_reason="error", error="late", error_kind="queue_timeout",
              prompt_tokens=7, cached_tokens=2, completion_tokens=2)
    m = merge_deltas(a, b)
    assert (m.token_ids, m.text, m.logprobs) == ([5, 6], "ab", [-0.5, -0.25])
    assert (m.finish_reason, m.error, m.error_kind) == ("error", "late", "queue_timeout")
    assert (m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (7, 2, 2)
