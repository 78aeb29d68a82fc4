"""Engine overhead: the same token script streamed directly vs through the Collaborate Engine.

    .venv/bin/python benchmarks/engine_overhead.py [--tokens 200] [--handoff-at 80] [--token-ms 5] [--runs 20]

A scripted OpenAI-compatible server (a TEST DOUBLE, in its own process) streams a fixed script. "Direct" streams it
all through the SLM's `OpenAICompatBackend`; "engine" runs `CollaborateEngine`: the SLM stops on `<offload>` (vLLM's
`stop_reason`) after `--handoff-at` tokens, the LLM streams the rest; alternating, each after a 20 ms pause. The
handoff is timed from the server sending the stop to the LLM request arriving (`handoff_ms_p50`, split into SLM
client, engine, LLM client) or to it being handed to its socket (`handoff_wire_ms_p50`: `backend.http.sent_at`,
without the server's receiving side). The last line is machine-readable:
`overhead_ratio=<x> added_ttft_ms_p50=<y> handoff_ms_p50=<z> handoff_wire_ms_p50=<w>`.
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

from fastapi import FastAPI, Request  # noqa: E402  (module level: FastAPI resolves the annotations)
from fastapi.responses import StreamingResponse  # noqa: E402

from pyrodash.backends.base import GenRequest  # noqa: E402

OFFLOAD_ID = 151_669  # the scripted SLM's <offload> id (any id works; it is only compared, never decoded)


def _chunk(model: str, choices: list, **extra) -> str:
    """One OpenAI chat.completion.chunk SSE event."""
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices, **extra}
    return "data: " + json.dumps(body) + "\n\n"


async def _events(rec: list, model: str, toks: list[str], offload: bool, token_s: float, usage: tuple[int, int]):
    """The scripted stream of `toks` (one per `token_s`), then the stop: `<offload>` (vLLM's stop_reason) when
    `offload`, else length; then the usage chunk (`usage`: prompt and cached tokens). Times go into `rec`."""
    yield _chunk(model, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    for t in toks:
        if token_s:
            await asyncio.sleep(token_s)
        if rec[3] is None:
            rec[3] = time.perf_counter()
        yield _chunk(model, [{"index": 0, "delta": {"content": t}, "finish_reason": None}])
    if offload:
        if token_s:
            await asyncio.sleep(token_s)  # decoding <offload> itself takes a step
        fin = {"finish_reason": "stop", "stop_reason": OFFLOAD_ID}
    else:
        fin = {"finish_reason": "length", "stop_reason": None}
    rec[2] = time.perf_counter()
    yield _chunk(model, [{"index": 0, "delta": {}, **fin}])
    prompt_tokens, cached_tokens = usage
    n_out = len(toks) + offload
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out}
    yield _chunk(model, [], usage={**counts, "prompt_tokens_details": {"cached_tokens": cached_tokens}})
    yield "data: [DONE]\n\n"


def scripted_app(
    script: list[str], handoff_at: int, token_s: float = 0.0, prompt_tokens: int = 100, cached_tokens: int = 0
):
    """TEST DOUBLE: an OpenAI-compatible server that streams a fixed script, no model behind it.

    model "direct" streams the whole script; "slm" streams script[:handoff_at] then stops with
    stop_reason=OFFLOAD_ID (as vLLM reports a stop_token_ids hit), or the whole script when the request bans
    OFFLOAD_ID through logit_bias; "llm" streams script[handoff_at:]. `app.state.log` records (model, arrival
    time, time the last chunk was sent, time the first content chunk was sent) per request, from
    `time.perf_counter()` (one clock for every process of the machine).
    """
    app = FastAPI()
    app.state.log = []

    @app.get("/log")
    async def log():
        return app.state.log

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in ("direct", "slm", "llm")]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        return {"tokens": [OFFLOAD_ID] if body.get("prompt") == "<offload>" else [1, 2], "count": 1}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        t_arrive = time.perf_counter()
        body = await request.json()
        model = body["model"]
        bias = float((body.get("logit_bias") or {}).get(str(OFFLOAD_ID), 0))
        stops = OFFLOAD_ID in (body.get("stop_token_ids") or []) and bias > -100
        at = 0 if bias >= 100 else handoff_at  # <offload> forced (as a real server would): it is the first token
        toks = {"direct": script, "slm": script[:at] if stops else script, "llm": script[handoff_at:]}[model]
        rec = [model, t_arrive, None, None]  # + the time the first content chunk was sent
        app.state.log.append(rec)

        usage = (prompt_tokens, cached_tokens)
        events = _events(rec, model, toks, model == "slm" and stops, token_s, usage)
        return StreamingResponse(events, media_type="text/event-stream")

    return app


class _Timed:
    """The backend it wraps, with the times its stream yielded a stop chunk (`stops`) and was called (`calls`): where
    the engine's own share of a handoff starts and ends. Every other attribute is the backend's."""

    def __init__(self, backend) -> None:
        self._b, self.stops, self.calls = backend, [], []

    def __getattr__(self, name: str):
        return getattr(self._b, name)

    async def stream(self, req, *a, **kw):
        self.calls.append(time.perf_counter())
        async for ch in self._b.stream(req, *a, **kw):
            if ch.stop_token_id is not None and ch.prompt_tokens is None:  # the stop, before the usage chunk
                self.stops.append(time.perf_counter())
            yield ch


async def _handoff_times(url: str, llm, tslm: _Timed, tllm: _Timed) -> tuple[float, tuple, float | None]:
    """The last engine request's handoff, from the scripted server's log: (stop sent -> LLM request arrived, its
    split: upstream -> SLM client, engine, LLM client -> upstream; stop sent -> LLM request on its socket or None)."""
    log = (await llm.client().get(url.removesuffix("/v1") + "/log")).json()
    llm_at = max(i for i, r in enumerate(log) if r[0] == "llm")
    slm_rec, llm_rec = log[llm_at - 1], log[llm_at]  # the engine's SLM request, then its LLM request
    assert slm_rec[0] == "slm"
    stop, call = tslm.stops[-1], tllm.calls[-1]
    split = (stop - slm_rec[2], call - stop, llm_rec[1] - call)
    sent = getattr(getattr(llm, "http", None), "sent_at", None)  # None: not an HTTP backend
    wire = sent - slm_rec[2] if sent is not None and sent > call else None
    return llm_rec[1] - slm_rec[2], split, wire


async def measure(url: str, runs: int, handoff_at: int) -> dict:
    from pyrodash.backends.http.openai_compat import OpenAICompatBackend
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine
    from pyrodash.events import Handoff, LLMDelta, SLMDelta
    from pyrodash.prompts import get_prompts

    # "direct" goes through the SLM's own backend (same client, same connection): without stop_token_ids the
    # scripted "slm" model streams the whole script
    slm, llm = OpenAICompatBackend(url, model="slm"), OpenAICompatBackend(url, model="llm")
    direct = slm
    tslm, tllm = _Timed(slm), _Timed(llm)
    engine = CollaborateEngine(tslm, tllm, get_prompts("qwen-math-v1"), Prices.from_yaml("paper"), max_tokens=4096)
    msgs = [{"role": "user", "content": "q"}]
    d_wall, e_wall, d_ttft, e_ttft, handoffs, parts, wire = [], [], [], [], [], [], []

    async def run_direct() -> tuple[float, float]:
        t0, first = time.perf_counter(), None
        async for ch in direct.stream(GenRequest(messages=msgs, max_tokens=4096)):
            if ch.text and first is None:
                first = time.perf_counter()
        return time.perf_counter() - t0, first - t0

    async def run_engine() -> tuple[float, float]:
        t0, first = time.perf_counter(), None
        async for ev in engine.stream("q"):
            if isinstance(ev, (SLMDelta, LLMDelta)) and first is None:
                first = time.perf_counter()
            if isinstance(ev, Handoff):
                assert ev.slm_tokens == handoff_at
        return time.perf_counter() - t0, first - t0

    for i in range(runs + 1):  # run 0 warms connections up and is not counted
        # alternate the order, and let the server go idle first, so neither path starts on a busy server
        order = (run_direct, run_engine) if i % 2 else (run_engine, run_direct)
        res = {}
        for fn in order:
            await asyncio.sleep(0.02)
            res[fn] = await fn()
        if i == 0:
            continue
        d_wall.append(res[run_direct][0])
        e_wall.append(res[run_engine][0])
        d_ttft.append(res[run_direct][1])
        e_ttft.append(res[run_engine][1])
        handoff, split, sent = await _handoff_times(url, llm, tslm, tllm)
        handoffs.append(handoff)
        parts.append(split)
        wire += [sent] if sent is not None else []
    await engine.aclose()
    return {
        "ratio": statistics.median(e_wall) / statistics.median(d_wall),
        "added_ttft_ms": statistics.median(e - d for e, d in zip(e_ttft, d_ttft)) * 1e3,
        "handoff_ms": statistics.median(handoffs) * 1e3,
        "handoff_parts_ms": [statistics.median(p[j] for p in parts) * 1e3 for j in range(3)],
        "handoff_wire_ms": statistics.median(wire) * 1e3 if wire else float("nan"),
        "direct_ms": statistics.median(d_wall) * 1e3,
        "engine_ms": statistics.median(e_wall) * 1e3,
    }


def _serve(port: int, tokens: int, handoff_at: int, token_s: float) -> None:
    import uvicorn

    app = scripted_app([f" t{i}" for i in range(tokens)], handoff_at, token_s=token_s)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def scripted_server_process(tokens: int, handoff_at: int, token_s: float) -> tuple[str, object]:
    """Start the scripted server in its own process (no GIL shared with the client); returns (url, process)."""
    import multiprocessing
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, tokens, handoff_at, token_s), daemon=True
    )
    proc.start()
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(300):
        try:
            if httpx.get(url + "/models", timeout=1).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("the scripted server did not start")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=200, help="length of the token script")
    p.add_argument("--handoff-at", type=int, default=80, help="SLM tokens before <offload>")
    p.add_argument("--token-ms", type=float, default=5.0, help="scripted decode time per token")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args(argv)
    if not 0 < a.handoff_at < a.tokens:
        raise SystemExit("--handoff-at must be between 0 and --tokens")
    url, proc = scripted_server_process(a.tokens, a.handoff_at, a.token_ms / 1e3)
    try:
        r = asyncio.run(measure(url, a.runs, a.handoff_at))
    finally:
        proc.terminate()
        proc.join(5)
    print(f"script: {a.tokens} tokens at {a.token_ms} ms/token, handoff after {a.handoff_at}, {a.runs} runs")
    print(f"direct {r['direct_ms']:.1f} ms, engine {r['engine_ms']:.1f} ms (medians)")
    a, b, c = r["handoff_parts_ms"]
    print(
        f"handoff split (p50s): stop sent -> the SLM client yields it {a:.3f} ms; the engine (stop -> LLM request "
        f"handed to its client) {b:.3f} ms; LLM client -> request at the server {c:.3f} ms"
    )
    print(
        f"overhead_ratio={r['ratio']:.4f} added_ttft_ms_p50={r['added_ttft_ms']:.3f} "
        f"handoff_ms_p50={r['handoff_ms']:.3f} handoff_wire_ms_p50={r['handoff_wire_ms']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
