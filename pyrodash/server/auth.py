"""The server's API key: `check_auth` (a route dependency: 401 without the right bearer key, when the server has
one; a budget's key is an API key too), `authorized` (whether a request may see details, refusing nothing) and
`XApiKey` (Anthropic's `x-api-key` header read as the bearer key, for every check that reads one)."""

from __future__ import annotations

import hmac

from fastapi import Request

from pyrodash.server import protocol
from pyrodash.server.budget import hooks


def authorized(request: Request) -> bool:
    """Whether the request may see details (auth off, or the right bearer key), without refusing it."""
    key = request.app.state.api_key
    if key is None:
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    return ok or hooks.key_ok(request)  # a budget's key is an API key too (as in check_auth)


async def check_auth(request: Request) -> None:  # async: FastAPI runs a plain def dependency in a thread
    key = request.app.state.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise protocol.APIError(
            401,
            "Missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>').",
            type="authentication_error",
            code="missing_api_key",
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        if hooks.key_ok(request):  # a budget's key (budgets.keys) is an API key too
            return
        raise protocol.APIError(401, "Incorrect API key provided.", type="authentication_error", code="invalid_api_key")


class XApiKey:
    """ASGI middleware: a request with `x-api-key` (Anthropic's clients) and no `Authorization` header gets
    `Authorization: Bearer <that key>`, so the auth check and the budgets (which budget a key draws on) read it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            key = next((v for k, v in headers if k == b"x-api-key"), None)
            if key is not None and not any(k == b"authorization" for k, _ in headers):
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + key)]}
        await self.app(scope, receive, send)
