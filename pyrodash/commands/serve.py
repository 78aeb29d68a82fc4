"""`pyrodash serve`: the OpenAI-compatible Collaborate Engine server.

    pyrodash serve --config configs/serve/world.yaml
    pyrodash serve --slm worlds/demo/slm --llm http://127.0.0.1:8001/v1#llm --port 8000 --api-key secret

Flags override the YAML. SIGINT/SIGTERM stop accepting connections, let running requests finish (up to
--graceful-timeout seconds) and close the backends. `--workers N` runs N server processes on the port (one engine
each; /metrics sums them); `--otlp-endpoint URL` exports OpenTelemetry traces; `--base-slm DIR` answers mode "slm"
with the SLM before offloading training. Any OpenAI client works unchanged: docs/serving.md.
"""

from __future__ import annotations

import argparse

from pyrodash.backends.hf.chat_template import add_chat_template_argument
from pyrodash.backends.http.endpoint import add_llm_mode_argument
from pyrodash.backends.loader import with_chat_template
from pyrodash.backends.mesh import spec_from_flags
from pyrodash.engine.conversation import ContextLimits
from pyrodash.server import tracing
from pyrodash.server.app import WORKER_CONFIG_ENV, build_app, build_base_engine, build_engine
from pyrodash.server.config import Limits, ServeConfig
from pyrodash.server.metrics import MULTIPROC_ENV


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe (configs/serve/*.yaml); flags override it")
    add_chat_template_argument(p)
    p.add_argument("--slm", help="SLM backend: a model dir / hub id (in-process) or http(s)://host:port/v1#model")
    p.add_argument(
        "--llm",
        action="append",
        help="LLM backend: same forms as --slm; repeat it for an LLM mesh "
        "(the next endpoint takes over mid-stream when one fails)",
    )
    p.add_argument(
        "--base-slm",
        help="the base SLM (before offloading training): answers mode 'slm' requests and the "
        "playground's 'SLM only' alone, to the end (default: the served SLM with <offload> banned)",
    )
    p.add_argument("--llm-policy", choices=("fallback", "cheapest"), help="mesh policy (default: fallback, in order)")
    p.add_argument(
        "--llm-prices",
        action="append",
        metavar="SHEET",
        help="price sheet of the i-th --llm (repeatable, in order; YAML, name, or LiteLLM FILE.json#MODEL)",
    )
    p.add_argument("--llm-cooldown", type=float, metavar="S", help="seconds a failed mesh endpoint sits out (30)")
    p.add_argument("--llm-timeout", type=float, metavar="S", help="mesh: longest wait for an endpoint's next chunk")
    add_llm_mode_argument(p)
    p.add_argument("--prices", help="price sheet: a YAML path or a name in configs/prices/ (default: paper)")
    p.add_argument("--prompts", help="prompt set name (default: qwen-math-v1)")
    p.add_argument("--offload-bias", type=float, help="offload_bias of the default model (first operating point)")
    _server_arguments(p)


def _server_arguments(p: argparse.ArgumentParser) -> None:
    """The HTTP server's flags: address, key, limits, context windows, workers, tracing."""
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $PYRODASH_API_KEY if set)")
    p.add_argument(
        "--metrics-public",
        action="store_true",
        default=None,
        help="serve GET /metrics without the API key (for a scraper that cannot send one)",
    )
    p.add_argument(
        "--allow-unknown-fields",
        action="store_true",
        default=None,
        help="ignore request fields OpenAI's API does not have (default: a 400 naming them)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        dest="cors_origins",
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable); CORS is off otherwise",
    )
    p.add_argument("--max-tokens", type=int, help="largest max_tokens a request may ask for")
    p.add_argument("--context-slm", type=int, metavar="N", help="SLM context window, tokens (trims long chats)")
    p.add_argument("--context-llm", type=int, metavar="N", help="LLM context window, tokens (trims long chats)")
    p.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds to let requests finish on stop")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], help="uvicorn log level")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="server processes sharing the port (uvicorn workers, one engine each); /metrics sums them all "
        "(prometheus_client multiprocess mode in $PROMETHEUS_MULTIPROC_DIR, a temporary directory "
        "unless set; its *.db files are removed at start)",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export OpenTelemetry traces (a span per request, children for the SLM, the handoff and each "
        "LLM call) to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318; needs "
        "pip install 'pyrodash[otel]'",
    )


def config_from_args(args: argparse.Namespace):
    """The ServeConfig that the YAML (if any) and the flags describe."""
    from dataclasses import replace

    llm = spec_from_flags(args.llm, args.llm_prices, args.llm_policy, args.llm_cooldown, args.llm_timeout)
    flags = {
        k: getattr(args, k, None)
        for k in (
            "slm",
            "prices",
            "prompts",
            "host",
            "port",
            "api_key",
            "cors_origins",
            "log_level",
            "llm_mode",
            "base_slm",
            "metrics_public",
            "allow_unknown_fields",
        )
    }
    flags["llm"] = llm
    config = (
        ServeConfig.from_yaml(args.config, **flags)
        if args.config
        else ServeConfig(**{k: v for k, v in flags.items() if v is not None})
    )
    config.slm = with_chat_template(config.slm, args.chat_template)
    config.base_slm = with_chat_template(config.base_slm, args.chat_template, "--chat-template (for --base-slm)")
    if args.offload_bias is not None:
        point = config.operating_points[config.default_model]
        config.operating_points[config.default_model] = replace(point, offload_bias=float(args.offload_bias))
    if args.context_slm is not None or args.context_llm is not None:
        ctx = config.context
        config.context = ContextLimits(
            slm=args.context_slm if args.context_slm is not None else ctx.slm,
            llm=args.context_llm if args.context_llm is not None else ctx.llm,
        )
    if args.max_tokens is not None:
        lim = config.limits
        config.limits = Limits(
            max_body_bytes=lim.max_body_bytes,
            max_tokens=args.max_tokens,
            default_max_tokens=min(lim.default_max_tokens, args.max_tokens),
            max_concurrency=lim.max_concurrency,
        )
    return config


def run(args: argparse.Namespace) -> int:
    import uvicorn

    config = config_from_args(args)
    if config.slm is None or config.llm is None:
        raise ValueError("serve needs an SLM and an LLM: pass --config configs/serve/X.yaml or --slm and --llm")
    config.check_models()
    config.load_prices()
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers}: give at least 1")
    tracer = None
    if args.otlp_endpoint:
        tracer = tracing.setup(args.otlp_endpoint)  # a missing extra or a bad URL is one line here
    app = build_app(config)
    app.state.tracing = tracer
    # the engine is built (and the LLM endpoint probed) before the server starts, so a misconfiguration is one line
    # here, not a traceback from the lifespan; the app still closes it at shutdown
    app.state.engine = build_engine(config)
    app.state.base_engine = build_base_engine(config, app.state.engine)
    _announce(app, config, args, tracer)
    if args.workers > 1:  # the checks above passed: each worker builds its own engine (and tracing)
        import asyncio

        asyncio.run(_close(app))
        if tracer is not None:
            tracer.shutdown()
        return _run_workers(args, config)

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM once its graceful shutdown is done; a server stopped on purpose
        exits 0 instead (service managers read anything else as a crash)."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            getattr(self, "_captured_signals", []).clear()

    server = Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            timeout_graceful_shutdown=args.graceful_timeout,
            lifespan="on",
        )
    )
    try:
        server.run()
    finally:
        if tracer is not None:
            tracer.shutdown()
    return 0 if server.started else 1


def _announce(app, config, args: argparse.Namespace, tracer) -> None:
    """The startup lines: the LLM's continuation mode, the base SLM, where the server listens and how."""
    llm = app.state.engine.llm
    rep = getattr(llm, "report", None)
    if rep is not None:
        how = rep.mode or f"not detected yet ({rep.error})"
        where = f" at {llm.base}" if isinstance(getattr(llm, "base", None), str) else ""  # the operator's log only
        print(f"pyrodash serve: LLM {llm.name}{where}: continuation mode {how}", flush=True)
    if app.state.base_engine is not None:
        print(f"pyrodash serve: base SLM {app.state.base_engine.slm.name} answers mode 'slm'", flush=True)
    auth = "on" if app.state.api_key else "off"
    print(
        f"pyrodash serve: http://{config.host}:{config.port}/v1  models={list(config.operating_points)}  "
        f"auth={auth}  cors={config.cors_origins or 'off'}  workers={args.workers}"
        + (f"  traces={args.otlp_endpoint}" if tracer else ""),
        flush=True,
    )


async def _close(app) -> None:
    if app.state.engine is not None:
        await app.state.engine.aclose()
    if app.state.base_engine is not None:
        await app.state.base_engine.slm.aclose()


def _run_workers(args: argparse.Namespace, config) -> int:
    """`--workers N`: uvicorn's process manager runs `pyrodash.server.app:worker_app` N times on one socket. The
    config goes to the workers as a pickle file (mode 0600, removed at exit); their metrics meet in
    $PROMETHEUS_MULTIPROC_DIR (set before any worker imports prometheus_client)."""
    import os
    import pickle
    import shutil
    import tempfile
    from pathlib import Path

    import uvicorn

    made = None
    if os.environ.get(MULTIPROC_ENV):
        metrics_dir = Path(os.environ[MULTIPROC_ENV])
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for f in metrics_dir.glob("*.db"):  # counts of an earlier run would be added to this one's
            f.unlink()
    else:
        made = tempfile.mkdtemp(prefix="pyrodash-metrics-")
        os.environ[MULTIPROC_ENV] = made
    fd, spec = tempfile.mkstemp(prefix="pyrodash-serve-", suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        pickle.dump({"config": config, "otlp_endpoint": args.otlp_endpoint}, f)
    os.environ[WORKER_CONFIG_ENV] = spec
    try:
        uvicorn.run(
            "pyrodash.server.app:worker_app",
            factory=True,
            workers=args.workers,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            timeout_graceful_shutdown=args.graceful_timeout,
            lifespan="on",
        )
    finally:
        os.unlink(spec)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    return 0
