"""Gateway overhead in one run: direct to a scripted upstream, through LiteLLM, through `pyrodash serve` (or older).

    .venv/bin/python benchmarks/gateway_overhead.py [--tokens 200] [--token-ms 1] [--concurrency 1 64] [--rounds 8]
        [--requests 10] [--litellm .venv-litellm/bin/litellm | ''] [--workers 1] [--baseline REV|DIR]

The upstream is `engine_overhead.py`'s scripted server (a TEST DOUBLE); PyroDash serves at an operating point that
never hands off; `--baseline` adds `pyrodash serve` run from an older revision (extracted by `git archive`) or
checkout. The targets run interleaved in rounds, the order rotating, for a raw-socket keep-alive client; TTFT is the
time to the first SSE event with text. `pyrodash serve` is also measured through its Responses and Messages APIs (the
same request; `--chat-only` leaves them out) and with a chat request offering one function (`tools`), with lines per
concurrency `c=<c> tools_minus_chat_ttft_p50_ms=<t>` and `c=<c> responses_minus_chat_ttft_p50_ms=<x>
messages_minus_chat_ttft_p50_ms=<y>`. Last lines, per concurrency: `c=<c> pyrodash_added_ttft_p50_ms=<a>
litellm_added_ttft_p50_ms=<b> ratio=<a/b>`, with `--baseline` also `c=<c> pyrodash_ttft_p50_ms=<a>
baseline_ttft_p50_ms=<b> tree_minus_baseline_ttft_p50_ms=<a-b>`. Method and results: docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_overhead import scripted_server_process  # noqa: E402
from server_load import _free_port, _pct, _stop, serve_argv, serve_env, wait_url  # noqa: E402

CONTENT = re.compile(rb'"content":\s*"[^"]')  # the first SSE event with text (the role chunk's content is "")
TARGETS = ("direct", "litellm", "pyrodash", "tools", "responses", "messages", "baseline")
# the "tools" target: the same chat request offering one function (the SLM never calls it: the tool path's own cost)
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a value up.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}  # fmt: skip
KEY = "sk-gateway-bench-0123456789abcdef"  # LiteLLM's master key (it refuses to start without one); sent to all
HEADERS = {"litellm": "x-litellm-overhead-duration-ms", "pyrodash": "x-pyrodash-overhead-ms"}
HEADERS["baseline"] = HEADERS["responses"] = HEADERS["messages"] = HEADERS["tools"] = HEADERS["pyrodash"]
# the same `pyrodash serve` through OpenAI's Responses API and Anthropic's Messages API: (route, the first event with
# text, how the stream ends)
FRONTS = {
    "responses": (
        "/v1/responses",
        re.compile(rb'"delta":\s*"[^"]'),
        re.compile(rb"event: response\.(completed|incomplete)\ndata: [^\n]*\s*$"),
    ),
    "messages": (
        "/v1/messages",
        re.compile(rb'"text_delta",\s*"text":\s*"[^"]'),
        re.compile(rb"event: message_stop\ndata: [^\n]*\s*$"),
    ),
}
CHAT = ("/v1/chat/completions", CONTENT, re.compile(rb"data: \[DONE\]\s*$"))


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes, wire: tuple = CHAT
) -> dict:
    """One streamed request on a kept-alive connection: status, headers, TTFT and total seconds (`wire`: the route,
    its first event with text, its last event)."""
    _, first_text, end = wire
    t0 = time.perf_counter()
    writer.write(head + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    ttft, tail, parts = None, b"", []
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                break
            if ttft is None and first_text.search(tail + data):
                ttft = time.perf_counter() - t0
            tail = data[-64:]
            parts.append(data)
    else:
        parts.append(await reader.readexactly(int(headers.get("content-length", 0))))
    total = time.perf_counter() - t0
    text = b"".join(parts)
    ok = status == 200 and end.search(text) is not None and ttft is not None
    return {"ok": ok, "status": status, "headers": headers, "ttft": ttft, "total": total, "tail": text[-300:]}


def _wire(target: str, port: int, model: str, max_tokens: int) -> tuple[bytes, bytes, tuple]:
    """(the HTTP head, the body, the wire) of one streamed request to `target`: chat completions, or the same question
    through the Responses or the Messages API."""
    ask = [{"role": "user", "content": "What is 2+2?"}]
    if target == "responses":
        req = {"model": model, "input": ask, "stream": True, "max_output_tokens": max_tokens}
    elif target == "messages":
        req = {"model": model, "messages": ask, "stream": True, "max_tokens": max_tokens}
    else:
        req = {"model": model, "messages": ask, "stream": True, "max_tokens": max_tokens}
        req["stream_options"] = {"include_usage": True}
        if target == "tools":
            req["tools"] = [TOOL]
    body, wire = json.dumps(req).encode(), FRONTS.get(target, CHAT)
    head = (
        f"POST {wire[0]} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body, wire


async def _client(target: str, port: int, model: str, n: int, max_tokens: int, out: list[dict]) -> None:
    head, body, wire = _wire(target, port, model, max_tokens)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(n):
            try:
                r = await _request(reader, writer, head, body, wire)
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
                out.append({"ok": False, "status": 0, "tail": f"{type(e).__name__}: {e}".encode()})
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            out.append(r)
            if r["headers"].get("connection") == "close":
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


async def _round(target: str, port: int, model: str, concurrency: int, n: int, max_tokens: int) -> list[dict]:
    out: list[dict] = []
    await asyncio.gather(*(_client(target, port, model, n, max_tokens, out) for _ in range(concurrency)))
    return out


def _up(url: str, proc: subprocess.Popen) -> None:
    try:
        wait_url(url, proc, 180.0)
    except BaseException:
        _stop(proc, timeout=10)  # a process that never came up is not left behind
        raise


def start_litellm(exe: str, upstream: str, port: int, workers: int, workdir: Path) -> subprocess.Popen:
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "direct",
                        "litellm_params": {"model": "openai/direct", "api_base": upstream, "api_key": "sk-none"},
                    }
                ],
                "litellm_settings": {"telemetry": False},
            }
        )
    )  # JSON is YAML
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
        "LITELLM_MASTER_KEY": KEY,
    }
    log = open(workdir / "litellm.log", "wb")  # noqa: SIM115 - closed with the process
    cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    _up(f"http://127.0.0.1:{port}/health/liveliness", proc)
    return proc


def baseline_tree(spec: str, workdir: Path) -> Path:
    """The root of the older code to compare with: `spec` itself when it is a folder, else the tree of git revision
    `spec` (its package and the configs it reads), extracted under `workdir`."""
    if Path(spec).is_dir():
        root = Path(spec).resolve()
        if not (root / "pyrodash" / "__init__.py").exists():
            raise SystemExit(f"--baseline {spec}: no pyrodash/ package in that folder")
        return root
    out = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", spec], capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"--baseline {spec}: neither a folder nor a git revision ({out.stderr.decode().strip()})")
    root = workdir / "baseline"
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


def _tree_env(root: Path) -> dict:
    """The environment of a process that must import `pyrodash` from `root` (checked: it says so or exits)."""
    env = serve_env(root)
    probe = [sys.executable, "-c", "import pyrodash; print(pyrodash.__file__)"]
    where = subprocess.run(probe, cwd=root, env=env, capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"pyrodash run from {root} imports {where or 'nothing'} instead")
    return env


def start_pyrodash(upstream: str, port: int, workers: int, workdir: Path, root: Path = ROOT) -> subprocess.Popen:
    """`pyrodash serve` in front of the double, its code from `root` (this tree, or an older one: `--baseline`)."""
    flags = ["--offload-bias", "-1000", "--max-tokens", "4096"] + (["--workers", str(workers)] if workers != 1 else [])
    env = _tree_env(root)
    log = open(workdir / f"pyrodash-{port}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(serve_argv(upstream, port, *flags), cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    _up(f"http://127.0.0.1:{port}/v1/models", proc)
    return proc


def summarise(res: dict[str, list[dict]], c: int) -> list[str]:
    lines = [f"concurrency {c}:"]
    base = {k: [r[k] for r in res["direct"] if r["ok"]] for k in ("ttft", "total")}
    added = {}
    for target, rows in res.items():
        ok = [r for r in rows if r["ok"]]
        errs = len(rows) - len(ok)
        if not ok:
            lines.append(f"  {target:9s} no successful request ({errs} errors)")
            continue
        q = {k: {p: _pct([r[k] for r in ok], p) * 1e3 for p in (50, 99)} for k in ("ttft", "total")}
        line = (
            f"  {target:9s} n={len(ok)} errors={errs}  TTFT p50 {q['ttft'][50]:7.2f} p99 {q['ttft'][99]:7.2f} "
            f"| total p50 {q['total'][50]:7.2f} p99 {q['total'][99]:7.2f} ms"
        )
        if target != "direct":
            d = {k: {p: q[k][p] - _pct(base[k], p) * 1e3 for p in (50, 99)} for k in ("ttft", "total")}
            added[target] = d["ttft"][50]
            line += (
                f"  added: TTFT p50 {d['ttft'][50]:+6.2f} p99 {d['ttft'][99]:+6.2f}, total p50 "
                f"{d['total'][50]:+6.2f} p99 {d['total'][99]:+6.2f} ms"
            )
            hdr = [float(r["headers"][HEADERS[target]]) for r in ok if HEADERS[target] in r["headers"]]
            if hdr:
                line += f"  [{HEADERS[target]} p50 {_pct(hdr, 50):.2f}]"
        lines.append(line)
        bad = [r for r in rows if not r["ok"]][:3]
        for r in bad:
            lines.append(f"    {target} error: status {r['status']} {r['tail'][-200:]!r}")
    if "tools" in added:  # the same chat request offering a function, on the same server
        lines.append(f"c={c} tools_minus_chat_ttft_p50_ms={added['tools'] - added.get('pyrodash', float('nan')):+.3f}")
    if "responses" in added or "messages" in added:  # the other wire APIs over chat, on the same server
        over = {t: added.get(t, float("nan")) - added.get("pyrodash", float("nan")) for t in ("responses", "messages")}
        lines.append(
            f"c={c} responses_minus_chat_ttft_p50_ms={over['responses']:+.3f} "
            f"messages_minus_chat_ttft_p50_ms={over['messages']:+.3f}"
        )
    a, b = added.get("pyrodash", float("nan")), added.get("litellm", float("nan"))
    lines.append(f"c={c} pyrodash_added_ttft_p50_ms={a:.2f} litellm_added_ttft_p50_ms={b:.2f} ratio={a / b:.3f}")
    if "baseline" in res:
        tree, old = (_pct([r["ttft"] for r in res[t] if r["ok"]], 50) * 1e3 for t in ("pyrodash", "baseline"))
        lines.append(
            f"c={c} pyrodash_ttft_p50_ms={tree:.3f} baseline_ttft_p50_ms={old:.3f} "
            f"tree_minus_baseline_ttft_p50_ms={tree - old:+.3f}"
        )
    return lines


async def measure(ports: dict[str, int], models: dict[str, str], args) -> None:
    """Every concurrency in turn; each one's summary is printed as soon as it is measured."""
    for c in args.concurrency:
        n = args.requests if c == 1 else max(1, args.requests // 5)
        for target in ports:  # warm-up (connections, caches, LiteLLM's first-request set-up): not counted
            await _round(target, ports[target], models[target], min(c, 8), 2, args.max_tokens)
        res: dict[str, list[dict]] = {t: [] for t in ports}
        order = list(ports)
        for i in range(args.rounds):
            for target in order[i % len(order) :] + order[: i % len(order)]:
                await asyncio.sleep(0.05)
                res[target] += await _round(target, ports[target], models[target], c, n, args.max_tokens)
            print(f"  c={c} round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        print("\n".join(summarise(res, c)), flush=True)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=200, help="tokens the upstream streams per request")
    p.add_argument("--token-ms", type=float, default=1.0, help="upstream time per token")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds (each runs every target)")
    p.add_argument(
        "--requests",
        type=int,
        default=10,
        help="sequential requests per client per round at concurrency 1 (a fifth of it above 1)",
    )
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument(
        "--litellm",
        default=str(ROOT / ".venv-litellm" / "bin" / "litellm"),
        help="the litellm executable ('' to leave LiteLLM out)",
    )
    p.add_argument("--workers", type=int, default=1, help="pyrodash serve --workers")
    p.add_argument(
        "--chat-only",
        action="store_true",
        help="measure pyrodash through plain chat only (default: also chat with tools, /v1/responses, /v1/messages)",
    )
    p.add_argument(
        "--litellm-workers",
        type=int,
        default=None,
        help="litellm --num_workers (default: --workers, so both gateways get the same processes)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="also measure `pyrodash serve` from older code: a git revision (e.g. 491fd89) or a checkout's folder",
    )
    return p.parse_args(argv)


def _start_gateways(a: argparse.Namespace, upstream: str, workdir: Path, procs: list) -> dict[str, int]:
    """Start LiteLLM (when installed), `pyrodash serve` and, with `--baseline`, the older `pyrodash serve`; their
    processes are appended to `procs` as they start (so they are stopped even when a later one fails)."""
    ports = {}
    if a.litellm and Path(a.litellm).exists():
        ports["litellm"] = _free_port()
        t0 = time.perf_counter()
        procs.append(start_litellm(a.litellm, upstream, ports["litellm"], a.litellm_workers or a.workers, workdir))
        print(f"litellm up in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    else:
        print(
            f"note: no LiteLLM at {a.litellm!r} (python3 -m venv .venv-litellm && .venv-litellm/bin/pip "
            "install 'litellm[proxy]'): its rows are left out"
        )
    ports["pyrodash"] = _free_port()
    procs.append(start_pyrodash(upstream, ports["pyrodash"], a.workers, workdir))
    if not a.chat_only:  # the same server through its Responses and Messages APIs, and chat with tools
        ports["responses"] = ports["messages"] = ports["tools"] = ports["pyrodash"]
    if a.baseline:
        root = baseline_tree(a.baseline, workdir)
        ports["baseline"] = _free_port()
        procs.append(start_pyrodash(upstream, ports["baseline"], a.workers, workdir, root=root))
        print(f"baseline: pyrodash serve from {a.baseline} ({root})", flush=True)
    return ports


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    upstream, up_proc = scripted_server_process(a.tokens, a.tokens // 2, a.token_ms / 1e3)
    procs: list[subprocess.Popen] = []
    ports = {"direct": int(upstream.rsplit(":", 1)[1].split("/")[0])}
    models = {"direct": "direct", "litellm": "direct", "pyrodash": "pyrodash", "baseline": "pyrodash"}
    models["responses"] = models["messages"] = models["tools"] = "pyrodash"
    with tempfile.TemporaryDirectory(prefix="gateway-overhead-") as tmp:
        try:
            ports.update(_start_gateways(a, upstream, Path(tmp), procs))
            print(
                f"upstream: {a.tokens} tokens at {a.token_ms:g} ms/token; {a.rounds} interleaved rounds; "
                f"{os.cpu_count()} CPUs shared by the clients, the upstream and the gateways; workers: pyrodash "
                f"{a.workers}, litellm {a.litellm_workers or a.workers}",
                flush=True,
            )
            asyncio.run(measure(ports, models, a))
        finally:
            for proc in procs:
                _stop(proc, timeout=20)
            up_proc.terminate()
            up_proc.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
