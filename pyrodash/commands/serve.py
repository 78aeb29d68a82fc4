"""`pyrodash serve`: the OpenAI-compatible Collaborate Engine server.

    pyrodash serve --config configs/serve/world.yaml
    pyrodash serve --slm worlds/demo/slm --llm http://127.0.0.1:8001/v1#llm --port 8000 --api-key secret

Flags override the YAML. SIGINT/SIGTERM stop accepting connections, let running requests finish (up to
--graceful-timeout seconds, then they are cancelled) and close the SLM and LLM backends.

Any OpenAI client works unchanged; `model` picks an operating point (GET /v1/models), `offload_bias` overrides it:

    curl -N localhost:8000/v1/chat/completions -H "Authorization: Bearer $PYRODASH_API_KEY" -d '{"model": "pyrodash",
      "messages": [{"role": "user", "content": "2+2?"}], "stream": true, "stream_options": {"include_usage": true}}'
    OpenAI(base_url="http://localhost:8000/v1").chat.completions.create(..., extra_body={"offload_bias": 1.5})

The response's `pyrodash` object (with the usage chunk when streaming) has the tokens per model, llm_calls, the
handoff position, cost_usd, the offload_bias used and whether the SLM had to finish after an LLM failure.
GET /health (backend reachability, 503 when one is down) and GET /metrics (Prometheus) need no key.
"""

from __future__ import annotations

import argparse

from pyrodash.backends.endpoint import add_llm_mode_argument
from pyrodash.backends.mesh import spec_from_flags
from pyrodash.conversation import ContextLimits
from pyrodash.server.app import build_app, build_engine
from pyrodash.server.config import Limits, ServeConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe (configs/serve/*.yaml); flags override it")
    p.add_argument("--slm", help="SLM backend: a model dir / hub id (in-process) or http(s)://host:port/v1#model")
    p.add_argument("--llm", action="append", help="LLM backend: same forms as --slm; repeat it for an LLM mesh "
                   "(the next endpoint takes over mid-stream when one fails)")
    p.add_argument("--llm-policy", choices=("fallback", "cheapest"), help="mesh policy (default: fallback, in order)")
    p.add_argument("--llm-prices", action="append", metavar="SHEET",
                   help="price sheet of the i-th --llm (repeatable, in order; YAML, name, or LiteLLM FILE.json#MODEL)")
    p.add_argument("--llm-cooldown", type=float, metavar="S", help="seconds a failed mesh endpoint sits out (30)")
    p.add_argument("--llm-timeout", type=float, metavar="S", help="mesh: longest wait for an endpoint's next chunk")
    add_llm_mode_argument(p)
    p.add_argument("--prices", help="price sheet: a YAML path or a name in configs/prices/ (default: paper)")
    p.add_argument("--prompts", help="prompt set name (default: qwen-math-v1)")
    p.add_argument("--offload-bias", type=float, help="offload_bias of the default model (first operating point)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $PYRODASH_API_KEY if set)")
    p.add_argument("--cors-origin", action="append", dest="cors_origins", metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (repeatable); CORS is off otherwise")  # fmt: skip
    p.add_argument("--max-tokens", type=int, help="largest max_tokens a request may ask for")
    p.add_argument("--context-slm", type=int, metavar="N", help="SLM context window, tokens (trims long chats)")
    p.add_argument("--context-llm", type=int, metavar="N", help="LLM context window, tokens (trims long chats)")
    p.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds to let requests finish on stop")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], help="uvicorn log level")


def config_from_args(args: argparse.Namespace):
    """The ServeConfig that the YAML (if any) and the flags describe."""
    from dataclasses import replace

    llm = spec_from_flags(args.llm, args.llm_prices, args.llm_policy, args.llm_cooldown, args.llm_timeout)
    flags = {k: getattr(args, k, None) for k in ("slm", "prices", "prompts", "host", "port", "api_key",
                                                 "cors_origins", "log_level", "llm_mode")}  # fmt: skip
    flags["llm"] = llm
    config = ServeConfig.from_yaml(args.config, **flags) if args.config else ServeConfig(
        **{k: v for k, v in flags.items() if v is not None})  # fmt: skip
    if args.offload_bias is not None:
        point = config.operating_points[config.default_model]
        config.operating_points[config.default_model] = replace(point, offload_bias=float(args.offload_bias))
    if args.context_slm is not None or args.context_llm is not None:
        ctx = config.context
        config.context = ContextLimits(slm=args.context_slm if args.context_slm is not None else ctx.slm,
                                       llm=args.context_llm if args.context_llm is not None else ctx.llm)
    if args.max_tokens is not None:
        lim = config.limits
        config.limits = Limits(max_body_bytes=lim.max_body_bytes, max_tokens=args.max_tokens,
                               default_max_tokens=min(lim.default_max_tokens, args.max_tokens),
                               max_concurrency=lim.max_concurrency)  # fmt: skip
    return config


def run(args: argparse.Namespace) -> int:
    import uvicorn

    config = config_from_args(args)
    if config.slm is None or config.llm is None:
        raise ValueError("serve needs an SLM and an LLM: pass --config configs/serve/X.yaml or --slm and --llm")
    config.check_models()
    config.load_prices()
    app = build_app(config)
    # the engine is built (and the LLM endpoint probed) before the server starts, so a misconfiguration is one line
    # here, not a traceback from the lifespan; the app still closes it at shutdown
    app.state.engine = build_engine(config)
    llm = app.state.engine.llm
    rep = getattr(llm, "report", None)
    if rep is not None:
        how = rep.mode or f"not detected yet ({rep.error})"
        print(f"pyrodash serve: LLM {llm.name}: continuation mode {how}", flush=True)
    auth = "on" if app.state.api_key else "off"
    print(f"pyrodash serve: http://{config.host}:{config.port}/v1  models={list(config.operating_points)}  "
          f"auth={auth}  cors={config.cors_origins or 'off'}", flush=True)  # fmt: skip
    class Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM once its graceful shutdown is done; a server stopped on purpose
        exits 0 instead (service managers read anything else as a crash)."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            getattr(self, "_captured_signals", []).clear()

    server = Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=config.log_level,
        timeout_graceful_shutdown=args.graceful_timeout, lifespan="on",
    ))  # fmt: skip
    server.run()
    return 0 if server.started else 1
