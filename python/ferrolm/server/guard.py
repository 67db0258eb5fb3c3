"""What every request passes before a route sees it, as plain ASGI middleware (Starlette's
BaseHTTPMiddleware would buffer and hide client disconnects from streaming responses):

- a POST must say its body is JSON (``Content-Type: application/json``, charset UTF-8 if
  named), else 415. A web page can send a cross-origin POST without asking the server
  first only as a "simple request": a form's content types (``text/plain``,
  ``application/x-www-form-urlencoded``, ``multipart/form-data``) or no body and no type
  at all. Requiring JSON on every POST, bodyless ``/flush_cache`` included, means a page
  in a browser cannot drive the API (abort everything, flush the cache, generate) when no
  API key is set; the browser's preflight for a JSON POST finds no CORS grant here.
- a body longer than ``--max-request-bytes`` is refused with 413 before it is parsed:
  from ``Content-Length`` when given, else while it streams in (chunked bodies).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferrolm.server.errors import send_error

JSON_TYPE = b"application/json"
UTF8 = {b"utf-8", b"utf8"}


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated header counts
        if scope["method"] == "POST" and not is_json(headers.get(b"content-type")):
            await send_error(send, 415, "a POST body must be JSON: send 'Content-Type: application/json'",
                             code="unsupported_media_type")
            return
        length = headers.get(b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        # read the body here, counting, so that an oversized one never reaches the parser
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone before it finished sending
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send: Send) -> None:
        await send_error(send, 413, f"the request body is larger than {self.max_body_bytes} bytes "
                                    "(the server's --max-request-bytes)", code="request_too_large")


def is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media_type, *params = content_type.split(b";")
    if media_type.strip().lower() != JSON_TYPE:
        return False
    for param in params:
        name, _, value = param.partition(b"=")
        if name.strip().lower() == b"charset" and value.strip().strip(b'"').lower() not in UTF8:
            return False  # JSON is UTF-8 (RFC 8259); the body is parsed as such
    return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """The whole body as one message, then the connection's own messages (the disconnect
    that ends a request whose client went away)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
