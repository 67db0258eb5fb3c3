"""One engine configuration: the binding, ``ferrolm.Engine`` and the server's arguments
share their defaults."""

from __future__ import annotations

import inspect

from ferrolm import _core
from ferrolm.engine import Engine
from ferrolm.server.args import ServerArgs


def test_the_defaults_agree_everywhere() -> None:
    core = inspect.signature(_core.Engine).parameters
    python = inspect.signature(Engine).parameters
    server = ServerArgs()
    for core_name, server_value in [
        ("kv_capacity", server.max_total_tokens),
        ("max_running_requests", server.max_running_requests),
        ("max_prefill_tokens", server.chunked_prefill_size),
    ]:
        assert core[core_name].default == python[core_name].default == server_value, core_name
