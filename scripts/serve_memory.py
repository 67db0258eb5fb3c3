"""Resident memory of ``ferrolm serve`` on a GGUF file, beside its KV pool.

Starts ``python -m ferrolm.cli serve --model FILE`` (more serve flags after ``--``), reads
its RSS from ``/proc/PID/status`` once ``/health`` answers and after two bursts of 16
concurrent completions (prompts of about 300 tokens sharing a prefix, 64 then 32 new
tokens), and prints each reading beside the file's size and issue 27's floor (1.3x the
file beside the pool).

The pool's resident part: the pages of the slots in use (``ferrolm:kv_used_tokens``; the
pool becomes resident as slots are first written, slots are handed out in order and the
prefix cache keeps them), or all of it with ``--pool-prefaulted`` (a build that writes the
pool at construction, as ferrolm did before). Linux only.

    python scripts/serve_memory.py FILE [--port 18123] [--pool-prefaulted] [-- SERVE FLAGS]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

PAGE = 4096
PREFIX = "The history of the city of Rome, told from its founding. " * 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=18123)
    parser.add_argument("--pool-prefaulted", action="store_true")
    parser.add_argument("serve_flags", nargs="*")
    args = parser.parse_args()

    from ferrolm.model.loader import load_model

    config = load_model(args.model, with_weights=False).config
    command = [sys.executable, "-m", "ferrolm.cli", "serve", "--model", args.model, "--port", str(args.port)]
    server = subprocess.Popen([*command, *args.serve_flags], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    atexit.register(lambda: (server.terminate(), server.wait(timeout=30)))
    base = f"http://127.0.0.1:{args.port}"

    def get(path: str) -> bytes:
        with urllib.request.urlopen(base + path, timeout=5) as response:
            return bytes(response.read())

    started = time.monotonic()
    while True:
        try:
            get("/health")
            break
        except OSError:
            if server.poll() is not None:
                sys.exit(f"the server exited with {server.returncode}")
            time.sleep(0.5)
    loaded_s = time.monotonic() - started

    slots = int(json.loads(get("/get_model_info"))["kv_capacity"])
    slot_bytes = config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2  # f16 k and v
    pool = slots * slot_bytes
    size = os.path.getsize(args.model)
    print(
        f"loaded in {loaded_s:.1f} s; {config.num_layers} layers, {slots} slots: pool {pool / 1e6:.1f} MB; "
        f"file {size / 1e6:.1f} MB, 1.3x the file = {1.3 * size / 1e6:.1f} MB beside the pool"
    )

    def reading(label: str) -> None:
        time.sleep(1.0)  # the loop's idle trim comes 0.25 s after its last step
        status = {}
        with open(f"/proc/{server.pid}/status") as f:
            for line in f:
                key, value = line.split(":", 1)
                if key in ("VmRSS", "VmHWM"):
                    status[key] = int(value.split()[0]) * 1024
        metrics = get("/metrics").decode()
        used = int(
            float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("ferrolm:kv_used_tokens")))
        )
        # each layer's k and v buffer also has its first page written (the allocator's header)
        resident = pool if args.pool_prefaulted else used * slot_bytes + 2 * config.num_layers * PAGE
        beside = status["VmRSS"] - resident
        print(
            f"{label:30s} RSS {status['VmRSS'] / 1e6:7.1f} MB; pool resident {resident / 1e6:6.1f} MB "
            f"({used} slots in use); beside the pool {beside / 1e6:6.1f} MB = {beside / size:.2f}x the file; "
            f"peak {status['VmHWM'] / 1e6:7.1f} MB",
            flush=True,
        )

    def burst(first: int, new_tokens: int) -> None:
        def complete(i: int) -> None:
            body: dict[str, Any] = {
                "prompt": f"{PREFIX} Part {i}:",
                "max_tokens": new_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            request = urllib.request.Request(
                base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()

        threads = [threading.Thread(target=complete, args=(first + i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    reading("loaded")
    burst(0, 64)
    reading("after 16 concurrent requests")
    burst(100, 32)
    reading("after 16 more")


if __name__ == "__main__":
    main()
