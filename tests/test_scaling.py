"""Serving past one process: `pyrodash serve` replicas behind nginx, their /metrics summed, the compose deployment.

The load test starts two real `pyrodash serve` processes (tiny real models in process, built by the tests) and a
real nginx (the Debian package; `.ci/run` installs it) in the foreground on 127.0.0.1 with deploy/nginx.conf, its
upstream lines pointed at the two replicas. `benchmarks/server_load.py --url` loads nginx; then each replica's
/metrics is scraped, as Prometheus does, and the per-replica counters must add up to the requests the load script
completed. deploy/compose.yaml is checked with `docker compose config` where that exists, else by its structure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
import yaml
from servers import free_port, stop, wait_healthy
from tiny_models import tiny_model_dir

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _nginx() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """Prometheus text exposition -> {metric name: {sorted label pairs: value}}."""
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        out[m.group(1)][labels] = float(m.group(3))
    return out


def total(metrics: list[dict], name: str, **match: str) -> float:
    """A counter summed over replicas and over the label sets that contain `match` (PromQL `sum(name{...})`)."""
    return sum(v for m in metrics for labels, v in m.get(name, {}).items() if set(match.items()) <= set(labels))


def nginx_conf(upstreams: list[str], port: int, prefix: Path) -> str:
    """deploy/nginx.conf with its upstream pointed at `upstreams`, listening on 127.0.0.1:`port`, and its pid, logs
    and temp files under `prefix` (so it runs without root)."""
    conf = (DEPLOY / "nginx.conf").read_text()
    servers = "".join(f"server {u} max_fails=3 fail_timeout=10s;\n        " for u in upstreams)
    conf, n = re.subn(r"server pyrodash:8000[^;]*;\n\s*", servers, conf)
    assert n == 1, "deploy/nginx.conf: the upstream line `server pyrodash:8000 ...;` moved"
    conf, n = re.subn(r"listen 8080;", f"listen 127.0.0.1:{port};", conf)
    assert n == 1, "deploy/nginx.conf: `listen 8080;` moved"
    conf = conf.replace("worker_processes auto;", f"worker_processes 1;\npid {prefix}/nginx.pid;")
    temp = "".join(f"    {k}_temp_path {prefix}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return conf.replace("http {\n", "http {\n" + temp, 1)


@pytest.mark.slow
@pytest.mark.exclusive  # (a load through nginx onto two replicas: it needs the cores)
def test_nginx_before_two_replicas_serves_the_load_and_metrics_add_up(tmp_path_factory):
    nginx = _nginx()
    if nginx is None:
        pytest.skip("nginx is not installed: `apt-get install -y nginx` (.ci/run installs it)")
    tmp = tmp_path_factory.mktemp("replicas")
    slm = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0)
    llm = tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=1)
    ports = [free_port(), free_port()]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYRODASH_API_KEY", None)
    procs: list[subprocess.Popen] = []
    lb = None
    try:
        for port in ports:  # two replicas of the CE server, each with its own models in process
            cmd = [
                sys.executable,
                "-m",
                "pyrodash",
                "serve",
                "--slm",
                str(slm),
                "--llm",
                str(llm),
                "--prompts",
                "world-v1",
                "--port",
                str(port),
                "--max-tokens",
                "64",
                "--log-level",
                "warning",
            ]
            procs.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            )
        for port, proc in zip(ports, procs):
            wait_healthy(f"http://127.0.0.1:{port}", proc, f"replica :{port}")
        lb_port = free_port()
        (tmp / "nginx.conf").write_text(nginx_conf([f"127.0.0.1:{p}" for p in ports], lb_port, tmp))
        lb = subprocess.Popen(
            [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log"), "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_healthy(f"http://127.0.0.1:{lb_port}", lb, "nginx", timeout=30)
        assert httpx.get(f"http://127.0.0.1:{lb_port}/metrics").status_code == 404  # scrape replicas, not nginx

        before = [parse_metrics(httpx.get(f"http://127.0.0.1:{p}/metrics").text) for p in ports]
        load = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "server_load.py"),
                "--url",
                f"http://127.0.0.1:{lb_port}",
                "--streams",
                "8",
                "--duration",
                "6",
                "--max-tokens",
                "16",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert load.returncode == 0, load.stdout + load.stderr
        last = load.stdout.strip().splitlines()[-1]
        print(f"\nnginx + 2 replicas: {last}")  # the measured figures (pytest -s shows them)
        fields = dict(kv.split("=", 1) for kv in last.split())
        sent, errors = int(fields["requests"]), int(fields["errors"])
        assert errors == 0 and sent > 0, load.stdout

        # the replicas' counters settle once no request is in flight; then they must sum to what the client got
        deadline = time.monotonic() + 20
        while True:
            after = [parse_metrics(httpx.get(f"http://127.0.0.1:{p}/metrics").text) for p in ports]
            busy = total(after, "pyrodash_requests_in_flight")
            if busy == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        route = {"route": "/v1/chat/completions"}
        per_replica = [
            total([a], "pyrodash_requests_total", **route) - total([b], "pyrodash_requests_total", **route)
            for a, b in zip(after, before)
        ]
        assert all(n > 0 for n in per_replica), per_replica  # nginx spread the load over both replicas
        assert sum(per_replica) == sent, (per_replica, sent)
        assert (
            total(after, "pyrodash_requests_total", status="200", **route)
            - total(before, "pyrodash_requests_total", status="200", **route)
            == sent
        )
        hist = total(after, "pyrodash_request_duration_seconds_count") - total(
            before, "pyrodash_request_duration_seconds_count"
        )
        assert hist == sent  # one latency observation per request, summed over replicas
        handoffs = total(after, "pyrodash_handoffs_total") - total(before, "pyrodash_handoffs_total")
        calls = total(after, "pyrodash_llm_calls_total") - total(before, "pyrodash_llm_calls_total")
        assert 0 <= handoffs <= sent and calls >= handoffs
    finally:
        if lb is not None:
            stop(lb, signal.SIGQUIT)  # nginx first (SIGQUIT: graceful shutdown), then the replicas
        for proc in procs:
            stop(proc)


def test_parse_metrics_reads_labels_and_sums_over_replicas():
    a = parse_metrics('# HELP x y\nreq_total{route="/v1/chat/completions",status="200"} 3\nreq_total{status="499"} 1\n')
    b = parse_metrics('req_total{status="200",route="/v1/chat/completions"} 4\n')
    assert total([a, b], "req_total", status="200") == 7 and total([a, b], "req_total") == 8
    with pytest.raises(AssertionError):
        parse_metrics("not a sample")


def test_nginx_conf_keeps_streams_unbuffered_and_targets_the_replicas(tmp_path):
    conf = nginx_conf(["127.0.0.1:9001", "127.0.0.1:9002"], 9000, tmp_path)
    assert "server 127.0.0.1:9001" in conf and "server 127.0.0.1:9002" in conf and "pyrodash:8000" not in conf
    assert "listen 127.0.0.1:9000;" in conf and f"pid {tmp_path}/nginx.pid;" in conf
    assert "proxy_buffering off;" in conf and "proxy_http_version 1.1;" in conf
    nginx = _nginx()
    if nginx:  # nginx parses the result (`nginx -t`)
        (tmp_path / "nginx.conf").write_text(conf)
        t = subprocess.run(
            [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")],
            capture_output=True,
            text=True,
        )
        assert t.returncode == 0, t.stderr


def test_compose_file_wires_vllm_replicas_nginx_and_prometheus():
    from pyrodash.server.config import ServeConfig

    compose_file = DEPLOY / "compose.yaml"
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        env = {**os.environ, "SLM_CHECKPOINT": "/tmp", "LLM_URL": "http://llm:1/v1", "LLM_API_KEY": "x"}
        r = subprocess.run(
            [docker, "compose", "-f", str(compose_file), "config", "-q"], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(compose_file.read_text())
    svc = doc["services"]
    assert set(svc) == {"slm", "pyrodash", "redis", "nginx", "prometheus"}
    # the SLM on vLLM, on a GPU, under the model name the CE config asks for
    slm = svc["slm"]
    assert slm["image"].startswith("vllm/vllm-openai:")
    assert slm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    cmd = slm["command"]
    served, slm_port = cmd[cmd.index("--served-model-name") + 1], cmd[cmd.index("--port") + 1]
    ce = svc["pyrodash"]
    assert ce["deploy"]["replicas"] >= 2 and ce["depends_on"]["slm"]["condition"] == "service_healthy"
    assert (ROOT / ce["build"]["dockerfile"]).exists() and ce["build"]["context"] == ".."
    assert ce["command"][:3] == ["pyrodash", "serve", "--config"]
    serve = ServeConfig.from_yaml(ROOT / ce["command"][3], llm="http://llm:1/v1#m")  # a valid CE config
    assert serve.slm["url"] == f"http://slm:{slm_port}/v1" and serve.slm["model"] == served
    assert serve.host == "0.0.0.0" and str(serve.port) in ce["expose"]
    assert "--llm" in ce["command"] and "OPENAI_API_KEY" in ce["environment"]
    # the replicas hold one dollar budget through the redis service (docs/budgets.md)
    assert ce["depends_on"]["redis"]["condition"] == "service_healthy" and "6379" in svc["redis"]["expose"]
    assert serve.budgets is not None and serve.budgets.redis_url == "redis://redis:6379/0"
    # nginx balances over the CE service's port; Prometheus scrapes each replica on it
    lb = svc["nginx"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in lb["volumes"]}
    conf = (DEPLOY / mounts["/etc/nginx/nginx.conf"]).read_text()
    assert f"server pyrodash:{serve.port}" in conf and "pyrodash" in lb["depends_on"]
    prom_mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["prometheus"]["volumes"]}
    prom = yaml.safe_load((DEPLOY / prom_mounts["/etc/prometheus/prometheus.yml"]).read_text())
    sd = next(j for j in prom["scrape_configs"] if j["job_name"] == "pyrodash")["dns_sd_configs"][0]
    assert sd["names"] == ["pyrodash"] and sd["port"] == serve.port
