"""Nothing about a deployment leaks from `pyrodash serve` (auth on), over real HTTP and real tiny models.

The server is built from its config as `pyrodash serve` builds it (local SLM and base-SLM directories, an HTTP LLM
whose served model name is its local directory, as `transformers serve` names it). Every response body, error body
and header (unauthenticated endpoints, the API with the key, refusals, LLM failures: an upstream 500 whose text
names its address and a directory, then the LLM's server gone) is searched for the configured paths, URL, host:port
and port: none may appear. Clients get public names and reason codes; the log gets the upstream's text under the
request id the response gives. A client that stops sending its body half-way is a 499, not a 500.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from test_server import PRICES, UvicornThread, tiny_llm
from tiny_models import tiny_model_dir

from pyrodash.server.app import build_app
from pyrodash.server.config import Limits, ServeConfig

KEY = "leak-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPS = {"pyrodash": 0.0, "always-offload": 100.0}
CHAT = "/v1/chat/completions"
Q = [{"role": "user", "content": "3+4="}]
# the other wire APIs (OpenAI's Responses, Anthropic's Messages): a request of each
FRONTS = {"/v1/responses": {"input": Q, "max_output_tokens": 8}, "/v1/messages": {"messages": Q, "max_tokens": 8}}


class Switch:
    """TEST DOUBLE: an ASGI wrapper around the real model server that, while `fail` is set, answers chat requests
    with a 500 whose OpenAI error message is `fail` (an upstream that names its own address and files)."""

    def __init__(self, app):
        self.app, self.fail = app, None

    async def __call__(self, scope, receive, send):
        if self.fail and scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            body = json.dumps({"error": {"message": self.fail, "type": "server_error"}}).encode()
            await send(
                {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """(server, LLM server, its fault switch, the strings that must never reach a client)."""
    from pyrodash.server.model_server import build_model_app

    root = tmp_path_factory.mktemp("deploy")
    slm_dir = tiny_model_dir(root / "models" / "slm-stage3", seed=0)
    base_dir = tiny_model_dir(root / "models" / "slm-base", seed=2, offload=False)
    llm_dir = tiny_model_dir(root / "models" / "llm-weights", seed=1, offload=False)
    switch = Switch(build_model_app(tiny_llm(tmp_path_factory), model_name=str(llm_dir)))
    lsrv = UvicornThread(switch, log_level="critical").__enter__()
    config = ServeConfig(
        slm=str(slm_dir),
        base_slm=str(base_dir),
        llm={"url": f"{lsrv.url}/v1", "model": str(llm_dir), "timeout_s": 10},
        prompts="world-v1",
        prices=PRICES.to_dict(),
        operating_points=dict(OPS),
        api_key=KEY,
        failure={"retries": 1, "backoff_s": 0.01, "timeout_s": 10},
        limits=Limits(max_body_bytes=64 * 1024, max_tokens=4000, default_max_tokens=12),
    )
    needles = [
        str(root),
        str(slm_dir),
        str(base_dir),
        str(llm_dir),
        "models/slm-stage3",
        "models/slm-base",
        "models/llm-weights",
        lsrv.url,
        f"127.0.0.1:{lsrv.port}",
        f":{lsrv.port}",
        "127.0.0.1",
        "localhost",
        "/tmp/",
    ]
    try:
        with UvicornThread(build_app(config), log_level="warning") as srv:
            yield srv, lsrv, switch, needles
    finally:
        if lsrv.thread.is_alive():
            lsrv.__exit__(None, None, None)


def _metrics(url: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample in /metrics."""
    out = []
    for line in httpx.get(f"{url}/metrics", headers=AUTH).text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = dict(p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
        out.append((name, {k: v.strip('"') for k, v in pairs.items()}, float(value)))
    return out


def _total(samples, name: str, **labels) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items()))


# ---------------------------------------------------------------- a half-sent body


def test_a_half_sent_body_is_a_499_not_a_500(deployment, caplog):
    srv = deployment[0]
    before = _metrics(srv.url)
    caplog.set_level(logging.INFO)
    uvicorn_log = logging.getLogger("uvicorn")  # uvicorn's own loggers do not propagate to the root
    uvicorn_log.addHandler(caplog.handler)
    try:
        _drop_two_uploads(srv, before, caplog)
    finally:
        uvicorn_log.removeHandler(caplog.handler)


