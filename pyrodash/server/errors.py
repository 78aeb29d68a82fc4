"""The one error-shaping layer of `pyrodash serve`: every refusal is its route's API's error body (OpenAI's; Anthropic's
on /v1/messages: `app.state.error_bodies`), counted, and safe.

    install(app)                 # exception handlers for APIError, validation errors, 404/405 and crashes
    raise failure(exc)           # an engine failure as the client may see it (details go to the server log only)

An unhandled error is a 500 body (`AnswerCrashes`), never a dropped connection.

An error body is ASCII JSON (a lone surrogate is written as its escape), counted by route template and kind (label
sets stay bounded), with `WWW-Authenticate` on 401 and `Allow` on 405. A failing backend is a 502 naming no internal
URL and carrying no upstream text (the log has it, under the body's `request_id`); a client that stops sending its
body half-way is a 499 ("disconnect"), never a 500.
"""

from __future__ import annotations

import json
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from pyrodash.server import protocol

log = logging.getLogger("pyrodash.serve")


class ErrorResponse(JSONResponse):
    """OpenAI's error body as ASCII JSON (surrogates and any other character are escaped, never an encode error)."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def route_label(request: Request) -> str:
    """The matched route's template (bounded: one value per route), or "unmatched"."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def count(request: Request, status: int) -> None:
    """Count a response in requests_total (model: the validated model name, else "")."""
    metrics = request.app.state.metrics
    model = getattr(request.state, "model", "") or ""
    metrics.requests.inc(route=route_label(request), model=model, status=str(status))
    request.state.counted = True


class CountResponses:
    """ASGI middleware: every HTTP response that no handler counted (the GET routes' 200s, /health's 503) goes into
    requests_total with its route template. Completion routes count themselves (they know the model and the
    in-stream outcome) and error handlers count through `count`; both mark the request as counted."""

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status: list[int] = []

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, send_status)  # an exception propagates: the 500 handler counts it
        if status and not scope.get("state", {}).get("counted"):
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.inc(route=route, model="", status=str(status[0]))


class AnswerCrashes:
    """ASGI middleware: an exception no handler took becomes the 500 error body here, and the connection stays
    usable. (Starlette's own last handler answers and then re-raises, and the web server then drops the connection:
    a proxy in front, such as nginx, reports a 502 of its own with no body from this server.) An exception after the
    response started (a stream) still ends the connection: there is no status line left to send."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            if started:
                raise
            request = Request(scope, receive)
            await crash_response(request, exc)(scope, receive, send)


def crash_response(request: Request, exc: BaseException) -> ErrorResponse:
    """A 500 for an unhandled error: its type and a request id; the traceback goes to the server log."""
    rid = uuid.uuid4().hex[:16]
    log.error("request %s: unhandled error on %s", rid, route_label(request), exc_info=exc)
    err = protocol.APIError(
        500,
        f"Internal server error ({type(exc).__name__}); the server log has the details under request id {rid}.",
        type="server_error",
    )
    return error_response(request, err)


def error_kind(status: int) -> str:
    """errors_total's kind for a refusal: a client that went away (499) is not a client error, and never a 5xx."""
    if status == 499:
        return "disconnect"
    return "client" if status < 500 else ("upstream" if status in (502, 503, 504) else "server")


def error_response(request: Request, err: protocol.APIError, headers: dict | None = None) -> ErrorResponse:
    request.app.state.metrics.errors.inc(kind=error_kind(err.status))
    count(request, err.status)
    if err.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    shape = getattr(request.app.state, "error_bodies", {}).get(route_label(request))  # the route's API's shape
    return ErrorResponse(shape(err) if shape else err.body(), status_code=err.status, headers=headers)


def failure(exc: BaseException) -> protocol.APIError:
    """What an engine failure means for the client. A ValueError is a request the models cannot take (400, URLs
    removed); anything else is a failing model backend (502) with a request id; the details are logged here."""
    if isinstance(exc, protocol.APIError):
        return exc
    if isinstance(exc, ValueError):
        return protocol.APIError(400, protocol.scrub(str(exc)), code="invalid_value")
    rid = uuid.uuid4().hex[:16]
    log.error("request %s: the model backend failed: %s: %s", rid, type(exc).__name__, exc)
    return protocol.APIError(
        502,
        f"The model backend failed ({type(exc).__name__}); the server log has the details under request id {rid}.",
        type="upstream_error",
        code="backend_error",
    )


def install(app: FastAPI) -> None:
    app.add_middleware(AnswerCrashes)  # (inside CountResponses: the 500 it sends is counted once, by error_response)
    app.add_middleware(CountResponses, metrics=app.state.metrics)

    @app.exception_handler(protocol.APIError)
    async def api_error(request: Request, exc: protocol.APIError):
        return error_response(request, exc)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect):
        # the client stopped sending its body (or closed the connection) before its request was read: a 499
        # counted as a disconnect; nobody reads the answer
        return error_response(request, protocol.APIError(499, "client closed request", code="client_closed"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(x) for x in err.get("loc", ())[1:]) or None
        msg = f"{param or 'request'}: {err.get('msg', 'invalid request')}"
        return error_response(request, protocol.APIError(400, msg, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            msg, code = f"No route {request.method} {route_label(request)}: see /docs for this API.", "not_found"
            if route_label(request) == "unmatched":
                msg = f"Unknown path for {request.method}: see /docs for this API's routes."
        elif exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            msg, code = (
                f"Method {request.method} is not allowed here; use {allow or 'another method'}.",
                "method_not_allowed",
            )
        else:
            msg, code = str(exc.detail), None
        return error_response(request, protocol.APIError(exc.status_code, msg, code=code), headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception):  # (what AnswerCrashes did not see: a middleware's)
        return crash_response(request, exc)
