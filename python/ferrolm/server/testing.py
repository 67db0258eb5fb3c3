"""Test harness: ``ferrolm serve`` in a subprocess on a free loopback port, stopped on
exit. Used by ``tests/test_server_*.py``; handy for trying the server by hand too."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 90.0  # the server imports numpy and builds the model: slow on a busy machine


@dataclass(frozen=True)
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    """Polls ``check`` until it returns something truthy (returned), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def engine_pid(server: RunningServer) -> int:
    """The process that runs the engine: the server's own (the step loop and the HTTP
    threads share it)."""
    return server.process.pid


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(
    *flags: str, api_key: str | None = None, log_path: str | None = None, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """Starts the server with ``flags`` (and ``env`` added to the environment) and waits
    until /health says ready; stops it (SIGTERM, then SIGKILL) however the block ends.
    ``api_key`` goes in through ``FERROLM_API_KEY``, as it should in production."""
    port = free_port()
    # FERROLM_TEST_RUNNER=torch runs a suite's servers on the torch runner (flags still win)
    runner = os.environ.get("FERROLM_TEST_RUNNER")
    runner_flags = ["--runner", runner, "--device", "cpu"] if runner and "--runner" not in flags else []
    cmd = [
        sys.executable,
        "-m",
        "ferrolm.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *runner_flags,
        *flags,
    ]
    environ = {k: v for k, v in os.environ.items() if k != "FERROLM_API_KEY"}
    environ.update(env or {})
    if api_key:
        environ["FERROLM_API_KEY"] = api_key
    log = open(log_path or os.devnull, "wb")
    # its own process group: whatever it started goes with it
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=environ)
    server = RunningServer(f"http://127.0.0.1:{port}", process, api_key)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(process)
        log.close()


def _wait_healthy(server: RunningServer) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode} before it was ready")
        try:
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready within {STARTUP_TIMEOUT_S} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


@contextlib.contextmanager
def serving_in_process(args: Any, loop_class: Any = None) -> Iterator[tuple[Any, str]]:
    """The server ``args`` describe, in this process: its engine, the Rust front end on a
    free port (``args.port`` 0) and the step loop (``loop_class``, by default
    ``rust_frontend.StepLoop``) on a thread; yields the loop and the base URL, and stops
    both however the block ends. For tests that reach into the loop (hold, fail or time
    its forward) while clients talk HTTP to it."""
    from ferrolm.server.args import build_engine
    from ferrolm.server.rust_frontend import StepLoop, start_frontend

    engine = build_engine(args)
    frontend = start_frontend(engine, args)
    loop = (loop_class or StepLoop)(engine, frontend)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        yield loop, f"http://127.0.0.1:{frontend.port}"
    finally:
        release = getattr(loop, "release", None)  # a loop held in its forward lets go
        if release is not None:
            release.set()
        loop.stopping.set()
        thread.join(timeout=30)
        frontend.stop(5.0)
