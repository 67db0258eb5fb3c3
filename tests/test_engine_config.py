"""One engine configuration: the core's ``EngineConfig`` defines the defaults; the binding
takes them for what is not given, and ``ferrolm.Engine``, the server's arguments and the
CLI help read them from there. A bad setting is refused naming its field."""

from __future__ import annotations

import argparse
import inspect

import pytest
from ferrolm import _core
from ferrolm.engine import Engine
from ferrolm.errors import InvalidInputError
from ferrolm.server.args import ServerArgs, add_serve_arguments

DEFAULTS = _core.EngineConfig.defaults()


def test_the_engine_and_the_server_show_the_cores_defaults() -> None:
    python = inspect.signature(Engine).parameters
    server = ServerArgs()
    for name, server_value in [
        ("kv_capacity", server.max_total_tokens),
        ("max_running_requests", server.max_running_requests),
        ("max_prefill_tokens", server.chunked_prefill_size),
        ("schedule_policy", server.schedule_policy),
        ("eviction_policy", server.radix_eviction_policy),
        ("enable_prefix_cache", not server.disable_radix_cache),
        ("seed", server.seed),
        ("kv_event_block_size", server.page_size),
    ]:
        assert python[name].default == server_value == getattr(DEFAULTS, name), name
    help_text = argparse.ArgumentParser()
    add_serve_arguments(help_text)
    assert f"(default {DEFAULTS.max_running_requests})" in help_text.format_help()


def test_the_binding_takes_the_cores_defaults_for_what_is_not_given() -> None:
    vocabulary = Engine("tiny", kv_capacity=64).vocabulary
    core = _core.Engine(vocabulary)
    assert core.kv_capacity == DEFAULTS.kv_capacity
    assert core.kv_event_block_size == DEFAULTS.kv_event_block_size
    assert not core.kv_events_enabled
    assert _core.Engine(vocabulary, kv_capacity=100).kv_capacity == 100


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"kv_capacity": 0}, "kv_capacity"),
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"max_prefill_tokens": 0}, "max_prefill_tokens"),
        ({"new_token_ratio": 2.0}, "new_token_ratio"),
        ({"max_context": 0}, "max_context"),
        ({"schedule_policy": "lifo"}, "schedule_policy"),
        ({"eviction_policy": "random"}, "eviction_policy"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(setting: dict, field: str) -> None:
    vocabulary = Engine("tiny", kv_capacity=64).vocabulary
    with pytest.raises(InvalidInputError) as e:
        _core.Engine(vocabulary, **setting)
    assert e.value.field == field
    assert field in str(e.value)
