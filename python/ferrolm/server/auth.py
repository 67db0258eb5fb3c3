"""API-key check as plain ASGI middleware (Starlette's BaseHTTPMiddleware would buffer
and hide client disconnects from streaming responses).

The key comes from ``--api-key`` or the environment variable ``FERROLM_API_KEY`` (which,
unlike a flag, does not show in ``ps``). Clients send ``Authorization: Bearer KEY``; the
scheme name is case-insensitive (RFC 9110), the key is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from ferrolm.server.errors import send_error

OPEN_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapers carry no key


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = _digest(api_key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await send_error(send, 401, "a valid API key is required: 'Authorization: Bearer KEY'", None,
                         "invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            token = b""
        # constant time, whatever the lengths: digests of equal size are compared, so how
        # much of the key matched (or how long it is) does not show in the timing
        return hmac.compare_digest(_digest(token.strip()), self.expected)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()
