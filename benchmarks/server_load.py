"""Load benchmark of `pyrodash serve`: N concurrent streaming clients for a bounded time, vs the same script direct.

    .venv/bin/python benchmarks/server_load.py [--streams 256] [--duration 20] [--tokens 16] [--token-ms 20]
    .venv/bin/python benchmarks/server_load.py --url http://127.0.0.1:8080 [--streams 64] [--max-tokens 32]

TEST DOUBLE backends (`ScriptedBackend`): the SLM streams `--tokens` then `<offload>`, the LLM `--tokens` more. Two
servers in their own processes: "direct" (a bare SSE route, no engine) and "pyrodash" (`build_app` + the engine);
`--streams` httpx clients post streaming completions for `--duration` s (200 and `data: [DONE]`, else an error).
Added latency = pyrodash - direct percentiles; the server's CPU time (psutil) per request and token. Last line:
`streams=<n> errors=<e> rps=<r> p50_added_ms=<a> p99_added_ms=<b>`. `--url` loads a running server instead:
`url=<u> streams=<n> requests=<k> errors=<e> rps=<r> p50_ms=<a> p99_ms=<b> ttft_p50_ms=<c>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi import FastAPI, Request  # noqa: E402  (module level: FastAPI resolves the route annotations)
from fastapi.responses import StreamingResponse  # noqa: E402

from pyrodash.backends.base import GenChunk, GenRequest  # noqa: E402
from pyrodash.prompts import OFFLOAD_TOKEN  # noqa: E402

OFFLOAD_ID = 7


class ScriptedBackend:
    """TEST DOUBLE implementing the Backend protocol: `tokens` fixed tokens, one every `token_s` seconds; stops on
    `<offload>` after them when the request lists its id as a stop token and does not ban it."""

    def __init__(self, name: str, tokens: int, token_s: float, offload: bool):
        self.name, self.tokens, self.token_s, self.offload = name, tokens, token_s, offload

    def token_id(self, token: str) -> int | None:
        return OFFLOAD_ID if token == OFFLOAD_TOKEN and self.offload else None

    async def stream(self, req: GenRequest):
        n = min(self.tokens, req.max_tokens)
        for i in range(n):
            await asyncio.sleep(self.token_s)
            yield GenChunk(text=f"{self.name}{i} ", token_ids=[100 + i])
        hands_off = self.offload and OFFLOAD_ID in req.stop_token_ids and req.logit_bias.get(OFFLOAD_ID, 0) > -100
        yield GenChunk(
            finish_reason="stop",
            stop_token_id=OFFLOAD_ID if hands_off else None,
            prompt_tokens=50,
            completion_tokens=n + int(hands_off),
        )

    async def aclose(self) -> None:
        return None


def scripted_pair(tokens: int, token_s: float) -> tuple[ScriptedBackend, ScriptedBackend]:
    return ScriptedBackend("s", tokens, token_s, offload=True), ScriptedBackend("l", tokens, token_s, offload=False)


def direct_app(tokens: int, token_s: float):
    """The scripted backends streamed straight out as OpenAI chunks: the baseline without PyroDash."""
    slm, llm = scripted_pair(tokens, token_s)
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = json.loads(await request.body())
        req = GenRequest(messages=body["messages"], max_tokens=body.get("max_tokens", 512), stop_token_ids=[OFFLOAD_ID])

        async def events():
            head = {"id": "chatcmpl-direct", "object": "chat.completion.chunk", "created": 0, "model": "direct"}
            yield "data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            for backend in (slm, llm):
                async for ch in backend.stream(req):
                    if ch.text:
                        choice = {"index": 0, "delta": {"content": ch.text}, "finish_reason": None}
                        yield "data: " + json.dumps({**head, "choices": [choice]}) + "\n\n"
            final = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield "data: " + json.dumps({**head, "choices": [final]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def pyrodash_app(tokens: int, token_s: float, streams: int):
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine
    from pyrodash.prompts import get_prompts
    from pyrodash.server.app import build_app
    from pyrodash.server.config import Limits, ServeConfig

    slm, llm = scripted_pair(tokens, token_s)
    config = ServeConfig(
        prompts="world-v1",
        api_key_env=None,
        limits=Limits(max_tokens=4096, default_max_tokens=512, max_concurrency=max(streams, 1)),
    )
    engine = CollaborateEngine(slm, llm, get_prompts("world-v1"), Prices.from_yaml("paper"))
    return build_app(config, engine=engine)


def serve(kind: str, port: int, args: argparse.Namespace) -> None:
    import uvicorn

    token_s = args.token_ms / 1000
    app = direct_app(args.tokens, token_s) if kind == "direct" else pyrodash_app(args.tokens, token_s, args.streams)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_graceful_shutdown=5,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Conn:
    """A minimal keep-alive HTTP/1.1 client for SSE responses (httpx's per-line parsing would make the load
    generator, which shares the CPUs with the server, the bottleneck)."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.reader, self.writer = host, port, None, None

    async def post_stream(self, path: str, body: bytes) -> tuple[int, bytes, float | None]:
        """(status, body, seconds to the first content chunk after the role chunk)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        t0 = time.perf_counter()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        parts, first, n = [], None, 0
        if headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
                n += data.count(b"data: ")
                if first is None and n >= 2:
                    first = time.perf_counter() - t0
        else:
            parts.append(await self.reader.readexactly(int(headers.get("content-length", 0))))
        if headers.get("connection") == "close":
            await self.close()
        return status, b"".join(parts), first

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def _client(
    target: tuple[str, int, str],
    deadline: float,
    lat: list[float],
    ttft: list[float],
    errs: list[str],
    max_tokens: int = 256,
    model: str = "pyrodash",
) -> None:
    host, port, prefix = target
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": max_tokens, "stream": True}
    ).encode()
    conn = _Conn(host, port)
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        try:
            status, text, first = await conn.post_stream(f"{prefix}/v1/chat/completions", body)
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
            errs.append(f"{type(e).__name__}: {e}")
            await conn.close()
            continue
        if status != 200 or not text.endswith(b"data: [DONE]\n\n"):
            errs.append(f"HTTP {status}: {text[-120:]!r}")
            continue
        lat.append(time.perf_counter() - t0)
        if first is not None:
            ttft.append(first)
    await conn.close()


async def _load(target: tuple[str, int, str], streams: int, duration: float, **body) -> dict:
    lat, ttft, errs = [], [], []
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(target, t0 + duration, lat, ttft, errs, **body) for _ in range(streams)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": errs, "rps": len(lat) / wall, "lat": lat, "ttft": ttft}


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q) - 1]


def measure(kind: str, args: argparse.Namespace) -> dict:
    port = _free_port()
    cmd = [
        sys.executable,
        __file__,
        "--serve",
        kind,
        "--port",
        str(port),
        "--tokens",
        str(args.tokens),
        "--token-ms",
        str(args.token_ms),
        "--streams",
        str(args.streams),
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc)
        import psutil

        server = psutil.Process(proc.pid)
        cpu0 = sum(server.cpu_times()[:2])
        res = asyncio.run(_load(("127.0.0.1", port, ""), args.streams, args.duration))
        res["server_cpu_s"] = sum(server.cpu_times()[:2]) - cpu0  # user + system seconds of the server process
        return res
    finally:
        _stop(proc, timeout=20)


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    """Ctrl-C the server (a clean uvicorn shutdown); kill it if it is still there after `timeout` seconds."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_up(url: str, proc: subprocess.Popen) -> None:
    wait_url(f"{url}/health", proc, 120.0)


