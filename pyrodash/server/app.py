"""The OpenAI-compatible Collaborate Engine server: `build_app(config) -> FastAPI` (run by `pyrodash serve`).

    app = build_app(ServeConfig(slm="worlds/demo/slm", llm="http://127.0.0.1:8001/v1"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions and /v1/completions (streaming and not), GET /v1/models, /health, /metrics, and
the browser playground (GET /, /static/*, /playground/config: `pyrodash.server.playground`).
Every response carries `x-pyrodash-overhead-ms`: the time spent in PyroDash's server itself, from the request
reaching the app to the response's status line, less the time its engine run waited for the engine and the models
(`runs.RequestClock`). For a stream the status line goes out with the first token, so the header is the server's
time before the first upstream request plus its time from the first upstream token to the first byte out; the full
figure (up to the last event) is the usage chunk's `pyrodash.overhead_ms` (with `stream_options.include_usage`) and
`pyrodash_overhead_seconds` in /metrics. A unary response's header is the full figure. The engine's own work and
the upstream HTTP client's are not in it (`benchmarks/engine_overhead.py` measures them; `gateway_overhead.py`
measures the whole hop from outside). /metrics is prometheus_client's exposition (`pyrodash.server.metrics`, several
workers summed); `app.state.tracing` (`pyrodash.server.tracing`, `--otlp-endpoint`) traces each completion request.
With an API key: `/health` without it says only whether the server is live and ready (backend details need the key);
`/metrics` needs it unless the config says `metrics_public: true`. No response carries a configured model path, an
endpoint URL or host:port, or an upstream's text (`protocol.protect` / `scrub`; LLM failures are reason codes, their
text is logged under the response's `pyrodash.request_id`).
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
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel

from pyrodash.backends import load_backend, load_llm, load_slm
from pyrodash.backends.base import GenRequest
from pyrodash.backends.probe import reachability as _probe
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import get_prompts
from pyrodash.server import errors as E
from pyrodash.server import metrics as M
from pyrodash.server import modes, playground, tracing
from pyrodash.server import protocol as P
from pyrodash.server import validation as V
from pyrodash.server.budget import budgets as B
from pyrodash.server.config import ServeConfig
from pyrodash.server.metrics import Metrics
from pyrodash.server.runs import ChunkWriter, EngineRun, RequestClock

log = logging.getLogger("pyrodash.serve")


def build_engine(config: ServeConfig):
    """The CollaborateEngine a config describes (opens the SLM and LLM backends)."""
    if config.slm is None or config.llm is None:
        raise ValueError("serve needs both an SLM and an LLM: set slm/llm in the config or pass --slm and --llm")
    slm = load_slm(config.slm)
    # one endpoint (probed: its continuation mode detected / verified), or several behind one handoff (a mesh)
    llm = load_llm(config.llm, config.llm_mode)
    return CollaborateEngine(
        slm,
        llm,
        get_prompts(config.prompts),
        config.load_prices(),
        handoff_style=config.handoff_style,
        offload_bias=config.operating_points[config.default_model].offload_bias,
        max_tokens=config.limits.default_max_tokens,
        failure=FailurePolicy(**asdict(config.failure)),
        context=config.context,
    )


def build_base_engine(config: ServeConfig, engine) -> CollaborateEngine | None:
    """The engine of the config's base SLM (`base_slm`, the SLM before offloading training), which answers requests
    in mode "slm" to the end (no `<offload>` needed); it shares `engine`'s LLM. None without a base SLM."""
    if config.base_slm is None:
        return None
    return CollaborateEngine(
        load_backend(config.base_slm),
        engine.llm,
        engine.prompts,
        engine.prices,
        handoff_style=engine.handoff_style,
        max_tokens=config.limits.default_max_tokens,
        failure=engine.failure,
        context=config.context,
        require_offload=False,
    )


