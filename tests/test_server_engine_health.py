"""The server's view of its engine: the port answers 503 while the model loads (``_core.FrontendLoading``); the engine-heartbeat watch
(``--engine-heartbeat-timeout``) turns /health and the requests to 503 while the step loop
is held, until it comes round again; and a step loop that dies fails what waits with 503,
streamed or not, and goes on up (``ferrolm serve`` exits).

Driven in-process: a real ``Engine("tiny")`` behind a real
``_core.Frontend`` with the step loop on a thread, one of whose forwards is held (as a
forward that hangs would hold it) or raises on purpose. The front end and the loop share
one process, so freezing the process from outside (SIGSTOP) would freeze the HTTP threads
too and tell nothing."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ferrolm import _core
from ferrolm.errors import CorePanicError, InvalidInputError
from ferrolm.server.args import ServerArgs
from ferrolm.server.rust_frontend import StepLoop, build_engine, serve, start_frontend
from ferrolm.server.testing import serving_in_process, wait_until

HEARTBEAT_S = 2.0
LONG = {"prompt": "a long one", "max_tokens": 3000, "ignore_eos": True}


class HeldLoop(StepLoop):
    """A step loop whose next forward, once ``hold`` is set, waits for ``release`` (as a
    forward that hangs would hold the loop), and, once ``panic`` is set, raises the core's
    panic (after which the core refuses further use), and, once ``fail`` is set, raises
    as a forward with a bug would, once."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.panic = threading.Event()
        self.fail = threading.Event()
        self.hold = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        runner = self.engine.runner
        for name in ("forward", "forward_greedy"):  # the torch runner may pick greedy tokens itself
            if hasattr(runner, name):
                setattr(runner, name, self._held(getattr(runner, name)))

    def _held(self, forward: Any) -> Any:
        def held(*args: Any, **kwargs: Any) -> Any:
            if self.panic.is_set():
                raise CorePanicError("a panic in the core, on purpose")
            if self.fail.is_set():
                self.fail.clear()
                raise ValueError("a secret internal detail")
            if self.hold.is_set():
                self.held.set()
                self.release.wait()
                self.hold.clear()
            return forward(*args, **kwargs)

        return held


def server_args(**kw: Any) -> ServerArgs:
    # FERROLM_TEST_RUNNER=torch: on the torch runner, as running_server's servers
    args = ServerArgs(port=0, max_total_tokens=8192, **kw)
    runner = os.environ.get("FERROLM_TEST_RUNNER")
    if runner:
        args.runner, args.device = runner, "cpu"
    return args


def test_the_port_answers_503_while_the_model_loads_then_serves() -> None:
    args = server_args()
    loading = _core.FrontendLoading(args.host, 0)
    url = f"http://127.0.0.1:{loading.port}"
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503, health.text
        assert health.json() == {"status": "unavailable", "reason": "the engine is starting"}
        early = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
        assert early.status_code == 503 and early.json()["error"]["type"] == "service_unavailable_error", early.text
        engine = build_engine(args)
        frontend = start_frontend(engine, args, loading)  # takes the port over
    finally:
        loading.stop()
    assert frontend.port == loading.port
    loop = StepLoop(engine, frontend)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        loop.stopping.set()
        thread.join(timeout=30)
        frontend.stop(5.0)
    with pytest.raises(InvalidInputError, match="loading"):  # a port is handed over once
        start_frontend(engine, args, loading)


def test_a_loading_port_that_is_stopped_is_free_again() -> None:
    loading = _core.FrontendLoading("127.0.0.1", 0)
    port = loading.port
    loading.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    again = _core.FrontendLoading("127.0.0.1", port)  # bindable: nothing holds it
    assert again.port == port
    again.stop()


@pytest.fixture
def served() -> Iterator[tuple[HeldLoop, str]]:
    with serving_in_process(server_args(engine_heartbeat_timeout=HEARTBEAT_S), HeldLoop) as served:
        yield served


def load(url: str) -> Any:
    return httpx.get(f"{url}/server_info", timeout=30).json()["load"]


def test_a_held_step_loop_is_503_until_it_comes_round_again(served: tuple[HeldLoop, str]) -> None:
    loop, url = served
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    out: dict[str, Any] = {}
    events: list[str] = []

    def plain() -> None:
        out["plain"] = httpx.post(f"{url}/v1/completions", json=LONG, timeout=120)

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=120) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    wait_until(lambda: load(url)["running"] == 2 and len(events) > 2, timeout=60)
    loop.hold.set()
    assert loop.held.wait(timeout=60)
    try:
        # the heartbeat is missed: unhealthy, and what waited on the loop is answered
        wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 503, timeout=60)
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["status"] == "unavailable" and "not answered" in health["reason"], health
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "requests must not hang on a held loop"
        assert out["plain"].status_code == 503, out["plain"].text
        assert out["plain"].json()["error"]["type"] == "service_unavailable_error"
        assert events[-1] == "data: [DONE]", events[-3:]
        errors = [json.loads(e[6:])["error"] for e in events[:-1] if "error" in json.loads(e[6:])]
        assert len(errors) == 1 and errors[0]["type"] == "service_unavailable_error", errors
        # new requests are refused while it is held, not queued behind it; calls answer too
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "service_unavailable_error"
        info = httpx.get(f"{url}/server_info", timeout=30).json()
        assert info["load"] is None and info["ready"] is False, info
    finally:
        loop.release.set()
    # it comes round again: healthy, serving, and the failed requests were aborted there
    wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, timeout=60)
    again = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert again.status_code == 200, again.text
    wait_until(lambda: load(url)["running"] == 0 and load(url)["waiting"] == 0, timeout=60)
    after = load(url)
    assert after["kv_used"] == after["cached_tokens"], after


