"""Spend pacer benchmark: the real `pyrodash serve` on the quick world holds a dollar budget under swinging traffic.

    .venv/bin/python benchmarks/budget_pacer.py [--run runs/demo-quick] [--replicas 2] [--hour-s 40] [--seed 0]

The server: `pyrodash serve` (one process, or `--replicas 2` behind nginx sharing a Redis that this script starts)
with the quick demo's Stage-3 SLM (`--run DIR`'s `stage3-lambda<--lam>`) and the world's LLM, both in process, and a
`budgets.default` of LLM dollars: target = `--target-frac` (40%) of what the LLM alone would bill for the same
measured traffic (the demo's `records/llm.jsonl`: the LLM-only dollars of each question), a hard cap of
`--cap-mult` x the target per hour (at_cap: slm). Time is compressed: one budget "hour" lasts `--hour-s` seconds
(`budgets.time_compression`), and the budget's hours line up with the measured hours (`budgets.period_origin`).

The load: world questions (tiers 1-5, drawn with replacement), Poisson arrivals at `--base-rps` x the hour's factor
(`--profile`: 3, 4, 1, 1, 3 = a 4x swing), plus a burst (`--burst`: hour, start s, length s, extra factor) and a
warm-up at the first hour's rate until the first measured hour starts (not scored). Each request is a plain
non-streaming chat completion; its dollars, admission and answer come from the response (`pyrodash` object).

Scoring, per budget hour (requests by arrival time, as the budget counts them):
- spend = the LLM dollars of the hour's answers; target = the hour's budget. The pacer never spends more than the
  policy itself wants (its share 1 is the ceiling), so in an hour whose traffic would cost less than the target at
  share 1 (a "light" hour) the right spend is that cost: err = spend / min(target, share-1 cost) - 1, where the
  share-1 cost of each request comes from the replay below.
- window_err_p90: 90th percentile of |err| over the measured hours; total_err = |sum of spend / sum of min(...) - 1|;
  cap_exceeded: budget hours (the warm-up's too) whose spend passed the hard cap.
- acc: the share of the measured requests answered correctly (graded against the world's gold answers).
- static_acc_same_spend: the replay. Every distinct question is answered once at handoff_share 1 and once at 0
  (the engine's batch driver, same models, same token limits, greedy: the server's answers, `tests/parity.py`).
  A handoff share admits a request when a fixed hash of its messages is below the share, so the same traffic at a
  static share s costs and scores exactly the sum over its requests of the share-1 or the share-0 answer; s is
  bisected until that spend equals the pacer's total, and its accuracy is reported.
The last line is exactly:
`window_err_p90=<f> total_err=<f> cap_exceeded=<n> acc=<x> static_acc_same_spend=<y>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from server_load import wait_url  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="runs/demo-quick", help="a `pyrodash demo --quick` run directory")
    p.add_argument("--lam", default="0.6", help="which Stage-3 SLM: stage3-lambda<LAM>")
    p.add_argument("--replicas", type=int, default=1, help="pyrodash serve processes (2+: behind nginx, shared Redis)")
    p.add_argument("--hour-s", type=float, default=40.0, help="wall-clock seconds of one budget hour")
    p.add_argument("--profile", default="3,4,1,1,3", help="arrival-rate factor of each measured hour")
    p.add_argument("--base-rps", type=float, default=0.5, help="requests per second at factor 1")
    p.add_argument("--burst", default="5,10,8,2", help="hour,start_s,length_s,extra_factor (empty: none)")
    p.add_argument("--target-frac", type=float, default=0.4, help="target = this share of the LLM-only dollars")
    p.add_argument("--cap-mult", type=float, default=1.25, help="hard cap per hour = this x the hourly target")
    p.add_argument("--startup-s", type=float, default=45.0, help="time allowed for the servers to start")
    p.add_argument("--max-tokens", type=int, default=400, help="each request's max_tokens (the joint answer)")
    p.add_argument("--max-tokens-per-model", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (configs, server logs)")
    p.add_argument("--dump", help="write every request (time, question, admission, budget state, dollars) as JSONL")
    p.add_argument(
        "--full-replay",
        action="store_true",
        help="replay every question at both shares, also the "
        "answers the run served (checks that the replay reproduces them)",
    )
    return p.parse_args(argv)


# ---------------------------------------------------------------- inputs


def load_run(run: Path, lam: str) -> dict:
    cfg_path = run / "config.resolved.json"
    if not cfg_path.exists():
        raise SystemExit(f"{cfg_path} not found: run `pyrodash demo --quick` first (or pass --run DIR)")
    cfg = json.loads(cfg_path.read_text())
    slm = run / f"stage3-lambda{lam}"
    if not slm.exists():
        raise SystemExit(f"{slm} not found: pick --lam among {sorted(cfg['models']['pyrodash'])}")
    llm_records = run / "records" / "llm.jsonl"
    if not llm_records.exists():
        raise SystemExit(f"{llm_records} not found: the demo's LLM-only records give the LLM-only dollars")
    return {
        "slm": str(slm),
        "llm": cfg["models"]["llm"],
        "world": cfg["world_dir"],
        "prices": cfg["prices"],
        "prompts": cfg["prompts"],
        "llm_records": llm_records,
    }


def load_questions(run: dict) -> list[dict]:
    from pyrodash.cost import Prices, Usage
    from pyrodash.record import usage_of

    prices = Prices(**{k: v for k, v in run["prices"].items() if v is not None})
    llm_only = {}
    for line in run["llm_records"].read_text().splitlines():
        r = json.loads(line)
        u = usage_of(r)  # the record's flat token fields (`pyrodash.record`)
        llm_only[r["question"]] = Usage(llm_in=u.llm_in, llm_out=u.llm_out, llm_cached_in=u.llm_cached_in).cost(prices)
    out = []
    for tier in range(1, 6):
        for line in (Path(run["world"]) / "data" / f"tier{tier}.jsonl").read_text().splitlines():
            ex = json.loads(line)
            if ex["question"] in llm_only:
                out.append({"question": ex["question"], "gold": ex["gold"], "llm_only": llm_only[ex["question"]]})
    if not out:
        raise SystemExit("no world question has an LLM-only record in the run")
    return out


def arrivals(rnd: random.Random, start: float, length: float, rps: float) -> list[float]:
    out, t = [], start
    while rps > 0:
        t += rnd.expovariate(rps)
        if t >= start + length:
            return out
        out.append(t)
    return out


def schedule(args, n_questions: int, seed_offset: int = 0) -> list[tuple[float, int]]:
    """(seconds from the first measured hour, question index) of the measured hours, with the burst."""
    rnd = random.Random(args.seed * 1000 + seed_offset)
    times = []
    for i, factor in enumerate(float(f) for f in args.profile.split(",")):
        times += arrivals(rnd, i * args.hour_s, args.hour_s, args.base_rps * factor)
    if args.burst:
        hour, start, length, extra = (float(x) for x in args.burst.split(","))
        factor = float(args.profile.split(",")[int(hour) - 1])
        times += arrivals(rnd, (hour - 1) * args.hour_s + start, length, args.base_rps * factor * extra)
    return sorted((t, rnd.randrange(n_questions)) for t in times)


# ---------------------------------------------------------------- processes


def write_config(tmp: Path, run: dict, args, usd_per_hour: float, origin: float, redis_url: str | None) -> Path:
    import yaml

    budgets = {
        "default": {
            "usd_per_hour": usd_per_hour,
            "dollars": "llm",
            "cap_usd": usd_per_hour * args.cap_mult,
            "at_cap": "slm",
        },
        "time_compression": 3600.0 / args.hour_s,
        "period_origin": origin,
        "state_dir": str(tmp / "budgets"),  # this run's caps' ledger (without Redis), not the user's
    }
    if redis_url:
        budgets["redis_url"] = redis_url
    cfg = {
        "slm": run["slm"],
        "llm": run["llm"],
        "prices": {k: v for k, v in run["prices"].items() if v is not None},
        "prompts": run["prompts"],
        "operating_points": {"pyrodash": 0.0},
        "limits": {"max_tokens": 512, "default_max_tokens": args.max_tokens, "max_concurrency": 64},
        "failure": {"retries": 2, "backoff_s": 0.2, "timeout_s": 120, "on_error": "fallback"},
        "api_key_env": None,
        "budgets": budgets,
    }
    path = tmp / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.access(exe, os.X_OK):
        raise SystemExit("--replicas 2 needs Debian's redis-server: apt-get install -y redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=open(tmp / "redis.log", "w"),
        stderr=subprocess.STDOUT,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def nginx_conf(upstreams: list[str], port: int, prefix: Path) -> str:
    """deploy/nginx.conf pointed at `upstreams`, on 127.0.0.1:`port`, its files under `prefix` (no root needed)."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    servers = "".join(f"server {u} max_fails=3 fail_timeout=10s;\n        " for u in upstreams)
    conf = re.sub(r"server pyrodash:8000[^;]*;\n\s*", servers, conf)
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    conf = conf.replace("worker_processes auto;", f"worker_processes 1;\npid {prefix}/nginx.pid;")
    temp = "".join(f"    {k}_temp_path {prefix}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return conf.replace("http {\n", "http {\n" + temp, 1)


def start_nginx(tmp: Path, ports: list[int]) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(exe, os.X_OK):
        raise SystemExit("--replicas 2 needs Debian's nginx: apt-get install -y nginx")
    port = free_port()
    (tmp / "nginx.conf").write_text(nginx_conf([f"127.0.0.1:{p}" for p in ports], port, tmp))
    proc = subprocess.Popen(
        [exe, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "nginx-error.log"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    return proc, port


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- the load


async def drive(url: str, plan: list[tuple[float, int]], questions: list[dict], t0: float, args) -> list[dict]:
    """Send each planned request at its time (seconds from t0); one dict per request."""
    import httpx

    results: list[dict] = []

    async def one(at: float, q: int, client: httpx.AsyncClient) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.time()))
        sent = time.time() - t0
        body = {
            "model": "pyrodash",
            "messages": [{"role": "user", "content": questions[q]["question"]}],
            "max_tokens": args.max_tokens,
            "max_tokens_per_model": args.max_tokens_per_model,
        }
        row = {"t": sent, "q": q, "status": None}
        try:
            r = await client.post(f"{url}/v1/chat/completions", json=body)
            row["status"] = r.status_code
            if r.status_code == 200:
                data = r.json()
                p = data["pyrodash"]
                row.update(
                    output=data["choices"][0]["message"]["content"],
                    cost_usd=p["cost_usd"],
                    llm_usd=sum(e["cost_usd"] for e in p.get("llm_endpoints") or []),
                    admitted=p["handoff_admitted"],
                    share=p["handoff_share"],
                    budget=p.get("budget"),
                )
        except httpx.HTTPError as e:
            row["error"] = type(e).__name__
        row["done"] = time.time() - t0
        results.append(row)

    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(one(at, q, client) for at, q in plan))
    return sorted(results, key=lambda r: r["t"])


# ---------------------------------------------------------------- the replay


def replay(
    run: dict, questions: list[dict], used: list[int], args, seen: dict[tuple[int, float], dict]
) -> dict[int, dict]:
    """Each used question's answer at share 1 and at share 0 (the ones the run did not serve: through the engine's
    batch driver; `--full-replay`: all of them), and the share below which its hash admits it."""
    from pyrodash.backends import load_llm, load_slm
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine, handoff_admitted
    from pyrodash.grading import is_correct
    from pyrodash.prompts import get_prompts

    prices = Prices(**{k: v for k, v in run["prices"].items() if v is not None})
    engine = CollaborateEngine(
        load_slm(run["slm"]),
        load_llm(run["llm"]),
        get_prompts(run["prompts"]),
        prices,
        max_tokens=args.max_tokens_per_model,
    )
    msgs = [[{"role": "user", "content": questions[q]["question"]}] for q in used]
    out: dict[int, dict] = {q: {} for q in used}
    for share in (1.0, 0.0):
        todo = [i for i, q in enumerate(used) if args.full_replay or (q, share) not in seen]
        opts = {
            "offload_bias": 0.0,
            "handoff_share": share,
            "max_tokens": args.max_tokens_per_model,
            "max_total_tokens": args.max_tokens,
            "temperature": 0.0,
        }
        dones = engine.batch([msgs[i] for i in todo], options=[opts] * len(todo), batch_size=64, concurrency=8)
        for i, d in zip(todo, dones):
            q = used[i]
            out[q][share] = {
                "output": d.output,
                "llm_usd": sum(e["cost_usd"] for e in d.llm_endpoints),
                "correct": is_correct(d.output, questions[q]["gold"]),
                "replayed": True,
            }
        for q in used:
            out[q].setdefault(share, seen.get((q, share)))
    for q, m in zip(used, msgs):  # the share below which this request may hand off (the engine's hash)
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if handoff_admitted(m, mid) else (mid, hi)
        out[q]["h"] = hi
    asyncio.run(engine.aclose())
    return out


def static_same_spend(rows: list[dict], rep: dict[int, dict], spend: float) -> tuple[float, float]:
    """(the static share whose replayed spend on `rows` equals `spend`, its accuracy)."""

    def at(s: float) -> tuple[float, float]:
        cost = acc = 0.0
        for r in rows:
            side = rep[r["q"]][1.0 if rep[r["q"]]["h"] < s else 0.0]
            cost += side["llm_usd"]
            acc += side["correct"]
        return cost, acc / max(1, len(rows))

    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at(mid)[0] < spend else (lo, mid)
    return hi, at(hi)[1]


def p90(values: list[float]) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * 0.9
    f = math.floor(k)
    return v[f] + (v[min(f + 1, len(v) - 1)] - v[f]) * (k - f)


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    import httpx

    from pyrodash.grading import is_correct

    args = parse_args(argv)
    run = load_run(Path(args.run), args.lam)
    questions = load_questions(run)
    factors = [float(f) for f in args.profile.split(",")]
    plan = schedule(args, len(questions))
    measured_llm_only = sum(questions[q]["llm_only"] for _, q in plan)
    usd_per_hour = args.target_frac * measured_llm_only / len(factors)
    cap = usd_per_hour * args.cap_mult
    tmp = Path(tempfile.mkdtemp(prefix="budget-pacer-"))
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYRODASH_API_KEY", None)
    t_start = time.time()
    try:
        redis_url = None
        if args.replicas > 1:
            rproc, redis_url = start_redis(tmp)
            procs.append(rproc)
        t0 = time.time() + args.startup_s  # the first measured hour starts here (budget period 0)
        cfg = write_config(tmp, run, args, usd_per_hour, t0, redis_url)
        ports = [free_port() for _ in range(args.replicas)]
        servers = []
        for i, port in enumerate(ports):
            log = open(tmp / f"serve-{i}.log", "w")
            servers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "pyrodash",
                        "serve",
                        "--config",
                        str(cfg),
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        procs += servers
        for i, (port, proc) in enumerate(zip(ports, servers)):
            wait_url(
                f"http://127.0.0.1:{port}/health",
                proc,
                what=f"pyrodash serve #{i} (log {tmp}/serve-{i}.log)",
                timeout=max(5.0, t0 - time.time() - 5),
            )
        url = f"http://127.0.0.1:{ports[0]}"
        if args.replicas > 1:
            nproc, nport = start_nginx(tmp, ports)
            procs.append(nproc)
            url = f"http://127.0.0.1:{nport}"
            wait_url(f"{url}/health", nproc, what="nginx", timeout=30)
        warm = t0 - time.time()
        if warm < 5:
            raise SystemExit(f"the servers took too long to start: raise --startup-s (warm-up left {warm:.1f} s)")
        rnd = random.Random(args.seed * 1000 + 7)
        warm_plan = [
            (t - t0, rnd.randrange(len(questions)))
            for t in arrivals(rnd, time.time(), warm, args.base_rps * factors[0])
        ]
        print(
            f"budget_pacer: {args.replicas} replica(s){' behind nginx, Redis shared' if args.replicas > 1 else ''}; "
            f"SLM {Path(run['slm']).name}; hour = {args.hour_s:g} s; target ${usd_per_hour:.6f}/hour "
            f"({args.target_frac:.0%} of LLM-only ${measured_llm_only:.6f} over {len(factors)} hours), cap "
            f"${cap:.6f}/hour; {len(plan)} measured requests + {len(warm_plan)} in a {warm:.0f} s warm-up",
            flush=True,
        )
        rows = asyncio.run(drive(url, warm_plan + plan, questions, t0, args))
        states = []
        for port in ports:
            try:
                states.append(httpx.get(f"http://127.0.0.1:{port}/v1/budget", timeout=10).json())
            except httpx.HTTPError as e:
                states.append({"error": type(e).__name__})
    finally:
        for proc in reversed(procs):
            stop(proc, signal.SIGQUIT if proc.args and "nginx" in str(proc.args[0]) else signal.SIGTERM)
    load_s = time.time() - t_start
    if args.dump:
        Path(args.dump).write_text(
            "".join(json.dumps({k: v for k, v in r.items() if k != "output"}) + "\n" for r in rows)
        )
    bad = [r for r in rows if r["status"] != 200]
    if bad:
        print(f"warning: {len(bad)} requests failed: {sorted({str(r.get('status') or r.get('error')) for r in bad})}")
    ok = [r for r in rows if r["status"] == 200]
    for r in ok:
        r["correct"] = is_correct(r["output"], questions[r["q"]]["gold"])
    used = sorted({r["q"] for r in ok})
    seen = {
        (r["q"], 1.0 if r["admitted"] else 0.0): {
            "output": r["output"],
            "llm_usd": r["llm_usd"],
            "correct": r["correct"],
        }
        for r in ok
    }
    t_rep = time.time()
    rep = replay(run, questions, used, args, seen)
    rep_s = time.time() - t_rep

    # per budget hour (the warm-up is hour 0, not scored)
    n_hours = len(factors)
    print(
        f"\n{'hour':>5} {'rate x':>6} {'reqs':>5} {'p50 s':>6} {'p99 s':>6} {'LLM-only $':>11} {'share-1 $':>10} "
        f"{'target $':>10} {'spend $':>10} {'spend/tgt':>9} {'err':>7}  note"
    )
    errs, spend_sum, att_sum = [], 0.0, 0.0
    # the cap holds per budget hour, counted by arrival, the warm-up's hours too (a long warm-up spans several)
    by_period: dict[int, float] = {}
    for r in ok:
        by_period[math.floor(r["t"] / args.hour_s)] = (
            by_period.get(math.floor(r["t"] / args.hour_s), 0.0) + r["llm_usd"]
        )
    cap_exceeded = sum(spend > cap + 1e-12 for spend in by_period.values())
    for h in range(0, n_hours + 1):
        lo, hi = (-math.inf, 0.0) if h == 0 else ((h - 1) * args.hour_s, h * args.hour_s)
        win = [r for r in ok if lo <= r["t"] < hi]
        spend = sum(r["llm_usd"] for r in win)
        demand = sum(rep[r["q"]][1.0]["llm_usd"] for r in win)
        llm_only = sum(questions[r["q"]]["llm_only"] for r in win)
        target = usd_per_hour if h > 0 else usd_per_hour * warm / args.hour_s
        att = min(target, demand)
        err = spend / att - 1 if att > 0 else 0.0
        note = (
            "warm-up (not scored)"
            if h == 0
            else ("light: the policy wants less than the budget" if demand < target else "")
        )
        if h > 0:
            errs.append(abs(err))
            spend_sum += spend
            att_sum += att
        rate = f"{factors[h - 1]:g}" if h > 0 else f"{factors[0]:g}"
        lat = sorted(r["done"] - r["t"] for r in win) or [0.0]
        print(
            f"{h:>5} {rate:>6} {len(win):>5} {lat[len(lat) // 2]:>6.2f} {lat[int(0.99 * (len(lat) - 1))]:>6.2f} "
            f"{llm_only:>11.6f} {demand:>10.6f} {target:>10.6f} {spend:>10.6f} {spend / target:>9.3f} {err:>+7.3f}  "
            f"{note}"
        )
    measured = [r for r in ok if r["t"] >= 0]
    acc = sum(r["correct"] for r in measured) / max(1, len(measured))
    s_static, acc_static = static_same_spend(measured, rep, spend_sum)
    checked = [r for r in measured if rep[r["q"]][1.0 if r["admitted"] else 0.0].get("replayed")]
    agree = sum(r["output"] == rep[r["q"]][1.0 if r["admitted"] else 0.0]["output"] for r in checked)
    share1 = sum(rep[r["q"]][1.0]["llm_usd"] for r in measured)
    llm_only_total = sum(questions[r["q"]]["llm_only"] for r in measured)
    print(
        f"\nmeasured: {len(measured)} requests, spend ${spend_sum:.6f} = {spend_sum / llm_only_total:.3f} of "
        f"LLM-only (target {args.target_frac:.3f} x the hours; share 1 would spend {share1 / llm_only_total:.3f}); "
        f"admitted {sum(r['admitted'] for r in measured) / max(1, len(measured)):.3f}"
    )
    check = f"; the replay reproduced {agree}/{len(checked)} served answers" if checked else ""
    print(f"static share spending the same: {s_static:.3f} (replayed accuracy {acc_static:.4f}){check}")
    for i, st in enumerate(states):
        d = (st.get("data") or [{}])[0]
        print(
            f"replica {i} /v1/budget: store={json.dumps(st.get('store'))} period_spend_usd="
            f"{d.get('period_spend_usd')} requests={d.get('requests')} cap_hits={d.get('cap_hits')}"
        )
    print(f"time: load {load_s:.0f} s (incl. start-up), replay {rep_s:.0f} s; files: {tmp if args.keep else 'removed'}")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    total_err = abs(spend_sum / att_sum - 1) if att_sum > 0 else float("nan")
    print(
        f"window_err_p90={p90(errs):.4f} total_err={total_err:.4f} cap_exceeded={cap_exceeded} acc={acc:.4f} "
        f"static_acc_same_spend={acc_static:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