class SSEResponse(StreamingResponse):
    """Server-sent events written straight to the ASGI `send` (no task group per stream: the disconnect watcher that
    `_first_batch` started cancels the writing when the client goes away); the last event (`data: [DONE]`) ends the
    body in the same write. Always closes its body iterator and cancels its engine run, even when the client
    vanished before or during sending."""

    media_type = "text/event-stream"

    def __init__(self, content, run: EngineRun, watcher: asyncio.Future, headers: dict | None = None):
        super().__init__(content, headers=headers)
        self.run, self.watcher = run, watcher

    async def __call__(self, scope, receive, send) -> None:
        task, gone = asyncio.current_task(), []

        def disconnected(w: asyncio.Future) -> None:
            if not w.cancelled():
                gone.append(True)
                task.cancel()

        self.watcher.add_done_callback(disconnected)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            more = True
            async for chunk in self.body_iterator:
                if more:
                    body = chunk.encode() if isinstance(chunk, str) else chunk
                    more = not body.endswith(ChunkWriter.DONE_BYTES)
                    if not more:  # the end of the response is no disconnect
                        self.watcher.remove_done_callback(disconnected)
                    await send({"type": "http.response.body", "body": body, "more_body": more})
            if more:
                self.watcher.remove_done_callback(disconnected)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:  # not ours: the server is stopping
                raise
            uncancel = getattr(task, "uncancel", None)  # Python >= 3.11
            if uncancel is not None:
                uncancel()
        finally:
            self.watcher.remove_done_callback(disconnected)
            self.watcher.cancel()
            self.run.cancel()
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


class _Timing:
    """ASGI middleware around the whole app (error handlers included): each HTTP request gets a `RequestClock`
    (`request.state.clock`), each response `x-pyrodash-overhead-ms` at its status line, and a traced request's spans
    are built once its last byte is out (`request.state.trace`, see `pyrodash.server.tracing`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        clock = RequestClock()
        state = scope.setdefault("state", {})
        state["clock"] = clock
        status = [500]

        async def timed(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                overhead = b"%.3f" % (clock.overhead_s() * 1e3)
                message = {**message, "headers": [*message.get("headers", ()), (OVERHEAD_HEADER, overhead)]}
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            trace = state.get("trace")
            if trace is not None:
                try:
                    trace.end(status[0], overhead_ms=clock.overhead_s() * 1e3)
                except Exception:  # noqa: BLE001 - a tracing failure never fails a request
                    log.exception("tracing: the spans of a request could not be built")


OVERHEAD_HEADER = b"x-pyrodash-overhead-ms"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _openapi_body(model: type[BaseModel]) -> dict:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def build_app(config: ServeConfig, engine=None, base_engine=None) -> FastAPI:
    """The server app. With `engine=None` the engine is built from `config` at startup and closed at shutdown; so
    is the base SLM's engine (`config.base_slm`) unless `base_engine` (an engine whose SLM answers mode "slm") is
    given."""
    owns_engine, owns_base = engine is None, base_engine is None
    P.protect(*config.private_strings())  # never shown to a client, whatever message they end up in

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if app.state.engine is None:
            app.state.engine = await asyncio.to_thread(build_engine, config)
        if app.state.base_engine is None and config.base_slm is not None:
            app.state.base_engine = await asyncio.to_thread(build_base_engine, config, app.state.engine)
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
            if owns_base and app.state.base_engine is not None:
                await app.state.base_engine.slm.aclose()  # its LLM is the engine's, closed above
                app.state.base_engine = None
            await B.aclose(app)  # the budgets' Redis client
            if app.state.tracing is not None:
                await asyncio.to_thread(app.state.tracing.flush)  # the spans not exported yet
            M.mark_process_dead()  # --workers: this worker's in-flight gauge leaves the sum

    app = FastAPI(
        title="PyroDash",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible Collaborate Engine (SLM -> LLM token-level collaboration)",
    )
    app.state.config = config
    app.state.engine = engine
    app.state.base_engine = base_engine
    app.state.metrics = Metrics()
    app.state.tracing = None  # a pyrodash.server.tracing.Tracing (`--otlp-endpoint`): spans of each completion
    app.state.runs = set()
    app.state.api_key = config.resolved_api_key()
    app.state.sem = asyncio.Semaphore(config.limits.max_concurrency)  # binds to the serving loop on first wait
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    E.install(app)
    _install_routes(app)
    playground.install(app, dependencies=[Depends(_check_auth)])
    B.install(app, dependencies=[Depends(_check_auth)])  # budgets (config `budgets`) and GET /v1/budget
    _install_openapi(app)
    stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: _Timing(stack())  # outside Starlette's error middleware: every response
    return app


WORKER_CONFIG_ENV = "PYRODASH_SERVE_WORKER_CONFIG"


def worker_app() -> FastAPI:
    """The app of one `pyrodash serve --workers N` process (uvicorn imports it: `pyrodash.server.app:worker_app`,
    factory). Its config (and the OTLP endpoint) were pickled by the parent to the file $PYRODASH_SERVE_WORKER_CONFIG;
    the engine is built in the app's lifespan, one per worker."""
    import os
    import pickle

    with open(os.environ[WORKER_CONFIG_ENV], "rb") as f:
        spec = pickle.load(f)
    app = build_app(spec["config"])
    if spec.get("otlp_endpoint"):
        app.state.tracing = tracing.setup(spec["otlp_endpoint"])
    return app