def test_an_idle_loop_is_not_taken_for_a_stuck_one(served: tuple[HeldLoop, str]) -> None:
    # idle, the loop blocks in wait: that is no missed heartbeat, however long it lasts
    _, url = served
    threading.Event().wait(HEARTBEAT_S * 2)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_forward_that_raises_fails_its_step_with_500_and_the_server_goes_on(served: tuple[HeldLoop, str]) -> None:
    loop, url = served
    out: dict[str, Any] = {}
    events: list[str] = []

    def plain() -> None:  # the native route, and OpenAI's streamed
        body = {"text": LONG["prompt"], "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        out["plain"] = httpx.post(f"{url}/generate", json=body, timeout=120)

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=120) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    clients = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in clients:
        t.start()
    wait_until(lambda: load(url)["running"] == 2 and len(events) > 2, timeout=60)
    loop.fail.set()  # both run in the step that fails (once: the next step serves)
    for t in clients:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in clients)
    # the step's requests end with a 500 that names no internals (the log has them)
    assert out["plain"].status_code == 500, out["plain"].text
    assert "secret" not in out["plain"].text and "engine step failed" in out["plain"].json()["error"]["message"]
    assert events[-1] == "data: [DONE]", events[-3:]
    errors = [json.loads(e[6:])["error"] for e in events[:-1] if "error" in json.loads(e[6:])]
    assert len(errors) == 1 and "secret" not in json.dumps(errors), errors
    assert "\nferrolm:num_request_errors_total 2" in httpx.get(f"{url}/metrics", timeout=30).text
    # the loop goes on serving, and the failed requests hold no KV
    again = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert again.status_code == 200, again.text
    wait_until(lambda: load(url)["running"] == 0 and load(url)["waiting"] == 0, timeout=60)
    after = load(url)
    assert after["kv_used"] == after["cached_tokens"], after


def test_a_step_loop_that_dies_fails_streamed_and_plain_requests_with_503() -> None:
    # what ferrolm serve runs (serve: the loop, then the front end stopped): a core panic
    # ends the loop; nothing that waited on it hangs, and the panic goes on up
    args = server_args()
    engine = build_engine(args)
    loop = HeldLoop(engine, start_frontend(engine, args))
    url = f"http://127.0.0.1:{loop.frontend.port}"
    ended: dict[str, BaseException] = {}

    def run() -> None:
        try:
            serve(loop)
        except BaseException as e:
            ended["error"] = e

    server = threading.Thread(target=run, daemon=True)
    server.start()
    out: dict[str, Any] = {}
    events: list[str] = []

    def plain() -> None:
        out["plain"] = httpx.post(f"{url}/v1/completions", json=LONG, timeout=120)

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=120) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    clients = [threading.Thread(target=plain), threading.Thread(target=stream)]
    try:
        for t in clients:
            t.start()
        wait_until(lambda: load(url)["running"] == 2 and len(events) > 2, timeout=60)
        loop.panic.set()
        server.join(timeout=60)
        assert not server.is_alive() and isinstance(ended.get("error"), CorePanicError), ended
        for t in clients:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in clients), "requests must not hang on a dead step loop"
    finally:
        loop.stopping.set()
        loop.frontend.stop(5.0)
    assert out["plain"].status_code == 503, out["plain"].text
    error = out["plain"].json()["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "engine_unavailable", error
    assert events[-1] == "data: [DONE]", events[-3:]
    errors = [json.loads(e[6:])["error"] for e in events[:-1] if "error" in json.loads(e[6:])]
    assert len(errors) == 1 and errors[0]["type"] == "service_unavailable_error", errors
    with pytest.raises(httpx.TransportError):  # and the port is closed: nothing lingers half-alive
        httpx.get(f"{url}/health", timeout=10)


def test_next_plan_drains_and_schedules_in_one_call() -> None:
    # the plain loop's step: next_plan (drain + schedule) -> the runner -> commit; None
    # while the core has no work, and every request still ends as the loop serves it
    args = server_args()
    engine = build_engine(args)
    frontend = start_frontend(engine, args)
    core = engine.core
    url = f"http://127.0.0.1:{frontend.port}"
    out: dict[str, Any] = {}
    try:
        assert frontend.next_plan(core) is None
        client = threading.Thread(
            target=lambda: out.setdefault(
                "r",
                httpx.post(
                    f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 5, "ignore_eos": True}, timeout=60
                ),
            )
        )
        client.start()
        assert frontend.wait(30.0)
        steps = 0
        while (plan := frontend.next_plan(core)) is not None:
            assert len(plan) == plan.batch_size == 1
            frontend.commit(core, engine.runner.forward(plan))
            steps += 1
        client.join(timeout=60)
        assert out["r"].status_code == 200, out["r"].text
        assert out["r"].json()["usage"]["completion_tokens"] == 5
        assert steps >= 5 and not core.has_work()
    finally:
        frontend.stop(5.0)
