"""Chat templates rendered by the request core (minijinja, ``_core.render_chat_template``,
which ``Tokenizer.apply_chat_template``, ``Engine.chat`` and the server all use) equal
their renderings by jinja2 as transformers configures it, stored in
``tests/data/chat_template_renderings.json``: templates in the shapes of the model
families (header ids, ``[INST]`` turns with alternation checks, ChatML with a default
system prompt, ``<start_of_turn>``, namespaces and filters), and the tiny model's and a
Llama-3-style one with tools, calls and results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ferrolm import _core
from ferrolm.errors import InvalidInputError

STORED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "chat_template_renderings.json").read_text(encoding="utf-8")
)
CASES: list[dict[str, Any]] = STORED["cases"]


def case_id(case: dict[str, Any]) -> str:
    turns = len(case["messages"])
    extra = "-tools" if "tools" in case else ""
    return f"{case['template']}-{turns}turns{extra}-{'gen' if case['add_generation_prompt'] else 'nogen'}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_templates_render_as_jinja2_rendered_them(case: dict[str, Any]) -> None:
    def render() -> str:
        return _core.render_chat_template(
            STORED["templates"][case["template"]],
            json.dumps(case["messages"]),
            bos_token=case["bos_token"],
            eos_token=case["eos_token"],
            add_generation_prompt=case["add_generation_prompt"],
            tools_json=json.dumps(case["tools"]) if "tools" in case else None,
        )

    if "raises" in case:
        # the template refuses this chat (raise_exception): the message is the template's
        with pytest.raises(InvalidInputError) as e:
            render()
        assert case["raises"] in str(e.value)
        return
    assert render() == case["text"]


def test_variables_reach_the_template_and_null_ones_stay_undefined() -> None:
    template = "{{ 'tools' if tools is defined else 'none' }} {{ flavour | default('plain') }}"
    render = _core.render_chat_template
    assert render(template, "[]", variables_json=json.dumps({"tools": None})) == "none plain"
    assert render(template, "[]", variables_json=json.dumps({"tools": [], "flavour": "x"})) == "tools x"
    # an assistant turn with only calls may have no content
    assert render("{{ messages[0].content == '' }}", json.dumps([{"role": "assistant", "content": None}])) == "True"


def test_a_template_that_does_not_compile_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="does not compile"):
        _core.render_chat_template("{% for x in %}", "[]")
