"""The API side's view of the engine process: an ``n`` that can never fit is a 400, a
frozen engine turns /health and its requests to 503 until it answers again, and a dead
engine's requests get 503, streamed or not."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any
import httpx
from ferrolm.server.testing import RunningServer, engine_pid, running_server, wait_until


LONG = {"prompt": "a long one", "max_tokens": 3000, "ignore_eos": True}


def test_n_beyond_what_the_server_can_ever_hold_is_400_naming_n() -> None:
    with running_server("--max-running-requests", "2", "--max-queued-requests", "1") as server:
        url = f"{server.url}/v1/completions"
        too_many = httpx.post(url, json={"prompt": "x", "max_tokens": 1, "n": 4}, timeout=60)
        assert too_many.status_code == 400, too_many.text
        error = too_many.json()["error"]
        assert error["param"] == "n" and error["type"] == "invalid_request_error"
        assert "4" in error["message"] and "3" in error["message"]
        # several prompts: their samples together count
        two_prompts = httpx.post(url, json={"prompt": ["x", "y"], "max_tokens": 1, "n": 2}, timeout=60)
        assert two_prompts.status_code == 400, two_prompts.text
        assert two_prompts.json()["error"]["param"] == "n"
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "n": 5})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "n", chat.text
        # exactly what it holds is served (the samples queue, they need not run together)
        fits = httpx.post(url, json={"prompt": "x", "max_tokens": 2, "n": 3}, timeout=60)
        assert fits.status_code == 200, fits.text
        assert len(fits.json()["choices"]) == 3
        # nothing was left behind by the refusals
        load = httpx.get(f"{server.url}/server_info").json()["load"]
        assert load["running"] == 0 and load["waiting"] == 0


def _post(server: RunningServer, body: dict[str, Any], out: dict[str, Any], key: str) -> threading.Thread:
    def run() -> None:
        out[key] = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)

    t = threading.Thread(target=run)
    t.start()
    return t


def _stream(server: RunningServer, body: dict[str, Any], events: list[str]) -> threading.Thread:
    def run() -> None:
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    t = threading.Thread(target=run)
    t.start()
    return t


def _running(server: RunningServer) -> int:
    load = httpx.get(f"{server.url}/server_info", timeout=10).json()["load"]
    return -1 if load is None else int(load["running"])


def _stream_error(events: list[str]) -> dict[str, Any]:
    assert events and events[-1] == "data: [DONE]", events[-3:]
    errors = [json.loads(e[6:])["error"] for e in events[:-1] if "error" in json.loads(e[6:])]
    assert len(errors) == 1, events[-3:]
    return errors[0]


def test_a_frozen_engine_is_503_until_it_answers_again() -> None:
    with running_server("--engine-heartbeat-timeout", "3") as server:
        engine = engine_pid(server)
        out: dict[str, Any] = {}
        events: list[str] = []
        waiter = _post(server, LONG, out, "waiting")
        streamer = _stream(server, LONG, events)
        try:
            wait_until(lambda: _running(server) == 2 and len(events) > 2, timeout=60)
            os.kill(engine, signal.SIGSTOP)
            # the heartbeat is missed: unhealthy, and what waited on the engine is answered
            wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10).status_code == 503, timeout=60)
            health = httpx.get(f"{server.url}/health", timeout=10).json()
            assert health["status"] == "unavailable" and "not answered" in health["reason"]
            waiter.join(timeout=60)
            streamer.join(timeout=60)
            assert not waiter.is_alive() and not streamer.is_alive(), "requests must not hang on a frozen engine"
            assert out["waiting"].status_code == 503, out["waiting"].text
            assert out["waiting"].json()["error"]["type"] == "service_unavailable_error"
            assert _stream_error(events)["type"] == "service_unavailable_error"
            # new requests are refused while it is frozen, not queued behind it
            refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=30)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["type"] == "service_unavailable_error"
        finally:
            os.kill(engine, signal.SIGCONT)
        # it answers again: healthy, serving, and the failed requests were aborted there
        wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10).status_code == 200, timeout=60)
        again = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert again.status_code == 200, again.text
        wait_until(lambda: _running(server) == 0, timeout=60)
        assert server.process.poll() is None


def test_a_dead_engine_fails_streamed_and_plain_requests_with_503() -> None:
    with running_server() as server:
        out: dict[str, Any] = {}
        events: list[str] = []
        waiter = _post(server, LONG, out, "plain")
        streamer = _stream(server, LONG, events)
        wait_until(lambda: _running(server) == 2 and len(events) > 2, timeout=60)
        os.kill(engine_pid(server), signal.SIGKILL)
        waiter.join(timeout=60)
        streamer.join(timeout=60)
        assert not waiter.is_alive() and not streamer.is_alive()
        assert out["plain"].status_code == 503, out["plain"].text
        error = out["plain"].json()["error"]
        assert error["type"] == "service_unavailable_error" and "exited" in error["message"]
        assert _stream_error(events)["type"] == "service_unavailable_error"
        server.process.wait(timeout=30)  # and the server does not linger half-alive
