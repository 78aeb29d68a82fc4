"""The server's routes: each fetches what it needs from `app.state` and awaits one call (the completion routes their
serving object, `pyrodash.server.serving`). `install(app)` registers them with their auth and OpenAPI shapes.

    POST /v1/chat/completions, /v1/completions    completions (streaming and not)
    POST /v1/responses                             OpenAI's Responses API (pyrodash.server.responses_api)
    POST /v1/messages                              Anthropic's Messages API (pyrodash.server.messages_api)
    GET  /v1/models, /v1/models/{model_id}        the operating points as OpenAI models
    GET  /health                                   live and ready (details with the key)
    GET  /metrics                                  Prometheus text (with the key unless `metrics_public`)
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from pyrodash.backends.http.probe import reachability
from pyrodash.server import front, messages_api, metrics, openapi, protocol, responses_api
from pyrodash.server.auth import authorized, check_auth
from pyrodash.server.budget import hooks
from pyrodash.server.errors import route_label

# the wire APIs served in front of the one engine, each on its own completion route
FRONTS = (front.CHAT, front.TEXT, responses_api.FRONT, messages_api.FRONT)


async def complete(request: Request):
    """A completion route of any wire API: its serving object (`app.state.serving`) answers."""
    return await request.app.state.serving[route_label(request)].create(request)


async def models(request: Request) -> protocol.ModelList:
    state = request.app.state
    points = state.config.operating_points.items()
    return protocol.ModelList(data=[protocol.ModelCard(id=n, created=state.created, **asdict(p)) for n, p in points])


async def model_card(model_id: str, request: Request) -> protocol.ModelCard:
    state = request.app.state
    if model_id not in state.config.operating_points:
        message = f"The model `{model_id[:100]}` does not exist."
        raise protocol.APIError(404, message, param="model", code="model_not_found")
    return protocol.ModelCard(id=model_id, created=state.created, **asdict(state.config.operating_points[model_id]))


async def health(request: Request) -> JSONResponse:
    """Live (this answer) and ready (both models reachable: 200, else 503 "degraded"). Backend details (public
    names, reachability, a scrubbed reason) only with the key when auth is on."""
    state = request.app.state
    sides = {"slm": getattr(state.engine, "slm", None), "llm": getattr(state.engine, "llm", None)}
    found = dict(zip(sides, await asyncio.gather(*(reachability(b) for b in sides.values()))))
    ok = all(s["reachable"] for s in found.values())
    body: dict = {"status": "ok" if ok else "degraded", "live": True, "ready": ok}
    if authorized(request):
        if state.base_engine is not None:
            found["base_slm"] = await reachability(state.base_engine.slm)
        body.update({side: _scrubbed(report) for side, report in found.items()})
        body.update(hooks.health(request.app))  # budgets: Redis shared, or this replica on its own share
    return JSONResponse(body, status_code=200 if ok else 503)


async def prometheus(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.app.state.metrics.render(), media_type=metrics.CONTENT_TYPE)


def _scrubbed(obj):
    """A /health finding with every string `scrub`bed (names, errors: no URL, host:port or path)."""
    if isinstance(obj, str):
        return protocol.scrub(obj)
    if isinstance(obj, dict):
        return {k: _scrubbed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrubbed(v) for v in obj]
    return obj


def install(app: FastAPI) -> None:
    """Register the routes (`/metrics` public only with the config's `metrics_public`)."""
    auth = [Depends(check_auth)]
    app.state.fronts = FRONTS
    app.state.error_bodies = {f.route: f.error_body for f in FRONTS}  # each route refuses in its API's shape
    for f in FRONTS:
        body = openapi.request_body(f.wire)
        app.add_api_route(
            f.route, complete, methods=["POST"], dependencies=auth, response_model=f.answer, openapi_extra=body
        )
    app.add_api_route("/v1/models", models, dependencies=auth, response_model=protocol.ModelList)
    app.add_api_route("/v1/models/{model_id}", model_card, dependencies=auth, response_model=protocol.ModelCard)
    app.add_api_route("/health", health)
    app.add_api_route("/metrics", prometheus, dependencies=[] if app.state.config.metrics_public else auth)
    app.state.created = protocol.now()
