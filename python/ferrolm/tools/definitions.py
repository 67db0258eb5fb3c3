"""The functions a request offers (OpenAI's ``tools``) and which it may or must call
(``tool_choice``), checked; and the JSON Schemas a constrained call is generated under.

Field names in errors are the request body's, dotted as the server names every field
(``tools.1.function.parameters``), so the HTTP API and ``Engine.chat`` say the same."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferrolm.errors import InvalidInputError

# OpenAI's rule for function names
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
# "parameters" omitted: OpenAI's function with an empty parameter list
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One function a request offers; ``index`` is its place in ``tools``."""

    index: int
    name: str
    parameters: dict[str, Any]
    description: str | None = None
    strict: bool = False

    @property
    def parameters_field(self) -> str:
        return f"tools.{self.index}.function.parameters"

    def as_template_tool(self) -> dict[str, Any]:
        """OpenAI's (and Hugging Face chat templates') form of the tool."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``mode`` is none, auto or required; ``function`` names the one function that must
    be called (OpenAI's named choice; mode is then required)."""

    mode: str
    function: str | None = None

    @property
    def calls_forced(self) -> bool:
        return self.mode == "required"


def parse_tools(raw: Sequence[Mapping[str, Any]] | None) -> list[FunctionTool]:
    """OpenAI's ``tools`` (``[{"type": "function", "function": {"name", "description",
    "parameters", "strict"}}]``) as ``FunctionTool``s; raises ``InvalidInputError`` naming
    the field at fault."""
    if raw is None:
        return []
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
        raise InvalidInputError("tools: give a non-empty list of tools, or none", "tools")
    tools: list[FunctionTool] = []
    for i, entry in enumerate(raw):
        field = f"tools.{i}"
        if not isinstance(entry, Mapping) or entry.get("type") != "function":
            raise InvalidInputError(f'{field}.type: only "function" tools are supported', f"{field}.type")
        function = entry.get("function")
        if not isinstance(function, Mapping):
            raise InvalidInputError(f"{field}.function: a function definition is required", f"{field}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInputError(f"{field}.function.name: {name!r} is not a function name (1 to 64 letters, "
                                    "digits, _ or -)", f"{field}.function.name")
        if any(t.name == name for t in tools):
            raise InvalidInputError(f"{field}.function.name: {name!r} is defined twice", f"{field}.function.name")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = NO_PARAMETERS
        elif not isinstance(parameters, Mapping):
            raise InvalidInputError(f"{field}.function.parameters: a JSON Schema object is required",
                                    f"{field}.function.parameters")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidInputError(f"{field}.function.description: must be a string", f"{field}.function.description")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidInputError(f"{field}.function.strict: must be a boolean", f"{field}.function.strict")
        tools.append(FunctionTool(i, name, dict(parameters), description, bool(strict)))
    return tools


def parse_tool_choice(raw: Any, tools: Sequence[FunctionTool]) -> ToolChoice:
    """``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function":
    {"name": ...}}``; absent, ``auto`` when there are tools, else ``none`` (as OpenAI).
    A choice without tools, or naming a function that is not among them, is refused."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if not tools:
        raise InvalidInputError("tool_choice: only allowed when tools are given", "tool_choice")
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise InvalidInputError(f"tool_choice: {raw!r} is not one of {', '.join(CHOICES)} or a named function",
                                    "tool_choice")
        return ToolChoice(raw)
    function = raw.get("function") if isinstance(raw, Mapping) and raw.get("type") == "function" else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise InvalidInputError('tool_choice: give "none", "auto", "required" or {"type": "function", '
                                '"function": {"name": ...}}', "tool_choice")
    if not any(t.name == name for t in tools):
        raise InvalidInputError(f"tool_choice: function {name!r} is not among the tools", "tool_choice")
    return ToolChoice("required", name)


def callable_tools(tools: Sequence[FunctionTool], choice: ToolChoice) -> list[FunctionTool]:
    """The tools a constrained call may name."""
    if choice.function is not None:
        return [t for t in tools if t.name == choice.function]
    return list(tools)


def call_object_schema(tools: Sequence[FunctionTool], arguments_key: str = "arguments") -> dict[str, Any]:
    """One call: ``{"name": <one of the tools>, "<arguments_key>": <its parameters>}``,
    name first (the engine writes declared members in schema order, so the name is known
    before the arguments stream)."""
    branches = [_call_branch(t, arguments_key, f"#/anyOf/{k}/properties/{arguments_key}" if len(tools) > 1
                             else f"#/properties/{arguments_key}")
                for k, t in enumerate(tools)]
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return _with_lifted_dialect(schema, tools)


def call_array_schema(tools: Sequence[FunctionTool], arguments_key: str = "arguments", *,
                      parallel: bool = True) -> dict[str, Any]:
    """A JSON array of calls (Mistral's format): at least one; one at most when parallel
    calls are off."""
    prefix = "#/items/anyOf/{k}" if len(tools) > 1 else "#/items"
    branches = [_call_branch(t, arguments_key, f"{prefix.format(k=k)}/properties/{arguments_key}")
                for k, t in enumerate(tools)]
    items = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return _with_lifted_dialect(schema, tools)


def schema_parts(tools: Sequence[FunctionTool]) -> dict[str, dict[str, Any]]:
    """Each tool's parameters by the field they came from: the engine names the one at
    fault when the assembled schema does not compile."""
    return {t.parameters_field: t.parameters for t in tools}


def all_strict(tools: Sequence[FunctionTool]) -> bool:
    """OpenAI's strict mode for the assembled schema: only when every function asks for it
    (the engine's option applies to the whole schema)."""
    return bool(tools) and all(t.strict for t in tools)


def _call_branch(tool: FunctionTool, arguments_key: str, pointer: str) -> dict[str, Any]:
    parameters = _rebased(tool.parameters, pointer)
    parameters.pop("$schema", None)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _with_lifted_dialect(schema: dict[str, Any], tools: Sequence[FunctionTool]) -> dict[str, Any]:
    """A ``$schema`` (draft) the functions' parameters declare moves to the root, where
    JSON Schema reads it; when they declare different drafts, each part stays 2020-12."""
    dialects = {t.parameters["$schema"] for t in tools if isinstance(t.parameters.get("$schema"), str)}
    if len(dialects) == 1:
        return {"$schema": dialects.pop(), **schema}
    return schema


# keywords whose values are data, not schemas: a "$ref" key inside them is not a reference
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
# keywords whose values map names (of properties, definitions) to schemas
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                        "dependencies"})


def _rebased(parameters: Mapping[str, Any], pointer: str) -> dict[str, Any]:
    """``parameters`` moved to ``pointer`` inside a larger schema: references to its own
    root (``#``, ``#/$defs/x``, ``#/definitions/x``) are rewritten to point there."""

    def walk(node: Any, names: bool = False) -> Any:
        if isinstance(node, dict):
            if names:  # {name: schema}: the keys are not keywords
                return {key: walk(value) for key, value in node.items()}
            out = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                    out[key] = pointer + value[1:]
                elif key in _DATA_KEYWORDS:
                    out[key] = copy.deepcopy(value)
                else:
                    out[key] = walk(value, key in _NAME_MAPS)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    rebased = walk(dict(parameters))
    assert isinstance(rebased, dict)
    return rebased
