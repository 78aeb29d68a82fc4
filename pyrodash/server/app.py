"""The OpenAI-compatible Collaborate Engine server: `build_app(config) -> FastAPI` (run by `pyrodash serve`).

    app = build_app(ServeConfig(slm="worlds/demo/slm", llm="http://127.0.0.1:8001/v1"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions and /v1/completions (streaming and not), GET /v1/models, /health, /metrics, and
the browser playground (GET /, /static/*, /playground/config: `pyrodash.server.playground`).
Nothing happens at import time: backends are opened in the app's lifespan (or an engine is passed in, and then
the caller owns it). Every refusal is OpenAI's error body; bodies are read by hand (size-limited, any content type)
so malformed JSON, wrong types and oversized bodies all get a precise 4xx. Request validation lives in
`pyrodash.server.validation`, error shaping (bodies, status headers, counting, what a 502 may say) in
`pyrodash.server.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import asdict

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel

from pyrodash.backends import load_llm, load_slm
from pyrodash.backends.probe import reachability as _probe
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import get_prompts
from pyrodash.server import errors as E
from pyrodash.server import modes, playground
from pyrodash.server import protocol as P
from pyrodash.server import validation as V
from pyrodash.server.config import ServeConfig
from pyrodash.server.metrics import Metrics
from pyrodash.server.runs import ChunkWriter, EngineRun

log = logging.getLogger("pyrodash.serve")


def build_engine(config: ServeConfig):
    """The CollaborateEngine a config describes (opens the SLM and LLM backends)."""
    if config.slm is None or config.llm is None:
        raise ValueError("serve needs both an SLM and an LLM: set slm/llm in the config or pass --slm and --llm")
    slm = load_slm(config.slm)
    # one endpoint (probed: its continuation mode detected / verified), or several behind one handoff (a mesh)
    llm = load_llm(config.llm, config.llm_mode)
    return CollaborateEngine(
        slm, llm, get_prompts(config.prompts), config.load_prices(), handoff_style=config.handoff_style,
        offload_bias=config.operating_points[config.default_model].offload_bias,
        max_tokens=config.limits.default_max_tokens,
        failure=FailurePolicy(**asdict(config.failure)), context=config.context,
    )  # fmt: skip


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator and cancels its engine run, even when the client
    vanished before or during sending."""

    media_type = "text/event-stream"

    def __init__(self, content, run: EngineRun, headers: dict | None = None):
        super().__init__(content, headers=headers)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


def _openapi_body(model: type[BaseModel]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}  # fmt: skip


