"""The OpenAI-compatible Collaborate Engine server: `build_app(config) -> FastAPI` (run by `pyrodash serve`).

    app = build_app(ServeConfig(slm="worlds/demo/slm", llm="http://127.0.0.1:8001/v1"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: `pyrodash.server.routes` (completions, models, /health, /metrics) and the playground; a completion request's
way: `pyrodash.server.serving`. Every response carries `x-pyrodash-overhead-ms` (`pyrodash.server.clock`). Nothing
happens at import time: backends are opened in the app's lifespan (or an engine is passed in, and then the caller
owns it). What the API says and guarantees: docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Depends, FastAPI

from pyrodash.backends import load_backend, load_llm, load_slm
from pyrodash.engine import CollaborateEngine
from pyrodash.prompts import get_prompts
from pyrodash.server import errors, metrics, openapi, playground, protocol, routes, tracing
from pyrodash.server.auth import XApiKey, check_auth
from pyrodash.server.budget import hooks
from pyrodash.server.clock import Timing
from pyrodash.server.config import ServeConfig
from pyrodash.server.metrics import Metrics
from pyrodash.server.serving import ServingCompletions


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
        failure=config.failure,
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


def _lifespan(owns_engine: bool, owns_base: bool):
    """The app's lifespan: the engines it owns are built at startup (off the event loop) and closed at shutdown,
    after the runs left are cancelled; then the budgets' Redis client, the spans not exported yet and this worker's
    in-flight gauge."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state, config = app.state, app.state.config
        if state.engine is None:
            state.engine = await asyncio.to_thread(build_engine, config)
        if state.base_engine is None and config.base_slm is not None:
            state.base_engine = await asyncio.to_thread(build_base_engine, config, state.engine)
        try:
            yield
        finally:
            runs = list(state.runs)
            for run in runs:
                run.cancel()
            if runs:
                await asyncio.wait([r.task for r in runs], timeout=5)
            if owns_engine and state.engine is not None:
                await state.engine.aclose()
                state.engine = None
            if owns_base and state.base_engine is not None:
                await state.base_engine.slm.aclose()  # its LLM is the engine's, closed above
                state.base_engine = None
            await hooks.aclose(app)  # the budgets' Redis client
            if state.tracing is not None:
                await asyncio.to_thread(state.tracing.flush)  # the spans not exported yet
            metrics.mark_process_dead()  # --workers: this worker's in-flight gauge leaves the sum

    return lifespan


def build_app(config: ServeConfig, engine=None, base_engine=None) -> FastAPI:
    """The server app. With `engine=None` the engine is built from `config` at startup and closed at shutdown; so
    is the base SLM's engine (`config.base_slm`) unless `base_engine` (an engine whose SLM answers mode "slm") is
    given."""
    protocol.protect(*config.private_strings())  # never shown to a client, whatever message they end up in
    app = FastAPI(
        title="PyroDash",
        version="0.1.0",
        lifespan=_lifespan(engine is None, base_engine is None),
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
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    errors.install(app)
    app.add_middleware(XApiKey)  # Anthropic's clients send their key as x-api-key
    routes.install(app)
    app.state.serving = {f.route: ServingCompletions(app, f) for f in routes.FRONTS}  # one per wire API
    playground.install(app, dependencies=[Depends(check_auth)])
    hooks.install(app, dependencies=[Depends(check_auth)])  # budgets (config `budgets`) and GET /v1/budget
    openapi.install(app)
    stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: Timing(stack())  # outside Starlette's error middleware: every response
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
