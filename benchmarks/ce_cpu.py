"""CPU cost of one `pyrodash serve` process per request and per streamed token, with its models behind HTTP.

    .venv/bin/python benchmarks/ce_cpu.py [--tokens 200] [--handoff-at 80] [--token-ms 5] [--streams 32]

The SLM and LLM are a scripted OpenAI-compatible server (a TEST DOUBLE from benchmarks/engine_overhead.py, in its own
process): the SLM streams `--handoff-at` tokens then stops on `<offload>` (vLLM's stop_reason), the LLM streams the
rest. A real `pyrodash serve` process (CLI, HTTP backends, engine, SSE out) sits in front, loaded by
`benchmarks/server_load.py`'s clients for `--duration` seconds. The CPU time (user + system) of the serve process
alone, divided by the requests it completed, is what one request costs the CE; it does not depend on the other
processes on the machine, so one core's capacity is its inverse. The last line is exactly:
`requests=<n> errors=<e> cpu_ms_per_request=<c> cpu_us_per_token=<t> requests_per_core_s=<r> streams_per_core=<s>`
(streams_per_core: concurrent streams one core keeps up with at `--token-ms` per upstream token).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    import psutil
    from engine_overhead import scripted_server_process
    from server_load import _free_port, _load, _pct, _stop, _wait_up, serve_argv, serve_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=200, help="tokens per request (SLM + LLM)")
    p.add_argument("--handoff-at", type=int, default=80, help="SLM tokens before <offload>")
    p.add_argument("--token-ms", type=float, default=5.0, help="scripted upstream time per token")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--duration", type=float, default=15.0)
    a = p.parse_args(argv)
    upstream, up_proc = scripted_server_process(a.tokens, a.handoff_at, a.token_ms / 1e3)
    port = _free_port()
    cmd = serve_argv(upstream, port, "--max-tokens", str(4 * a.tokens))
    serve = subprocess.Popen(cmd, env=serve_env())
    try:
        _wait_up(f"http://127.0.0.1:{port}", serve)
        proc = psutil.Process(serve.pid)
        asyncio.run(_load(("127.0.0.1", port, ""), 2, 2.0, max_tokens=4 * a.tokens))  # warm-up, not counted
        cpu0 = sum(proc.cpu_times()[:2])
        r = asyncio.run(_load(("127.0.0.1", port, ""), a.streams, a.duration, max_tokens=4 * a.tokens))
        cpu = sum(proc.cpu_times()[:2]) - cpu0
    finally:
        _stop(serve, timeout=30)
        up_proc.terminate()
    n = r["requests"]
    per_req = cpu / max(1, n + len(r["errors"]))
    for e in sorted(set(r["errors"]))[:5]:
        print(f"  error: {e}")
    print(
        f"{a.streams} streams x {a.duration:g}s, {a.tokens} tokens per request ({a.handoff_at} SLM + "
        f"{a.tokens - a.handoff_at} LLM) at {a.token_ms:g} ms/token: rps={r['rps']:.1f} "
        f"p50={_pct(r['lat'], 50) * 1e3:.0f}ms; serve process CPU {cpu:.2f}s"
    )
    print(
        f"requests={n} errors={len(r['errors'])} cpu_ms_per_request={per_req * 1e3:.3f} "
        f"cpu_us_per_token={per_req * 1e6 / a.tokens:.1f} requests_per_core_s={1 / per_req:.0f} "
        f"streams_per_core={a.token_ms * 1e-3 * a.tokens / per_req:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
