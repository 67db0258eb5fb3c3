"""The place where structured output (regex, JSON Schema, EBNF, ``response_format``) meets
the HTTP API. The fields are accepted by the request models; until ``SamplingParams``
has a field of the same name, a request that uses one is refused with a 400 naming it.
Once the engine grows ``regex`` / ``json_schema`` / ``ebnf``, they pass straight through."""

from __future__ import annotations

import json
from typing import Any

from ferrolm.sampling_params import SamplingParams
from ferrolm.server.errors import bad_request
from ferrolm.server.protocol import ResponseFormat

_SUPPORTED = set(SamplingParams.__dataclass_fields__)


def constraint_kwargs(
    *,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    ebnf: str | None = None,
    response_format: ResponseFormat | None = None,
    prefix: str = "",
) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the constraint a request asks for (at most
    one); ``prefix`` is where the fields sit in the body (``sampling_params.``)."""
    asked: dict[str, tuple[str, Any]] = {}  # SamplingParams field -> (body field, value)
    if regex is not None:
        asked["regex"] = (f"{prefix}regex", regex)
    if json_schema is not None:
        schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        asked["json_schema"] = (f"{prefix}json_schema", schema)
    if ebnf is not None:
        asked["ebnf"] = (f"{prefix}ebnf", ebnf)
    if response_format is not None and response_format.type != "text":
        if response_format.type == "json_object":
            schema = json.dumps({"type": "object"})
        else:
            spec = response_format.json_schema or {}
            if not isinstance(spec.get("schema"), dict):
                raise bad_request("response_format.json_schema.schema: a JSON Schema object is required",
                                  "response_format.json_schema.schema")
            schema = json.dumps(spec["schema"])
        asked["json_schema"] = ("response_format", schema)
    if len(asked) > 1:
        names = sorted(body for body, _ in asked.values())
        raise bad_request(f"{names[1]}: only one of {', '.join(names)} may be given", names[1])
    for field, (body_field, _) in asked.items():
        if field not in _SUPPORTED:
            raise bad_request(f"{body_field}: structured output is not supported yet", body_field)
    return {field: value for field, (_, value) in asked.items()}