def wait_url(url: str, proc: subprocess.Popen | None, timeout: float, what: str = "the server") -> None:
    """Wait until GET `url` answers 200; RuntimeError when `proc` exits first or `timeout` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} ({url}) did not come up in {timeout:.0f} s")


def serve_argv(upstream: str, port: int, *flags: str) -> list[str]:
    """The command of a `pyrodash serve` on `port` in front of `engine_overhead.py`'s scripted server at `upstream`
    (its models `slm` and `llm`), with `flags` added (the benchmarks, `tests/test_server_workers.py`, ...)."""
    models = ["--slm", f"{upstream}#slm", "--llm", f"{upstream}#llm", "--prompts", "qwen-math-v1"]
    return [sys.executable, "-m", "pyrodash", "serve", *models, "--port", str(port), "--log-level", "warning", *flags]


def serve_env(root: Path = ROOT) -> dict:
    """The environment of that process: `pyrodash` from `root` (this tree, or an older one), no API key."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(root), os.environ.get("PYTHONPATH")) if x)}
    env.pop("PYRODASH_API_KEY", None)
    return env


def target_of(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http:// URL such as http://127.0.0.1:8080 (the server's root, no /v1)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise SystemExit(f"--url {url!r}: give the server's root as http://HOST:PORT (plain HTTP, no /v1)")
    return u.hostname, u.port or 80, u.path.rstrip("/").removesuffix("/v1")


def measure_url(args: argparse.Namespace) -> int:
    """Load an already running server; print the request count, errors and latency percentiles."""
    print(
        f"{args.streams} streams x {args.duration:.0f}s against {args.url}, max_tokens={args.max_tokens}; "
        f"{os.cpu_count()} CPUs shared by clients and server(s)",
        flush=True,
    )
    r = asyncio.run(
        _load(target_of(args.url), args.streams, args.duration, max_tokens=args.max_tokens, model=args.model)
    )
    for e in sorted(set(r["errors"]))[:5]:
        print(f"  error: {e}")
    print(
        f"url={args.url} streams={args.streams} requests={r['requests']} errors={len(r['errors'])} "
        f"rps={r['rps']:.1f} p50_ms={_pct(r['lat'], 50) * 1e3:.1f} p99_ms={_pct(r['lat'], 99) * 1e3:.1f} "
        f"ttft_p50_ms={_pct(r['ttft'], 50) * 1e3:.1f}"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=256, help="concurrent streaming clients")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per target")
    p.add_argument("--tokens", type=int, default=16, help="tokens per model (SLM, then LLM after the handoff)")
    p.add_argument("--token-ms", type=float, default=20.0, help="scripted time per token")
    p.add_argument("--url", help="load this running server (e.g. nginx before N replicas) instead of starting two")
    p.add_argument("--max-tokens", type=int, default=256, help="--url: max_tokens of each request")
    p.add_argument("--model", default="pyrodash", help="--url: the model (operating point) each request names")
    p.add_argument("--serve", choices=["direct", "pyrodash"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.port, args)
        return 0
    if args.url:
        return measure_url(args)
    print(
        f"{args.streams} streams x {args.duration:.0f}s; script: {args.tokens} SLM + {args.tokens} LLM tokens at "
        f"{args.token_ms:g} ms/token (ideal {2 * args.tokens * args.token_ms:.0f} ms/request); "
        f"{os.cpu_count()} CPUs shared by clients and server",
        flush=True,
    )
    res = {kind: measure(kind, args) for kind in ("direct", "pyrodash")}
    for kind, r in res.items():
        print(
            f"{kind:9s} requests={r['requests']} errors={len(r['errors'])} rps={r['rps']:.1f} "
            f"p50={_pct(r['lat'], 50) * 1e3:.1f}ms p99={_pct(r['lat'], 99) * 1e3:.1f}ms "
            f"ttft_p50={_pct(r['ttft'], 50) * 1e3:.1f}ms",
            flush=True,
        )
        for e in sorted(set(r["errors"]))[:5]:
            print(f"  {kind} error: {e}")
    d, s = res["direct"], res["pyrodash"]
    per_req = s["server_cpu_s"] / max(1, s["requests"] + len(s["errors"]))
    print(
        f"pyrodash server process: cpu_ms_per_request={per_req * 1e3:.3f} "
        f"cpu_us_per_token={per_req * 1e6 / (2 * args.tokens):.1f} (user+system CPU time of its one process; "
        f"capacity of one core ~ {1 / per_req:.0f} requests/s of {2 * args.tokens} streamed tokens)"
    )
    p50 = (_pct(s["lat"], 50) - _pct(d["lat"], 50)) * 1e3
    p99 = (_pct(s["lat"], 99) - _pct(d["lat"], 99)) * 1e3
    print(
        f"streams={args.streams} errors={len(s['errors'])} rps={s['rps']:.1f} p50_added_ms={p50:.1f} "
        f"p99_added_ms={p99:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