def build_app(config: ServeConfig, engine=None) -> FastAPI:
    """The server app. With `engine=None` the engine is built from `config` at startup and closed at shutdown."""
    owns_engine = engine is None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if app.state.engine is None:
            app.state.engine = await asyncio.to_thread(build_engine, config)
        try:
            yield
        finally:
            runs = list(app.state.runs)
            for run in runs:
                run.cancel()
            if runs:
                await asyncio.wait([r.task for r in runs], timeout=5)
            if owns_engine and app.state.engine is not None:
                await app.state.engine.aclose()
                app.state.engine = None

    app = FastAPI(title="PyroDash", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible Collaborate Engine (SLM -> LLM token-level collaboration)")
    app.state.config = config
    app.state.engine = engine
    app.state.metrics = Metrics()
    app.state.runs = set()
    app.state.api_key = config.resolved_api_key()
    app.state.sem = asyncio.Semaphore(config.limits.max_concurrency)  # binds to the serving loop on first wait
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    E.install(app)
    _install_routes(app)
    playground.install(app, dependencies=[Depends(_check_auth)])
    _install_openapi(app)
    return app


# ---------------------------------------------------------------- errors


def _error(status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:  # fmt: skip
    return E.ErrorResponse(P.APIError(status, message, type, param, code).body(), status_code=status)


def _check_auth(request: Request) -> None:
    key = request.app.state.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise P.APIError(401, "Missing API key: send the header 'Authorization: Bearer <key>'.",
                         type="authentication_error", code="missing_api_key")  # fmt: skip
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise P.APIError(401, "Incorrect API key provided.", type="authentication_error", code="invalid_api_key")


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _first_batch(request: Request, run: EngineRun) -> tuple[bool, list | None]:
    """(client gone, the run's first events); an engine error raised before any event becomes an APIError."""
    watcher = asyncio.create_task(_wait_disconnect(request))
    getter = asyncio.create_task(run.next_batch())
    try:
        await asyncio.wait({watcher, getter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not getter.done():
        getter.cancel()
        run.cancel()
        return True, None
    try:
        return False, getter.result()
    except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
        raise E.failure(e) from e


# ---------------------------------------------------------------- routes


def _install_routes(app: FastAPI) -> None:
    config: ServeConfig = app.state.config
    metrics: Metrics = app.state.metrics
    auth = [Depends(_check_auth)]

    async def complete(request: Request, kind: str):
        model_cls = P.ChatCompletionRequest if kind == "chat" else P.CompletionRequest
        req = V.parse(model_cls, await V.read_json(request, config.limits.max_body_bytes))
        model, prompt, kwargs = V.engine_call(app, req, kind)
        request.state.model = model  # a validated name: the metrics' model label stays bounded
        request.state.counted = True  # from here the route (or the error handler) counts the response itself
        kwargs = await V.check_context(app, prompt, kwargs)
        route = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        opts = req.pyrodash or P.PyroDashOptions()
        engine = app.state.engine

        def info(done: Done) -> P.PyroDashInfo:
            prices = getattr(engine, "prices", None)
            if prices is None:
                return P.PyroDashInfo.from_done(done, opts.mode)
            llm_only = modes.llm_only_prompt(engine, prompt) if opts.mode != "llm" else None
            return P.PyroDashInfo.from_done(done, opts.mode, modes.cost_by_component(done.usage, prices),
                                            modes.llm_only_estimate(done, prices, llm_only, opts.mode))

        metrics.in_flight.inc()
        if opts.mode != "collab":  # the SLM or the LLM answering alone: the engine's own solo modes
            kwargs = {**kwargs, "mode": opts.mode}
        run = EngineRun(engine, prompt, kwargs, app.state.runs, app.state.sem,
                        on_exit=metrics.in_flight.dec)  # fmt: skip
        if req.stream:
            # the status line waits for the engine's first events: an error before any output is a real 4xx/5xx
            gone, first = await _first_batch(request, run)
            if gone:
                metrics.errors.inc(kind="disconnect")
                metrics.requests.inc(route=route, model=model, status="499")
                return _error(499, "client closed request", code="client_closed")
            include = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(_sse(app, run, first, kind, model, route, include, info, opts.sources), run,
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _unary(app, request, run, kind, model, route, info)

    @app.post("/v1/chat/completions", dependencies=auth, response_model=P.ChatCompletion,
              openapi_extra=_openapi_body(P.ChatCompletionRequest))
    async def chat_completions(request: Request):
        return await complete(request, "chat")

    @app.post("/v1/completions", dependencies=auth, response_model=P.Completion,
              openapi_extra=_openapi_body(P.CompletionRequest))
    async def completions(request: Request):
        return await complete(request, "text")

    @app.get("/v1/models", dependencies=auth, response_model=P.ModelList)
    async def models():
        cards = [P.ModelCard(id=name, created=app.state.created, **asdict(point))
                 for name, point in config.operating_points.items()]  # fmt: skip
        return P.ModelList(data=cards)

    @app.get("/v1/models/{model_id}", dependencies=auth, response_model=P.ModelCard)
    async def model_card(model_id: str):
        if model_id not in config.operating_points:
            raise P.APIError(404, f"The model `{model_id[:100]}` does not exist.", param="model",
                             code="model_not_found")
        return P.ModelCard(id=model_id, created=app.state.created, **asdict(config.operating_points[model_id]))

    @app.get("/health")
    async def health():
        engine = app.state.engine
        sides = {"slm": getattr(engine, "slm", None), "llm": getattr(engine, "llm", None)}
        results = await asyncio.gather(*(_probe(b) for b in sides.values()))
        status = dict(zip(sides, results))
        ok = all(s["reachable"] for s in status.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **status}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.state.created = P.now()


async def _unary(app: FastAPI, request: Request, run: EngineRun, kind: str, model: str, route: str,
                 info_of: Callable[[Done], P.PyroDashInfo]):
    metrics: Metrics = app.state.metrics
    watcher = asyncio.create_task(_wait_disconnect(request))
    waiter = asyncio.create_task(run.done())
    try:
        await asyncio.wait({watcher, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():  # the client went away: stop the engine (and with it both upstream requests)
            run.cancel()
            waiter.cancel()
            metrics.errors.inc(kind="disconnect")
            metrics.requests.inc(route=route, model=model, status="499")
            return _error(499, "client closed request", code="client_closed")
        try:
            done: Done = waiter.result()
        except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error (counted by its handler)
            raise E.failure(e) from e
    finally:
        watcher.cancel()
        run.cancel()
    metrics.observe_done(done, model, run.elapsed, run.ttft)
    metrics.requests.inc(route=route, model=model, status="200")
    info, usage = info_of(done), P.UsageInfo.from_done(done)
    if kind == "chat":
        choice = P.Choice(message=P.ResponseMessage(content=done.output), finish_reason=done.finish_reason)
        body = P.ChatCompletion(id=P.new_id(), created=P.now(), model=model, choices=[choice], usage=usage,
                                pyrodash=info)  # fmt: skip
    else:
        choice = P.CompletionChoice(text=done.output, finish_reason=done.finish_reason)
        body = P.Completion(id=P.new_id("cmpl"), created=P.now(), model=model, choices=[choice], usage=usage,
                            pyrodash=info)  # fmt: skip
    return JSONResponse(body.model_dump())


async def _sse(app: FastAPI, run: EngineRun, first: list | None, kind: str, model: str, route: str,
               include_usage: bool, info_of: Callable[[Done], P.PyroDashInfo], sources: bool = False):  # fmt: skip
    metrics: Metrics = app.state.metrics
    rid = P.new_id("chatcmpl" if kind == "chat" else "cmpl")
    w = ChunkWriter(rid, P.now(), model, kind, include_usage)
    status = "200"
    out = [w.role()] if kind == "chat" else []
    try:
        try:
            batch = first
            while batch is not None:  # one write per batch of ready events, one SSE event per delta
                for ev in batch:
                    if isinstance(ev, (SLMDelta, LLMDelta)):
                        if ev.text and sources:
                            out.append(w.tagged(ev.text, {"source": "slm" if isinstance(ev, SLMDelta) else "llm"}))
                        elif ev.text:
                            out.append(w.delta(ev.text))
                    elif isinstance(ev, Handoff) and sources:
                        out.append(w.tagged("", {"source": "handoff", "handoff": ev.slm_tokens}))
                    elif isinstance(ev, Done):
                        out.append(w.finish(ev.finish_reason))
                        if include_usage:
                            info = info_of(ev).model_dump()
                            out.append(w.usage(P.UsageInfo.from_done(ev).model_dump(), info))
                        metrics.observe_done(ev, model, run.elapsed, run.ttft)
                if out:
                    yield "".join(out)
                    out = []
                batch = await run.next_batch()
        except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream, as OpenAI does
            err = E.failure(e)
            status = str(err.status)
            metrics.errors.inc(kind="client" if err.status < 500 else "upstream")
            out.append(w.error(err.body()))
        out.append(w.DONE)
        yield "".join(out)
    except BaseException:  # the client went away (cancelled, or the generator closed early)
        status = "499"
        metrics.errors.inc(kind="disconnect")
        raise
    finally:
        run.cancel()
        metrics.requests.inc(route=route, model=model, status=status)


_ERRORS = {
    400: "Invalid request: malformed JSON, a wrong type or value, an unsupported parameter, lone surrogates, or "
         "prompt + max_tokens over the context length (code context_length_exceeded)",
    401: "Missing or wrong API key (when the server has one)",
    404: "Unknown model",
    413: "Request body over limits.max_body_bytes",
    499: "The client closed the request",
    502: "A model backend failed (the body names no backend address; the server log has the details)",
}


def _install_openapi(app: FastAPI) -> None:
    """Put the request models (read by hand in the routes) into the OpenAPI components, for clients and fuzzers;
    declare every error a route can answer (OpenAI's error body), this server's token limits, and /metrics as
    Prometheus text."""
    from fastapi.openapi.utils import get_openapi

    config: ServeConfig = app.state.config

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (P.ChatCompletionRequest, P.CompletionRequest, P.ErrorResponse):
                js = model.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(js.pop("$defs", {}))
                comps[model.__name__] = js
            for name in ("ChatCompletionRequest", "CompletionRequest"):
                props = comps[name]["properties"]
                for key in ("max_tokens", "max_completion_tokens", "max_tokens_per_model"):
                    if key in props:
                        for branch in props[key].get("anyOf", [props[key]]):
                            if branch.get("type") == "integer":
                                branch["maximum"] = config.limits.max_tokens
            err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
            auth = app.state.api_key is not None
            for path, item in schema.get("paths", {}).items():
                for op in item.values():
                    responses = op.setdefault("responses", {})
                    responses.pop("422", None)  # FastAPI's default; this server answers 400 for invalid input
                    codes = [400, 401, 404, 413, 499, 502] if path.endswith("completions") else [400, 404]
                    if path in ("/health", "/metrics"):
                        codes = []
                    for code in codes:
                        if code == 401 and not auth:
                            continue
                        responses[str(code)] = {"description": _ERRORS[code], **err}
                    responses["405"] = {"description": "Method not allowed (the Allow header lists the methods)",
                                        "headers": {"Allow": {"schema": {"type": "string"}}}, **err}
            for path in ("/v1/chat/completions", "/v1/completions"):
                ok = schema["paths"][path]["post"]["responses"]["200"]
                ok["description"] = "The completion (JSON), or with stream: true server-sent events of chunks"
                event = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
                ok.setdefault("content", {})["text/event-stream"] = {"schema": event}
            metrics_ok = schema["paths"]["/metrics"]["get"]["responses"]["200"]
            metrics_ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
            health = schema["paths"]["/health"]["get"]["responses"]
            health["503"] = {"description": "A backend is unreachable (status: degraded)",
                             "content": {"application/json": {"schema": {"type": "object"}}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
