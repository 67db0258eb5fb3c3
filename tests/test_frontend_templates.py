"""The front end's chat templates (minijinja, ``_core.render_chat_template``) rendered as
jinja2 renders them (``Tokenizer.apply_chat_template``): the families' shapes, the tiny
model's own template, templates that print tools and calls, and refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tokenizers

from ferrolm import _core
from ferrolm.errors import InvalidInputError
from ferrolm.model.tokenizer import Tokenizer

TINY = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
        " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# the families' shapes, written for this test: header ids (Llama 3), [INST] turns with a
# folded system prompt and alternation checks (Llama 2 / Mistral), ChatML with a default
# system prompt (Qwen), <start_of_turn> with a renamed role and no system role (Gemma)
LLAMA3_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
INST_STYLE = """{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set system = false %}
    {% set loop_messages = messages %}
{% endif %}
{{ bos_token }}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {% if loop.first and system %}
{{ '[INST] ' + system + '\\n\\n' + message['content'].strip() + ' [/INST]' }}
        {% else %}
{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}
        {% endif %}
    {% else %}
{{ ' ' + message['content'].strip() + eos_token }}
    {% endif %}
{% endfor %}"""
CHATML_DEFAULT_SYSTEM = """{% for message in messages %}
{% if loop.first and message['role'] != 'system' %}
{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{% endif %}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{% endif %}"""
TURN_STYLE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}
{% for message in messages %}
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}
{% endfor %}
{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"""
NAMESPACE_AND_JSON = """{% set ns = namespace(count=0, last='') %}
{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}
{{ ns.count }} {{ ns.last }} {{ messages | tojson }} {{ messages[0] | tojson(indent=2) }}
{{ messages[-1].content | upper }} {{ messages | length }} {{ messages[0].content.split(' ') | join('|') }}"""

CHATS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hello there  "},
     {"role": "assistant", "content": "Hi. "}, {"role": "user", "content": "é ü \u4e2d \U0001F600 \"q\" <b>&"}],
]


def jinja2_render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    tok = Tokenizer(hf, bos_token="<s>", eos_token="</s>", chat_template=template)
    return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("template", [TINY, LLAMA3_STYLE, INST_STYLE, CHATML_DEFAULT_SYSTEM, TURN_STYLE,
                                      NAMESPACE_AND_JSON],
                         ids=["tiny", "llama3-style", "inst-style", "chatml-default-system", "turn-style",
                              "namespace-json-filters"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_templates_render_as_jinja2(template: str, chat: int, add_generation_prompt: bool) -> None:
    messages = CHATS[chat]
    try:
        expected = jinja2_render(template, messages, add_generation_prompt)
    except InvalidInputError as e:
        # the template refuses this chat (raise_exception): so must minijinja, with its message
        with pytest.raises(InvalidInputError) as info:
            _core.render_chat_template(template, json.dumps(messages), bos_token="<s>", eos_token="</s>",
                                       add_generation_prompt=add_generation_prompt)
        assert str(e).removeprefix("chat template: ") in str(info.value)
        return
    got = _core.render_chat_template(template, json.dumps(messages), bos_token="<s>", eos_token="</s>",
                                     add_generation_prompt=add_generation_prompt)
    assert got == expected


def test_the_tiny_models_template_matches(tiny: Any) -> None:
    tok = tiny.tokenizer
    messages = CHATS[1]
    got = _core.render_chat_template(tok.chat_template, json.dumps(messages), bos_token=tok.bos_token,
                                     eos_token=tok.eos_token)
    assert got == tok.apply_chat_template(messages)


def test_a_template_that_does_not_compile_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="does not compile"):
        _core.render_chat_template("{% for x in %}", "[]")


TOOLS_FOR_TEMPLATE: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast, à la carte", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 14},
                                         "ratio": {"type": "number", "default": 0.5}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CHAT: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "call_1", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Zürich", "days": 2, "ratio": 1.5}}},
        {"type": "function", "id": "call_2", "function": {"name": "ping", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 °C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    {"role": "assistant", "content": "Sunny.", "reasoning_content": "it said so"},
    {"role": "user", "content": "Thanks"},
]
# a Llama-3-style template that prints the tools and calls in its own words (written for this test)
TOOLS_IN_USER_TURN = """{{ bos_token }}{% for m in messages %}
{% if m.role == 'user' and loop.last and tools is defined %}
{{ 'Functions: ' }}{% for t in tools %}{{ t.function.name }}={{ t | tojson(indent=2) }};{% endfor %}
{% endif %}
{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.id }}] {{ c.function.name }}({{ c.function.arguments | tojson }})
{% endfor %}{% elif m.role == 'tool' %}<{{ m.tool_call_id }}>{{ m.content }}
{% else %}{{ m.role }}: {{ m.content }}{{ ' (' + m.reasoning_content + ')' if m.reasoning_content }}
{% endif %}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"""


@pytest.mark.parametrize("with_tools", [True, False])
def test_templates_render_tools_and_calls_as_jinja2(tiny: Any, with_tools: bool) -> None:
    tok = tiny.tokenizer
    tools = TOOLS_FOR_TEMPLATE if with_tools else None
    variables: dict[str, Any] = {"tools": tools} if tools else {}
    for template in (tok.chat_template, TOOLS_IN_USER_TURN):
        expected = Tokenizer(tok.hf, bos_token=tok.bos_token, eos_token=tok.eos_token,
                             chat_template=template).apply_chat_template(TOOL_CHAT, **variables)
        got = _core.render_chat_template(template, json.dumps(TOOL_CHAT), bos_token=tok.bos_token,
                                         eos_token=tok.eos_token, tools_json=json.dumps(tools) if tools else None)
        assert got == expected
