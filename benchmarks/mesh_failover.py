"""LLM mesh cost in time: the mesh wrapper on a healthy stream, and the gap when an endpoint dies mid-stream.

    .venv/bin/python benchmarks/mesh_failover.py [--tokens 120] [--cut-at 40] [--token-ms 5] [--runs 20]

A scripted OpenAI-compatible server (a TEST DOUBLE, not a model), in its own process, streams `--tokens` tokens
with a fixed delay per token. Model "whole" streams them all; model "cut" streams `--cut-at` tokens and then drops
the connection (an endpoint dying mid-answer). Measured, alternating order, each after a 20 ms pause:
  - overhead: one endpoint "whole" read directly vs through `MeshBackend([whole])` (wall-time ratio of medians);
  - failover: `MeshBackend([cut, whole])` (policy fallback): the gap between the last chunk of "cut" and the first
    chunk of "whole" (p50), against the scripted per-token time; the takeover request costs one HTTP round trip
    plus the server's time to first token.
The last line is machine-readable: `mesh_overhead_ratio=<x> failover_gap_ms_p50=<y> token_ms=<z>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402


def scripted_app(tokens: int, cut_at: int, token_s: float) -> FastAPI:
    """TEST DOUBLE: "whole" streams `tokens` tokens; "cut" streams `cut_at` of them, then breaks the connection."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in ("whole", "cut")]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        model, n = body["model"], body.get("max_tokens", tokens)

        def chunk(choices, **extra) -> str:
            return (
                "data: "
                + json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": model,
                        "choices": choices,
                        **extra,
                    }
                )
                + "\n\n"
            )

        async def events():
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for i in range(min(n, tokens)):
                await asyncio.sleep(token_s)
                if model == "cut" and i == cut_at:
                    raise ConnectionResetError("scripted: the endpoint dies mid-stream")
                yield chunk([{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}])
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "length"}])
            k = min(n, tokens)
            yield chunk([], usage={"prompt_tokens": 50, "completion_tokens": k, "total_tokens": 50 + k})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _serve(port: int, tokens: int, cut_at: int, token_s: float) -> None:
    import uvicorn

    uvicorn.run(scripted_app(tokens, cut_at, token_s), host="127.0.0.1", port=port, log_level="critical")


async def measure(url: str, runs: int, tokens: int) -> dict:
    from pyrodash.backends import load_llm
    from pyrodash.backends.base import GenRequest

    whole = load_llm(f"{url}#whole")
    one = load_llm({"endpoints": [{"url": url, "model": "whole", "name": "whole1"}]})
    two = load_llm(
        {
            "cooldown_s": 0,
            "endpoints": [{"url": url, "model": "cut", "name": "cut"}, {"url": url, "model": "whole", "name": "whole"}],
        }
    )
    req = GenRequest(messages=[{"role": "user", "content": "q"}], max_tokens=tokens)

    async def wall(backend) -> float:
        t0 = time.perf_counter()
        async for _ in backend.stream(req):
            pass
        return time.perf_counter() - t0

    async def gap() -> float:
        stamps, last = [], None
        async for ch in two.stream(req):
            if ch.text:
                stamps.append(time.perf_counter())
            last = ch
        cut_n = last.endpoints[0]["llm_out"]
        assert last.endpoints[0]["error"] and len(stamps) == tokens, "one uninterrupted answer of every token"
        return stamps[cut_n] - stamps[cut_n - 1]

    d, m, g = [], [], []
    for i in range(runs + 1):  # run 0 warms connections up
        order = (whole, one) if i % 2 else (one, whole)
        res = {}
        for b in order:
            await asyncio.sleep(0.02)
            res[id(b)] = await wall(b)
        await asyncio.sleep(0.02)
        gp = await gap()
        if i:
            d.append(res[id(whole)])
            m.append(res[id(one)])
            g.append(gp)
    for b in (whole, one, two):
        await b.aclose()
    return {
        "ratio": statistics.median(m) / statistics.median(d),
        "gap_ms": statistics.median(g) * 1e3,
        "direct_ms": statistics.median(d) * 1e3,
        "mesh_ms": statistics.median(m) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    import multiprocessing
    import socket

    import httpx

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=120)
    p.add_argument("--cut-at", type=int, default=40, help="tokens the dying endpoint streams before it breaks")
    p.add_argument("--token-ms", type=float, default=5.0, help="scripted decode time per token")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args(argv)
    if not 0 < a.cut_at < a.tokens:
        raise SystemExit("--cut-at must be between 0 and --tokens")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, a.tokens, a.cut_at, a.token_ms / 1e3), daemon=True
    )
    proc.start()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        r = asyncio.run(measure(url, a.runs, a.tokens))
    finally:
        proc.terminate()
        proc.join(5)
    print(
        f"direct {r['direct_ms']:.1f} ms, through a one-endpoint mesh {r['mesh_ms']:.1f} ms; "
        f"failover gap {r['gap_ms']:.1f} ms (scripted token time {a.token_ms:g} ms)"
    )
    print(f"mesh_overhead_ratio={r['ratio']:.4f} failover_gap_ms_p50={r['gap_ms']:.2f} token_ms={a.token_ms:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
