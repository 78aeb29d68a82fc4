"""`pyrodash serve --workers 2` under load: /metrics, whichever worker answers it, has the server's totals.

A real `pyrodash serve --workers 2` process (uvicorn's process manager, two workers on one socket, one engine each)
in front of `benchmarks/engine_overhead.py`'s scripted OpenAI-compatible server (a TEST DOUBLE: the SLM streams 8
tokens then stops on `<offload>`, the LLM streams 12 more). Concurrent clients send streamed and unary requests, each
on a new connection so the kernel spreads them over both workers, until both have served some; then /metrics is
scraped several times and its counters must equal the requests sent, every time.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from servers import free_port, stop, wait_healthy
from test_scaling import parse_metrics, total

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripted double (its spawned process imports it too)
import engine_overhead  # noqa: E402
import server_load  # noqa: E402

CHAT = "/v1/chat/completions"
Q = [{"role": "user", "content": "2+2?"}]


async def _one(url: str, stream: bool) -> bool:
    body = {"model": "pyrodash", "messages": Q, "max_tokens": 64, "stream": stream}
    async with httpx.AsyncClient(timeout=60) as c:  # a connection of its own
        r = await c.post(f"{url}{CHAT}", json=body)
    return r.status_code == 200 and (r.text.endswith("data: [DONE]\n\n") if stream else "pyrodash" in r.json())


async def _load(url: str, clients: int, each: int) -> list[bool]:
    async def client(i: int) -> list[bool]:
        return [await _one(url, stream=(i + j) % 2 == 0) for j in range(each)]

    return [ok for oks in await asyncio.gather(*(client(i) for i in range(clients))) for ok in oks]


def _pids(metrics_dir: Path) -> set[str]:
    return {f.stem.rsplit("_", 1)[1] for f in metrics_dir.glob("counter_*.db")}


def test_two_workers_under_load_metrics_totals_equal_the_requests_sent(tmp_path):
    upstream, up = engine_overhead.scripted_server_process(20, 8, 0.001)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_99999999.db").write_bytes(b"an earlier run's file")  # removed at start
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**server_load.serve_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    cmd = server_load.serve_argv(upstream, port, "--workers", "2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, proc, "pyrodash serve --workers 2", path="/v1/models")
        sent: list[bool] = []
        for _ in range(10):  # load until both workers have served (the kernel picks the worker of a connection)
            sent += asyncio.run(_load(url, clients=16, each=3))
            if len(_pids(metrics_dir)) >= 2:
                break
        assert all(sent), f"{sent.count(False)} of {len(sent)} requests failed"
        assert len(_pids(metrics_dir)) == 2, "both workers should have counted requests"
        n = len(sent)
        for _ in range(6):  # several scrapes: each worker answers some, every answer has the server's totals
            m = [parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)]
            assert total(m, "pyrodash_requests_total", route=CHAT, status="200") == n
            assert total(m, "pyrodash_requests_total", route=CHAT) == n
            assert total(m, "pyrodash_request_duration_seconds_count") == n
            assert total(m, "pyrodash_overhead_seconds_count") == n
            assert total(m, "pyrodash_handoffs_total") == n and total(m, "pyrodash_llm_calls_total") == n
            assert total(m, "pyrodash_tokens_total", component="llm_out") == 12 * n
            assert total(m, "pyrodash_requests_in_flight") == 0
            assert total(m, "pyrodash_errors_total") == 0
    finally:
        stop(proc, signal.SIGINT)
        up.terminate()
    assert proc.returncode == 0, proc.stdout.read()
    assert not (metrics_dir / "counter_99999999.db").exists()
