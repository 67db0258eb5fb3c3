"""Chat messages as Hugging Face chat templates expect them: an assistant's ``tool_calls``
with their ``arguments`` as a mapping (OpenAI sends them as JSON text), ``tool`` messages
with their ``tool_call_id``, and text parts joined."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ferrolm.errors import InvalidInputError


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style messages (``role``, ``content`` as text or text parts, ``name``,
    ``tool_call_id``, ``tool_calls``) for ``apply_chat_template``; raises
    ``InvalidInputError`` naming ``messages.i...`` for arguments that are not JSON."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        message: dict[str, Any] = {"role": m["role"], "content": content or ""}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if m.get(key) is not None:
                message[key] = m[key]
        calls = m.get("tool_calls")
        if calls:
            message["tool_calls"] = [_template_call(call, f"messages.{i}.tool_calls.{j}") for j, call in enumerate(calls)]
        out.append(message)
    return out


def _template_call(call: Mapping[str, Any], field: str) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise InvalidInputError(f"{field}.function.arguments: not JSON: {arguments[:60]!r}",
                                    f"{field}.function.arguments") from None
    out: dict[str, Any] = {"type": "function", "function": {"name": function.get("name"), "arguments": arguments}}
    if call.get("id") is not None:
        out["id"] = call["id"]
    return out
