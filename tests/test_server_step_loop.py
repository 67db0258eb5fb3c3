"""The server's step loop (``ferrolm.step_loop`` over the Rust front end), in-process: the
loop's own timing of the forward reaches ``/metrics`` (a forward that raises:
``test_server_engine_health``)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from ferrolm.server.args import ServerArgs
from ferrolm.server.rust_frontend import StepLoop
from ferrolm.server.testing import serving_in_process


@pytest.fixture
def served() -> Iterator[tuple[StepLoop, str]]:
    with serving_in_process(ServerArgs(port=0, max_total_tokens=4096, runner="numpy")) as served:
        yield served


def series(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    [value] = re.findall(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(value)


def test_the_loops_forward_timing_is_on_metrics(served: tuple[StepLoop, str]) -> None:
    _, url = served
    assert series(url, "ferrolm:forward_seconds_count") == 0
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    assert httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200
    # a prefill step, then a decode step per further token
    assert series(url, "ferrolm:forward_seconds_count") == 5
    assert series(url, "ferrolm:forward_seconds_sum") > 0
    assert 0 < series(url, "ferrolm:forward_loop_cpu_seconds_total")
    assert series(url, 'ferrolm:forward_seconds_bucket{le="+Inf"}') == 5


def test_serve_loads_no_bench_module_fastapi_or_uvicorn() -> None:
    """``ferrolm serve`` (the Rust front end) up to the point where it would start: the
    bench modules are ``ferrolm bench``'s alone, and nothing of the Python front end's
    web stack is imported."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "import ferrolm.server.rust_frontend as rf\n"
        "def started(args):\n"
        "    print(json.dumps(sorted(sys.modules)))\n"
        "    return 0\n"
        "rf.run_server = started\n"
        "from ferrolm.cli import main\n"
        "sys.exit(main(['serve', '--port', '0']))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "ferrolm.server.args" in modules  # it got as far as serving
    loaded = [
        m for m in modules if m.split(".")[0] in ("fastapi", "uvicorn", "starlette") or m.startswith("ferrolm.bench")
    ]
    assert loaded == []