# ---------------------------------------------------------------- errors


def _error(
    status: int, message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> JSONResponse:
    return E.ErrorResponse(P.APIError(status, message, type, param, code).body(), status_code=status)


def _authorized(request: Request) -> bool:
    """Whether the request may see details (auth off, or the right bearer key), without refusing it."""
    key = request.app.state.api_key
    if key is None:
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    return ok or B.key_ok(request)  # a budget's key is an API key too (as in _check_auth)


async def _check_auth(request: Request) -> None:  # async: FastAPI runs a plain def dependency in a thread
    key = request.app.state.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise P.APIError(
            401,
            "Missing API key: send the header 'Authorization: Bearer <key>'.",
            type="authentication_error",
            code="missing_api_key",
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        if B.key_ok(request):  # a budget's key (budgets.keys) is an API key too
            return
        raise P.APIError(401, "Incorrect API key provided.", type="authentication_error", code="invalid_api_key")


def _scrubbed(obj):
    """A /health finding with every string `scrub`bed (names, errors: no URL, host:port or path)."""
    if isinstance(obj, str):
        return P.scrub(obj)
    if isinstance(obj, dict):
        return {k: _scrubbed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrubbed(v) for v in obj]
    return obj


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _watch(request: Request, run: EngineRun) -> asyncio.Future:
    """A task that waits for the client to go away and then cancels `run` (and with it both upstream requests)."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    watcher.add_done_callback(lambda w: w.cancelled() or run.cancel())
    return watcher


def _gone(watcher: asyncio.Future) -> bool:
    return watcher.done() and not watcher.cancelled()


async def _first_batch(request: Request, run: EngineRun) -> tuple[asyncio.Future | None, list | None]:
    """(the disconnect watcher, None when the client is gone; the run's first events). The stream's response keeps
    the watcher. An engine error raised before any event becomes an APIError."""
    watcher = _watch(request, run)
    try:
        first = await run.next_batch()
    except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
        watcher.cancel()
        raise E.failure(e) from e
    if _gone(watcher):
        return None, None
    return watcher, first


def _context_counted(engine) -> bool:
    """Whether a model of `engine` counts prompt tokens against a context window (in-process models): only then has
    the context-length check (`V.check_context`, off the event loop) anything to do."""
    return any(
        callable(getattr(b, "context_window", None)) and callable(getattr(b, "prompt_ids", None))
        for b in (getattr(engine, "slm", None), getattr(engine, "llm", None))
    )


def _llm_only_prompt(engine, prompt, turn, solo: Done | None = None) -> tuple[int, str] | None:
    """`modes.llm_only_prompt`, from what this request measured already when it can, so the LLM-only request is not
    rendered or tokenized again:
    - an in-process LLM counts it: it is the LLM's prompt without P_l, which the context check (or the handoff)
      rendered, and maybe the LLM counted, when the prompt set has no LLM system prompt;
    - an LLM that cannot count it (an endpoint), the SLM's tokenizer counts it: when the engine's own in-process SLM
      answered alone (mode "slm", `solo` its Done) and nothing was dropped to fit its window, its prompt was exactly
      that request (the conversation as given, the SLM's chat template, no prefix), so its billed input is that
      count. Else (history dropped: the estimate counts the whole conversation; the base SLM answered: another
      tokenizer) it is counted here."""
    llm, slm = getattr(engine, "llm", None), getattr(engine, "slm", None)
    ids = getattr(llm, "prompt_ids", None)
    if (
        solo is not None
        and not callable(ids)
        and solo.mode == "slm"
        and not solo.trimmed.get("slm")
        and not solo.usage_estimated
        and solo.usage.slm_in > 0
        and callable(getattr(slm, "prompt_ids", None))
        and callable(getattr(type(slm), "render", None))
    ):  # (its usage is its own tokenizer's count)
        return solo.usage.slm_in, "slm"
    if turn is not None and callable(ids):
        want = GenRequest(messages=engine.messages(prompt))
        same = [f for f in turn.seen if f.same_prompt(llm, want)]
        for f in same:
            if f.tokens is not None or f.counted:  # (a count made to fit it to the window is of this text too)
                return f.tokens if f.tokens is not None else f.prompt, "llm"
        if same:
            with contextlib.suppress(Exception):
                n = len(ids(GenRequest(messages=[], prefix=same[0].text)))  # the rendered text: the same tokens
                for f in same:
                    f.tokens = n
                return n, "llm"
    return modes.llm_only_prompt(engine, prompt)


# ---------------------------------------------------------------- routes


def _install_routes(app: FastAPI) -> None:
    config: ServeConfig = app.state.config
    metrics: Metrics = app.state.metrics
    auth = [Depends(_check_auth)]

    async def complete(request: Request, kind: str):
        model_cls = P.ChatCompletionRequest if kind == "chat" else P.CompletionRequest
        req = V.parse(
            model_cls,
            await V.read_json(request, config.limits.max_body_bytes),
            allow_unknown=config.allow_unknown_fields,
        )
        model, prompt, kwargs = V.engine_call(app, req, kind)
        request.state.model = model  # a validated name: the metrics' model label stays bounded
        request.state.counted = True  # from here the route (or the error handler) counts the response itself
        opts = req.pyrodash or P.PyroDashOptions()
        if _context_counted(app.state.engine):  # (mode collab: the kwargs carry the Turn it built, rendered once)
            kwargs = await V.check_context(app, prompt, kwargs, opts.mode)
        else:  # models behind HTTP: nothing to count here, and no thread round trip per request
            kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        turn = kwargs.get("turn")
        route = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        engine = app.state.engine
        rid = uuid.uuid4().hex[:16]
        answered_by = opts.mode
        if opts.mode == "slm" and app.state.base_engine is not None:
            answered_by = "base_slm"  # the base SLM answers alone, to the end (the served SLM would stop early)

        def info(done: Done) -> P.PyroDashInfo:
            for err in done.errors:  # the client gets reason codes; the full upstream text stays in this log
                log.warning("request %s: LLM failure: %s", rid, err)
            prices = getattr(engine, "prices", None)
            if prices is None:
                return P.PyroDashInfo.from_done(done, opts.mode, answered_by=answered_by, request_id=rid)
            solo = done if answered_by == "slm" else None  # (the engine's own SLM answered alone)
            llm_only = _llm_only_prompt(engine, prompt, turn, solo) if opts.mode != "llm" else None
            return P.PyroDashInfo.from_done(
                done,
                opts.mode,
                modes.cost_by_component(done.usage, prices),
                modes.llm_only_estimate(done, prices, llm_only, opts.mode),
                answered_by=answered_by,
                request_id=rid,
            )

        try:  # the request's budget sets its operating point (pyrodash.server.budget.budgets); 429 at a hard cap
            kwargs, grant = await B.pace(app, request, prompt, kwargs, opts.mode)
        except B.Refused as e:
            return E.error_response(request, e, e.headers)
        info = B.with_budget(info, grant)  # the response says the budget and the operating point it got
        metrics.in_flight.inc()
        if opts.mode != "collab":  # the SLM or the LLM answering alone: the engine's own solo modes
            kwargs = {**kwargs, "mode": opts.mode}
        runner = app.state.base_engine if answered_by == "base_slm" else engine
        clock = getattr(request.state, "clock", None)
        trace = None
        if app.state.tracing is not None:
            trace = request.state.trace = app.state.tracing.request(
                f"POST {route}",
                request.scope["headers"],
                clock.t0 if clock else time.perf_counter(),
                getattr(runner, "prices", None),
                {
                    "http.request.method": "POST",
                    "http.route": route,
                    "gen_ai.request.model": model,
                    "gen_ai.operation.name": "chat" if kind == "chat" else "text_completion",
                    "pyrodash.mode": opts.mode,
                    "pyrodash.stream": bool(req.stream),
                },
            )
        run = EngineRun(
            B.metered(app, runner, grant),
            prompt,
            kwargs,
            app.state.runs,
            app.state.sem,
            on_exit=metrics.in_flight.dec,
            clock=clock,
            observe=trace.observe if trace is not None else None,
        )
        if req.stream:
            # the status line waits for the engine's first events: an error before any output is a real 4xx/5xx
            watcher, first = await _first_batch(request, run)
            if watcher is None:
                metrics.errors.inc(kind="disconnect")
                metrics.requests.inc(route=route, model=model, status="499")
                return _error(499, "client closed request", code="client_closed")
            include = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(
                _sse(app, run, first, kind, model, route, include, info, opts.sources),
                run,
                watcher,
                headers=SSE_HEADERS,
            )
        return await _unary(app, request, run, kind, model, route, info)

    @app.post(
        "/v1/chat/completions",
        dependencies=auth,
        response_model=P.ChatCompletion,
        openapi_extra=_openapi_body(P.ChatCompletionRequest),
    )
    async def chat_completions(request: Request):
        return await complete(request, "chat")

    @app.post(
        "/v1/completions",
        dependencies=auth,
        response_model=P.Completion,
        openapi_extra=_openapi_body(P.CompletionRequest),
    )
    async def completions(request: Request):
        return await complete(request, "text")

    @app.get("/v1/models", dependencies=auth, response_model=P.ModelList)
    async def models():
        cards = [
            P.ModelCard(id=name, created=app.state.created, **asdict(point))
            for name, point in config.operating_points.items()
        ]
        return P.ModelList(data=cards)

    @app.get("/v1/models/{model_id}", dependencies=auth, response_model=P.ModelCard)
    async def model_card(model_id: str):
        if model_id not in config.operating_points:
            raise P.APIError(
                404, f"The model `{model_id[:100]}` does not exist.", param="model", code="model_not_found"
            )
        return P.ModelCard(id=model_id, created=app.state.created, **asdict(config.operating_points[model_id]))

    @app.get("/health")
    async def health(request: Request):
        """Live (this answer) and ready (both models reachable: 200, else 503 "degraded"). Backend details (public
        names, reachability, a scrubbed reason) only with the key when auth is on."""
        engine = app.state.engine
        sides = {"slm": getattr(engine, "slm", None), "llm": getattr(engine, "llm", None)}
        results = await asyncio.gather(*(_probe(b) for b in sides.values()))
        status = dict(zip(sides, results))
        ok = all(s["reachable"] for s in status.values())
        body: dict = {"status": "ok" if ok else "degraded", "live": True, "ready": ok}
        if _authorized(request):
            base = app.state.base_engine
            if base is not None:
                status["base_slm"] = await _probe(base.slm)
            body.update({side: _scrubbed(found) for side, found in status.items()})
            body.update(B.health(app))  # budgets: Redis shared, or this replica on its own share
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", dependencies=[] if config.metrics_public else auth)
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type=M.CONTENT_TYPE)

    app.state.created = P.now()


async def _unary(
    app: FastAPI,
    request: Request,
    run: EngineRun,
    kind: str,
    model: str,
    route: str,
    info_of: Callable[[Done], P.PyroDashInfo],
):
    metrics: Metrics = app.state.metrics
    watcher = _watch(request, run)  # the client going away cancels the run: no Done then
    done: Done | None = None
    try:
        done = await run.done()
    except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error (counted by its handler)
        if not _gone(watcher):
            raise E.failure(e) from e
    finally:
        watcher.cancel()
        run.cancel()
    if done is None:  # the client went away
        metrics.errors.inc(kind="disconnect")
        metrics.requests.inc(route=route, model=model, status="499")
        return _error(499, "client closed request", code="client_closed")
    metrics.requests.inc(route=route, model=model, status="200")
    info, usage = info_of(done), P.UsageInfo.from_done(done)
    if kind == "chat":
        choice = P.Choice(message=P.ResponseMessage(content=done.output), finish_reason=done.finish_reason)
        body = P.ChatCompletion(
            id=P.new_id(), created=P.now(), model=model, choices=[choice], usage=usage, pyrodash=info
        )
    else:
        choice = P.CompletionChoice(text=done.output, finish_reason=done.finish_reason)
        body = P.Completion(
            id=P.new_id("cmpl"), created=P.now(), model=model, choices=[choice], usage=usage, pyrodash=info
        )
    out = body.model_dump()
    overhead = run.clock.overhead_s()
    out["pyrodash"]["overhead_ms"] = round(overhead * 1e3, 3)
    metrics.observe_done(done, model, run.elapsed, run.ttft, overhead)
    return JSONResponse(out)


async def _sse(
    app: FastAPI,
    run: EngineRun,
    first: list | None,
    kind: str,
    model: str,
    route: str,
    include_usage: bool,
    info_of: Callable[[Done], P.PyroDashInfo],
    sources: bool = False,
):
    metrics: Metrics = app.state.metrics
    rid = P.new_id("chatcmpl" if kind == "chat" else "cmpl")
    w = ChunkWriter(rid, P.now(), model, kind, include_usage)
    status = "200"
    out = [w.role()] if kind == "chat" else []
    done: Done | None = None
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
                        done = ev
                        out.append(w.finish(ev.finish_reason))
                        if include_usage:
                            info = info_of(ev).model_dump()
                            info["overhead_ms"] = round(run.clock.overhead_s() * 1e3, 3)
                            out.append(w.usage(P.UsageInfo.from_done(ev).model_dump(), info))
                if out and done is None:  # (the last chunks wait for the run's end: one write with [DONE])
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
        if done is not None:  # after the last byte (the response does not wait for the metrics)
            metrics.observe_done(done, model, run.elapsed, run.ttft, run.clock.overhead_s())
        metrics.requests.inc(route=route, model=model, status=status)


_ERRORS = {
    400: "Invalid request: malformed JSON, a wrong type or value, an unsupported or unknown parameter, a message "
    "without content, lone surrogates, or prompt + max_tokens over the context length (code "
    "context_length_exceeded)",
    401: "Missing or wrong API key (when the server has one)",
    404: "Unknown model",
    413: "Request body over limits.max_body_bytes",
    429: "A budget reached its hard cap (budgets: at_cap refuse, or the LLM alone asked for); Retry-After says when "
    "its period ends",
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
                # unknown top-level fields are a 400 (validation.parse) unless the config lets them pass
                comps[name]["additionalProperties"] = config.allow_unknown_fields
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
                    if path.endswith("completions") and config.budgets is not None:
                        codes.append(429)
                    if path in ("/health", "/metrics"):
                        codes = [401] if path == "/metrics" and not config.metrics_public else []
                    for code in codes:
                        if code == 401 and not auth:
                            continue
                        responses[str(code)] = {"description": _ERRORS[code], **err}
                    responses["405"] = {
                        "description": "Method not allowed (the Allow header lists the methods)",
                        "headers": {"Allow": {"schema": {"type": "string"}}},
                        **err,
                    }
            for path in ("/v1/chat/completions", "/v1/completions"):
                ok = schema["paths"][path]["post"]["responses"]["200"]
                ok["description"] = "The completion (JSON), or with stream: true server-sent events of chunks"
                event = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
                ok.setdefault("content", {})["text/event-stream"] = {"schema": event}
            metrics_ok = schema["paths"]["/metrics"]["get"]["responses"]["200"]
            metrics_ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
            health = schema["paths"]["/health"]["get"]["responses"]
            health["503"] = {
                "description": "A backend is unreachable (status: degraded)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
