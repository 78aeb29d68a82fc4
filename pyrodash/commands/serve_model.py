"""`pyrodash serve-model PATH`: one local transformers model behind an OpenAI-compatible API (vLLM-style extras).

pyrodash serve-model worlds/w/llm --host 127.0.0.1 --port 8001
curl http://127.0.0.1:8001/v1/models
"""

from __future__ import annotations

import argparse

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.server.model_server import build_model_app


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="HF model directory or hub id")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--name", default=None, help="model name in the API (default: the path)")
    p.add_argument("--device", default=None, help="torch device (default: where transformers loads it)")
    p.add_argument("--max-tokens", type=int, default=512, help="default max_tokens of a request")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port {args.port} is not a TCP port")
    backend = HFBackend(args.path, device=args.device, name=args.name or args.path)
    app = build_model_app(backend, model_name=args.name or args.path, default_max_tokens=args.max_tokens)
    print(f"serving {backend.name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
