"""The server's life: /health says 503 until the engine is ready, a model that cannot load
ends the server, SIGTERM ends it cleanly, an ``n`` that can never fit is a 400, and
overload is answered with 429 / 503. (A step loop that dies failing its requests with 503:
test_server_engine_health.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ferrolm.server.testing import RunningServer, free_port, running_server, wait_until


def test_health_is_503_until_ready_then_200() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "ferrolm.cli", "serve", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    statuses: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (not statuses or statuses[-1] != 200):
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            except httpx.TransportError:
                assert process.poll() is None, f"the server exited ({process.returncode}) before it was ready"
                time.sleep(0.05)  # not listening yet
                continue
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.json()["status"] == "unavailable"
        assert statuses and statuses[-1] == 200, statuses
        assert set(statuses) <= {200, 503}, statuses
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # SIGTERM stops the step loop, then the front end: a clean exit
    assert process.returncode == 0, process.returncode


def test_a_model_that_cannot_load_ends_the_server(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "ferrolm.cli",
        "serve",
        "--port",
        str(free_port()),
        "--model",
        str(tmp_path / "nothing"),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("the server kept running without a model") from e
    assert done.returncode != 0
    assert b"nothing" in done.stderr + done.stdout


@pytest.fixture(scope="module")
def crowded() -> Iterator[RunningServer]:
    # room for 3 samples: 1 running, 2 queued. The queue timeout leaves a window wide enough
    # to see a waiter queued on a busy machine, and the hog below (the model's whole
    # context) outlasts it even on an idle one: with the attention kernel the tiny model
    # decodes 3000 tokens in about 3 s there
    with running_server("--max-running-requests", "1", "--max-queued-requests", "2", "--queue-timeout", "2") as s:
        yield s


def load(server: RunningServer) -> dict[str, int]:
    info: dict[str, int] = httpx.get(f"{server.url}/server_info", timeout=30).json()["load"]
    return info


def test_n_beyond_what_the_server_can_ever_hold_is_400_naming_n(crowded: RunningServer) -> None:
    url = f"{crowded.url}/v1/completions"
    too_many = httpx.post(url, json={"prompt": "x", "max_tokens": 1, "n": 4}, timeout=60)
    assert too_many.status_code == 400, too_many.text
    error = too_many.json()["error"]
    assert error["param"] == "n" and error["type"] == "invalid_request_error"
    assert "4" in error["message"] and "3" in error["message"]
    # several prompts: their samples together count
    two_prompts = httpx.post(url, json={"prompt": ["x", "y"], "max_tokens": 1, "n": 2}, timeout=60)
    assert two_prompts.status_code == 400, two_prompts.text
    assert two_prompts.json()["error"]["param"] == "n"
    chat = httpx.post(
        f"{crowded.url}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "n": 5},
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "n", chat.text
    # exactly what it holds is served (the samples queue, they need not run together)
    fits = httpx.post(url, json={"prompt": "x", "max_tokens": 2, "n": 3}, timeout=60)
    assert fits.status_code == 200, fits.text
    assert len(fits.json()["choices"]) == 3
    # nothing was left behind by the refusals
    assert (load(crowded)["running"], load(crowded)["waiting"]) == (0, 0)


def test_overload_is_429_when_full_and_503_after_waiting_too_long(crowded: RunningServer) -> None:
    server = crowded
    long = {"prompt": "hog", "max_tokens": 4000, "ignore_eos": True}
    hog = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/completions", json=long, timeout=60))
    hog.start()
    try:
        wait_until(lambda: load(server)["running"] == 1)
        waited: dict[str, httpx.Response] = {}
        waiter = threading.Thread(
            target=lambda: waited.setdefault(
                "r",
                httpx.post(
                    f"{server.url}/v1/completions", json={"prompt": "wait", "max_tokens": 2, "n": 2}, timeout=60
                ),
            )
        )
        waiter.start()
        # its second sample waits for the first to prefill: the queue holds one
        wait_until(lambda: load(server)["waiting"] == 1)
        full = httpx.post(f"{server.url}/v1/completions", json={"prompt": "one more", "max_tokens": 2})
        assert full.status_code == 429, full.text
        assert full.json()["error"]["type"] == "rate_limit_error"
        waiter.join(timeout=30)
        assert waited["r"].status_code == 503, waited["r"].text
        assert "queue" in waited["r"].json()["error"]["message"]
        assert waited["r"].json()["error"]["code"] == "queue_timeout"
    finally:
        httpx.post(f"{server.url}/abort_request", json={"abort_all": True})
        hog.join(timeout=30)
    assert not hog.is_alive()
