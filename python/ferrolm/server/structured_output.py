"""Where structured output (regex, JSON Schema, ``response_format``, EBNF, vLLM's
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, and
llama.cpp's ``grammar``) meets the HTTP API. Grammars (``ebnf``, ``guided_grammar``,
``grammar``) are GBNF, llama.cpp's notation, which is also the EBNF xgrammar reads. The request
models accept the fields; each maps to a ``SamplingParams`` field, and the engine compiles
the grammar. A field that ``SamplingParams`` does not have (yet) is refused with a 400
naming it, so a client never gets unconstrained text by surprise. ``"strict": true`` in
``response_format.json_schema`` asks for OpenAI's strict mode (``json_schema_strict``:
objects without ``additionalProperties`` get only their declared members)."""

from __future__ import annotations

from typing import Any

from ferrolm.sampling_params import SamplingParams
from ferrolm.server.errors import bad_request
from ferrolm.server.protocol import ResponseFormat


def _supported() -> set[str]:
    return set(SamplingParams.__dataclass_fields__)


def constraint_kwargs(
    *,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    ebnf: str | None = None,
    response_format: ResponseFormat | None = None,
    guided_json: str | dict[str, Any] | None = None,
    guided_regex: str | None = None,
    guided_choice: list[str] | None = None,
    guided_grammar: str | None = None,
    grammar: str | None = None,
    prefix: str = "",
) -> tuple[dict[str, Any], dict[str, str]]:
    """``SamplingParams`` keyword arguments for the constraint a request asks for (at most
    one), and the body field it came from by ``SamplingParams`` field (to name it when
    the grammar does not compile); ``prefix`` is where the fields sit in the body
    (``sampling_params.``)."""
    asked: list[tuple[str, str, Any]] = []  # (SamplingParams field, body field, value)
    strict: bool | None = None  # response_format.json_schema.strict
    if regex is not None:
        asked.append(("regex", f"{prefix}regex", regex))
    if json_schema is not None:
        asked.append(("json_schema", f"{prefix}json_schema", json_schema))
    if ebnf is not None:
        asked.append(("ebnf", f"{prefix}ebnf", ebnf))
    if guided_json is not None:
        asked.append(("json_schema", f"{prefix}guided_json", guided_json))
    if guided_regex is not None:
        asked.append(("regex", f"{prefix}guided_regex", guided_regex))
    if guided_choice is not None:
        asked.append(("choice", f"{prefix}guided_choice", list(guided_choice)))
    if guided_grammar is not None:
        asked.append(("ebnf", f"{prefix}guided_grammar", guided_grammar))
    if grammar is not None:
        asked.append(("ebnf", f"{prefix}grammar", grammar))
    if response_format is not None and response_format.type == "json_object":
        asked.append(("json_object", "response_format", True))
    elif response_format is not None and response_format.type == "json_schema":
        spec = response_format.json_schema or {}
        if not isinstance(spec.get("schema"), dict):
            raise bad_request("response_format.json_schema.schema: a JSON Schema object is required",
                              "response_format.json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("response_format.json_schema.strict: must be a boolean",
                              "response_format.json_schema.strict")
        asked.append(("json_schema", "response_format", spec["schema"]))
    if len(asked) > 1:
        given = [body for _, body, _ in asked]
        raise bad_request(f"{given[1]}: only one of {', '.join(given)} may be given", given[1])
    supported = _supported()
    for field, body_field, _ in asked:
        if field not in supported:
            raise bad_request(f"{body_field}: structured output is not supported yet", body_field)
    names = {field: body for field, body, _ in asked}
    for _, body, _ in asked:
        # a compile error names the constraint engine's part at fault (a schema's pattern is
        # a "regex", any size limit the "grammar"): to the client it is the field it sent
        names |= {field: body for field in COMPILE_ERROR_FIELDS}
    kwargs = {field: value for field, _, value in asked}
    if strict:
        # OpenAI's strict mode: objects without additionalProperties get only their members
        kwargs["json_schema_strict"] = True
    return kwargs, names


# the fields the constraint engine's compile errors name (crates/ferrolm-py/src/constraint.rs)
COMPILE_ERROR_FIELDS = ("grammar", "regex", "json_schema", "choice", "json_object", "ebnf")