def _drop_two_uploads(srv, before, caplog) -> None:
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: Bearer {KEY}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
                + b'{"model": "pyrodash", "messages": [{"role": "user", "content": "3+'
            )
            time.sleep(0.2)  # the server is reading the body when the client goes away
    deadline = time.monotonic() + 20
    while True:
        after = _metrics(srv.url)
        got = _total(after, "pyrodash_requests_total", route=CHAT, status="499") - _total(
            before, "pyrodash_requests_total", route=CHAT, status="499"
        )
        if got >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert got == 2, "each dropped upload is counted as a 499"
    assert _total(after, "pyrodash_requests_total", status="500") == _total(
        before, "pyrodash_requests_total", status="500"
    )
    for kind, more in (("server", 0), ("client", 0), ("disconnect", 2)):
        assert (
            _total(after, "pyrodash_errors_total", kind=kind)
            == _total(before, "pyrodash_errors_total", kind=kind) + more
        ), kind
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]  # no traceback, nothing for an operator's 5xx alert


# ---------------------------------------------------------------- every response, searched


class Seen:
    """A client of the deployment that keeps every response (label, status, headers and body)."""

    def __init__(self, url: str):
        self.url, self.seen = url, []

    def keep(self, label: str, r: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
        self.seen.append((label, r.status_code, headers + "\n" + r.text))
        return r

    def get(self, path: str, auth: bool = True) -> httpx.Response:
        return self.keep(
            f"GET {path} {'key' if auth else 'no key'}",
            httpx.get(f"{self.url}{path}", headers=AUTH if auth else {}, timeout=60),
        )

    def post(self, label: str, body: dict | bytes, route: str = CHAT, auth: bool = True) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"content-type": "application/json", **(AUTH if auth else {})}
        with httpx.stream("POST", f"{self.url}{route}", content=content, headers=headers, timeout=60) as r:
            r.read()
        return self.keep(label, r)


def _anonymous(c: Seen) -> None:
    """Without the key: what anyone can see."""
    for path in (
        "/",
        "/static/index.html",
        "/static/app.js",
        "/static/style.css",
        "/openapi.json",
        "/docs",
        "/nowhere",
        "/playground/config",
        "/v1/models",
        "/v1/models/pyrodash",
        "/metrics",
    ):
        c.get(path, auth=False)
    h = c.get("/health", auth=False)
    assert h.status_code == 200 and h.json() == {"status": "ok", "live": True, "ready": True}
    assert c.get("/metrics", auth=False).status_code == 401
    c.post("chat without key", {"messages": Q}, auth=False)
    for route, body in FRONTS.items():
        c.post(f"{route} without key", body, route, auth=False)


def _with_key(c: Seen) -> None:
    """With the key: the API, its refusals and its details."""
    h = c.get("/health").json()
    assert (h["slm"]["name"], h["llm"]["name"], h["base_slm"]["name"]) == ("slm-stage3", "llm-weights", "slm-base")
    cfg = c.get("/playground/config").json()
    assert (cfg["slm"], cfg["llm"], cfg["base_slm"], cfg["slm_only"]) == (
        "slm-stage3",
        "llm-weights",
        "slm-base",
        "base_slm",
    )
    for path in ("/v1/models", "/v1/models/nope", "/metrics"):
        c.get(path)
    r = c.post("handoff", {"model": "always-offload", "messages": Q, "max_tokens": 8}).json()["pyrodash"]
    assert r["handoff"] == 0 and [s["endpoint"] for s in r["segments"] if s["by"] == "llm"] == ["llm-weights"]
    assert [e["endpoint"] for e in r["llm_endpoints"]] == ["llm-weights"] and r["answered_by"] == "collab"
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    c.post("handoff stream", {"model": "always-offload", "messages": Q, "max_tokens": 8, **usage, "pyrodash": SOURCES})
    r = c.post("base SLM", {"messages": Q, "max_tokens": 8, "pyrodash": {"mode": "slm"}}).json()
    assert r["pyrodash"]["answered_by"] == "base_slm" and r["pyrodash"]["llm_calls"] == 0
    c.post("LLM alone", {"messages": Q, "max_tokens": 8, "stream": True, "pyrodash": {"mode": "llm"}})
    c.post("completions", {"prompt": "3+4=", "max_tokens": 4}, "/v1/completions")
    for route, body in FRONTS.items():
        c.post(f"{route} handoff", {**body, "model": "always-offload"}, route)
        c.post(
            f"{route} handoff stream", {**body, "model": "always-offload", "stream": True, "pyrodash": SOURCES}, route
        )
        assert c.post(f"{route} unsupported", {**body, "tools": [{"name": "f"}]}, route).status_code == 400
    for label, body in [
        ("bad json", b"{not json"),
        ("unknown field", {"messages": Q, "secret_field": 1}),
        ("no content", {"messages": [{"role": "user"}]}),
        ("model", {"model": "x", "messages": Q}),
        ("too large", b"[" * 70_000),
        ("type", {"messages": Q, "max_tokens": "5"}),
        ("context", {"messages": [{"role": "user", "content": "y" * 2100}], "max_tokens": 4}),
        ("unsupported", {"messages": Q, "n": 3}),
    ]:
        assert c.post(label, body).status_code in (400, 404, 413), label


