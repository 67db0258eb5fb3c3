"""HTTP errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.
Every refusal names the field at fault in ``param`` so a client can act on it."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.types import Send

from ferrolm.errors import InvalidInputError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.envelope(), status_code=self.status)


def error_envelope(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code if code is not None else status}}


async def send_error(send: Send, status: int, message: str, param: str | None = None, code: str | None = None,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """An error response in the envelope, straight from ASGI middleware."""
    body = json.dumps(error_envelope(status, message, param, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def from_invalid_input(e: InvalidInputError, field_names: dict[str, str] | None = None) -> APIError:
    """The core's refusal as a 400, with the core's field renamed to the API's
    (``max_new_tokens`` is ``max_tokens`` in OpenAI's API, ``input_ids`` the prompt...)."""
    param = e.field
    if param is not None and field_names:
        param = field_names.get(param, param)
    message = str(e)
    if e.field and param != e.field and message.startswith(f"{e.field}:"):
        message = f"{param}:{message[len(e.field) + 1:]}"
    return bad_request(message, param)


def from_validation_error(e: ValidationError, model: type[BaseModel] | None = None) -> APIError:
    """The first fault pydantic found, as a 400 whose ``param`` is the field's dotted path
    in the body (``messages.0.content``); an unknown field is named as sent."""
    from ferrolm.server.protocol import IGNORED_FIELDS, UNSUPPORTED_FIELDS

    errors = e.errors(include_url=False)
    first = errors[0]
    if first["loc"]:
        # a union reports one error per member ("prompt" as str, as list[int]...): the
        # deepest one under the same field says most (an id out of range, not "not a string")
        same_field = [err for err in errors if err["loc"][:1] == first["loc"][:1]]
        first = max(same_field, key=lambda err: len(err["loc"]))
    if first["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    if not first["loc"] and first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return bad_request("the body must be a JSON object")
    if first["type"] == "extra_forbidden" and first["loc"]:
        name = str(first["loc"][-1])
        unknown = ".".join([*_field_path(first["loc"][:-1], model, trailing_index=True), name])
        reason = UNSUPPORTED_FIELDS.get(name)
        if reason is None:
            known = ", ".join(sorted(_fields_at(first["loc"][:-1], model) - set(IGNORED_FIELDS)))
            reason = f"unknown field (the fields here: {known})" if known else "unknown field"
        return bad_request(f"{unknown}: {reason}", unknown)
    param = ".".join(_field_path(first["loc"], model)) or None
    return bad_request(f"{param}: {first['msg']}" if param else first["msg"], param)


def _field_path(loc: tuple[int | str, ...], model: type[BaseModel] | None, trailing_index: bool = False) -> list[str]:
    """The part of pydantic's error location that names fields of the body: it stops at a
    free-form dict's key
    (``logit_bias``, ``json_schema``), skipping union tags; a trailing list index is dropped (``stop_token_ids``,
    not ``stop_token_ids.3``) while one before a field stays (``messages.0.role``)."""
    path: list[str] = []
    current = model
    for part in loc:
        if isinstance(part, int):
            path.append(str(part))
            continue
        if current is not None and part not in current.model_fields and _is_union_tag(part):
            continue  # which member of a union pydantic tried: not a field
        if current is None or part not in current.model_fields:
            break
        path.append(part)
        current = _nested_model(current.model_fields[part].annotation)
    while path and path[-1].isdigit() and not trailing_index:
        path.pop()
    return path


# how pydantic names the member of a union it tried ("str", "list[TextPart]",
# "function-after[...]")
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function", "tagged"}


def _is_union_tag(part: str) -> bool:
    return not part.isidentifier() or part in _TYPE_TAGS


def _fields_at(loc: tuple[int | str, ...], model: type[BaseModel] | None) -> set[str]:
    current = model
    for part in loc:
        if isinstance(part, int) or current is not None and part not in current.model_fields and _is_union_tag(part):
            continue
        if current is None or part not in current.model_fields:
            return set()
        current = _nested_model(current.model_fields[part].annotation)
    return set(current.model_fields) if current is not None else set()


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The request model inside a field's type (``list[ChatMessage] | None`` -> ChatMessage)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, (types.UnionType, types.GenericAlias)) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _nested_model(arg)
            if found is not None:
                return found
    return None
