"""API-key check as plain ASGI middleware (Starlette's BaseHTTPMiddleware would buffer
and hide client disconnects from streaming responses)."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from ferrolm.server.errors import error_envelope

OPEN_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapers carry no key


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_envelope(401, "a valid API key is required: 'Authorization: Bearer KEY'",
                                         None, "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        # constant time: how much of the key matched must not show in the timing
        return hmac.compare_digest(given, self.expected)