def _llm_fails(c: Seen, switch, lsrv, needles, caplog) -> None:
    """The LLM fails, with an upstream text that names its address and a directory."""
    switch.fail = f"model {needles[3]} at {lsrv.url}/v1 (127.0.0.1:{lsrv.port}) crashed"
    try:
        p = c.post("LLM 500", {"model": "always-offload", "messages": Q, "max_tokens": 8}).json()["pyrodash"]
        assert p["fallback"] and p["llm_errors"] == ["attempt 1: upstream_http_500", "attempt 2: upstream_http_500"]
        logged = [r.getMessage() for r in caplog.records if p["request_id"] in r.getMessage()]
        assert len(logged) == 2 and all(switch.fail in m for m in logged), "the log keeps the upstream's text"
        usage = {"stream": True, "stream_options": {"include_usage": True}}
        c.post("LLM 500 stream", {"model": "always-offload", "messages": Q, "max_tokens": 8, **usage})
        c.post("LLM alone, 500", {"messages": Q, "max_tokens": 8, "pyrodash": {"mode": "llm"}})
        c.post("LLM alone, 500, stream", {"messages": Q, "max_tokens": 8, "stream": True, "pyrodash": {"mode": "llm"}})
        for route, body in FRONTS.items():  # the error event of each API's stream, and its error body
            c.post(f"{route} LLM alone, 500", {**body, "pyrodash": {"mode": "llm"}}, route)
            c.post(f"{route} LLM alone, 500, stream", {**body, "stream": True, "pyrodash": {"mode": "llm"}}, route)
    finally:
        switch.fail = None


def _llm_gone(c: Seen, lsrv) -> None:
    """The LLM's server is gone."""
    lsrv.__exit__(None, None, None)
    h = c.get("/health", auth=False)
    assert h.status_code == 503 and h.json() == {"status": "degraded", "live": True, "ready": False}
    h = c.get("/health").json()
    assert h["llm"]["reachable"] is False and h["llm"]["error"]
    p = c.post("LLM down", {"model": "always-offload", "messages": Q, "max_tokens": 8}).json()["pyrodash"]
    assert p["fallback"] and p["llm_errors"] and all("upstream_unreachable" in e for e in p["llm_errors"])
    c.post("LLM down, alone", {"messages": Q, "max_tokens": 8, "pyrodash": {"mode": "llm"}})
    c.get("/metrics")


SOURCES = {"sources": True}


def test_no_response_carries_a_path_a_url_or_a_port(deployment, caplog):
    srv, lsrv, switch, needles = deployment
    caplog.set_level(logging.WARNING, logger="pyrodash.serve")
    c = Seen(srv.url)
    _anonymous(c)
    _with_key(c)
    _llm_fails(c, switch, lsrv, needles, caplog)
    _llm_gone(c, lsrv)
    assert len(c.seen) > 40
    leaks = [(label, status, needle) for label, status, text in c.seen for needle in needles if needle in text]
    assert not leaks, leaks


# ---------------------------------------------------------------- the switches


def test_metrics_can_be_made_public_and_flags_reach_the_config(tmp_path_factory):
    from test_server import make_engine, serve_config, tiny_slm

    from pyrodash.cli import build_parser
    from pyrodash.commands.serve import config_from_args

    config = serve_config(metrics_public=True)
    engine = make_engine(tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory), config)
    with UvicornThread(build_app(config, engine=engine), log_level="error") as s:
        assert httpx.get(f"{s.url}/metrics").status_code == 200  # public by the config
        assert httpx.get(f"{s.url}/v1/models").status_code == 401  # the API still needs the key
        assert "slm" not in httpx.get(f"{s.url}/health").json()
        doc = httpx.get(f"{s.url}/openapi.json").json()
        assert "401" not in doc["paths"]["/metrics"]["get"]["responses"]
    args = build_parser().parse_args(
        [
            "serve",
            "--slm",
            "s",
            "--llm",
            "http://a:1/v1#m",
            "--base-slm",
            "b",
            "--metrics-public",
            "--allow-unknown-fields",
        ]
    )
    c = config_from_args(args)
    assert (c.base_slm, c.metrics_public, c.allow_unknown_fields) == ("b", True, True)
    c = config_from_args(build_parser().parse_args(["serve", "--slm", "s", "--llm", "http://a:1/v1#m"]))
    assert (c.base_slm, c.metrics_public, c.allow_unknown_fields) == (None, False, False)
