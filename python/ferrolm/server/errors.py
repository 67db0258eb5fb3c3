"""HTTP errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.
Every refusal names the field at fault in ``param`` so a client can act on it."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ferrolm.errors import InvalidInputError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
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


# pydantic names a union's member in the error location ("prompt", "list[int]", 0):
# those are not fields, the path stops before them
def from_validation_error(e: ValidationError) -> APIError:
    first = e.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    if not first["loc"] and first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return bad_request("the body must be a JSON object")
    path: list[str] = []
    for part in first["loc"]:
        if isinstance(part, int):
            path.append(str(part))
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path.append(part)
        else:
            break
    param = ".".join(path) or None
    return bad_request(f"{param}: {first['msg']}" if param else first["msg"], param)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function", "tagged"}
