"""/metrics through prometheus_client (same names and labels as the hand-written exporter had), metrics of other
modules in the same exposition, and the `x-pyrodash-overhead-ms` header on every response.

The server under test is `benchmarks/server_load.py`'s app: `build_app` + CollaborateEngine over two scripted
in-process backends (TEST DOUBLES, no model), driven in process through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import httpx
import prometheus_client
import pytest
from test_scaling import parse_metrics

from pyrodash.cost import Usage
from pyrodash.events import Done
from pyrodash.server.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
CHAT = "/v1/chat/completions"
Q = [{"role": "user", "content": "2+2?"}]

# every series of the hand-written exporter: name -> its label names (histograms: their _bucket/_sum/_count)
SERIES = {
    "pyrodash_requests_total": {"route", "model", "status"},
    "pyrodash_requests_in_flight": set(),
    "pyrodash_handoffs_total": {"model"},
    "pyrodash_fallbacks_total": {"model"},
    "pyrodash_llm_errors_total": {"model"},
    "pyrodash_outside_handoff_share_total": {"model"},
    "pyrodash_usage_estimated_total": {"model"},
    "pyrodash_errors_total": {"kind"},
    "pyrodash_tokens_total": {"component"},
    "pyrodash_llm_calls_total": {"model"},
    "pyrodash_cost_usd_total": {"model"},
    "pyrodash_history_trimmed_messages_total": {"side"},
    "pyrodash_history_trimmed_requests_total": {"side"},
    "pyrodash_llm_endpoint_tokens_total": {"endpoint", "component"},
    "pyrodash_llm_endpoint_calls_total": {"endpoint"},
    "pyrodash_llm_endpoint_errors_total": {"endpoint"},
    "pyrodash_llm_endpoint_cost_usd_total": {"endpoint"},
    **{
        f"{h}{s}": {"model"} | ({"le"} if s == "_bucket" else set())
        for h in (
            "pyrodash_request_duration_seconds",
            "pyrodash_time_to_first_token_seconds",
            "pyrodash_overhead_seconds",
        )
        for s in ("_bucket", "_sum", "_count")
    },
}
TYPES = {
    "pyrodash_requests_total": "counter",
    "pyrodash_requests_in_flight": "gauge",
    "pyrodash_cost_usd_total": "counter",
    "pyrodash_request_duration_seconds": "histogram",
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _done() -> Done:
    usage = Usage(slm_in=10, slm_out=5, llm_in=20, llm_out=7, llm_cached_in=3, llm_calls=2)
    ep = {
        "endpoint": "big",
        "calls": 2,
        "llm_in": 20,
        "llm_out": 7,
        "llm_cached_in": 3,
        "chars": 30,
        "price": None,
        "cost_usd": 0.25,
        "errors": 1,
    }
    return Done(
        output="ab",
        slm_text="a",
        llm_text="b",
        usage=usage,
        cost_usd=0.5,
        finish_reason="stop",
        handoff=5,
        handoff_admitted=False,
        fallback=True,
        errors=["attempt 1: boom"],
        usage_estimated=True,
        trimmed={"slm": 2, "llm": 0},
        llm_endpoints=[ep],
    )


def test_names_labels_and_values_of_the_hand_written_exporter_are_kept():
    m = Metrics()
    m.requests.inc(route=CHAT, model="pyrodash", status="200")
    m.errors.inc(kind="disconnect")
    m.in_flight.inc()
    m.in_flight.dec()
    m.observe_done(_done(), "pyrodash", latency_s=0.8, ttft_s=0.05, overhead_s=0.0004)
    text = m.render()
    got = parse_metrics(text)
    for name, labels in SERIES.items():
        assert name in got, f"{name} is missing from /metrics"
        assert all({k for k, _ in key} == labels for key in got[name]), (name, list(got[name]))
    for name, kind in TYPES.items():
        assert f"# TYPE {name} {kind}" in text
    one = {"model": "pyrodash"}

    def value(name: str, **labels: str) -> float:
        return got[name][tuple(sorted(labels.items()))]

    assert value("pyrodash_requests_total", route=CHAT, model="pyrodash", status="200") == 1
    assert value("pyrodash_requests_in_flight") == 0 and value("pyrodash_errors_total", kind="disconnect") == 1
    for comp, n in (("slm_in", 10), ("slm_out", 5), ("llm_in", 20), ("llm_out", 7), ("llm_cached_in", 3)):
        assert value("pyrodash_tokens_total", component=comp) == n
    assert value("pyrodash_cost_usd_total", **one) == 0.5 and value("pyrodash_llm_calls_total", **one) == 2
    for name in ("handoffs", "fallbacks", "outside_handoff_share", "usage_estimated", "llm_errors"):
        assert value(f"pyrodash_{name}_total", **one) == 1
    assert value("pyrodash_history_trimmed_messages_total", side="slm") == 2
    assert ("side", "llm") not in {kv for key in got["pyrodash_history_trimmed_messages_total"] for kv in key}
    assert value("pyrodash_llm_endpoint_tokens_total", endpoint="big", component="llm_cached_in") == 3
    assert value("pyrodash_llm_endpoint_errors_total", endpoint="big") == 1
    assert value("pyrodash_llm_endpoint_cost_usd_total", endpoint="big") == 0.25
    assert value("pyrodash_request_duration_seconds_count", **one) == 1
    assert value("pyrodash_request_duration_seconds_bucket", model="pyrodash", le="1.0") == 1
    assert value("pyrodash_request_duration_seconds_bucket", model="pyrodash", le="0.5") == 0
    assert value("pyrodash_overhead_seconds_bucket", model="pyrodash", le="0.0005") == 1
    # the substrings the other tests (and people's greps) look for still match
    assert 'pyrodash_llm_errors_total{model="pyrodash"} 1' in text and "pyrodash_requests_in_flight 0" in text
    assert "_created" not in text
    assert m.requests.get(route=CHAT, model="pyrodash", status="200") == 1 and m.latency.count(model="pyrodash") == 1
    with pytest.raises(ValueError):
        m.cost.inc(-1.0, model="pyrodash")  # a counter only goes up


def test_other_modules_metrics_come_out_of_the_same_exposition():
    """What a spend pacer does: its own prometheus_client metrics, on the default registry or the app's."""
    on_default = prometheus_client.Gauge("pyrodash_budget_test_spend_fraction", "test gauge", ["budget"])
    try:
        m = Metrics()
        on_app = prometheus_client.Counter("pyrodash_budget_test_requests", "test counter", registry=m.registry)
        on_default.labels(budget="team-a").set(0.25)
        on_app.inc(3)
        got = parse_metrics(m.render())
        assert got["pyrodash_budget_test_spend_fraction"][(("budget", "team-a"),)] == 0.25
        assert got["pyrodash_budget_test_requests_total"][()] == 3
        assert "pyrodash_requests_total" in m.render().replace("# HELP", "")
        assert "pyrodash_budget_test_requests_total" not in Metrics().render()  # each app's registry is its own
    finally:
        prometheus_client.REGISTRY.unregister(on_default)


async def _requests(app) -> dict:
    out = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30) as c:
        out["models"] = await c.get("/v1/models")
        out["missing"] = await c.get("/nowhere")
        out["bad_json"] = await c.post(CHAT, content=b"{nope", headers={"content-type": "application/json"})
        out["unary"] = await c.post(CHAT, json={"model": "pyrodash", "messages": Q, "max_tokens": 64})
        out["stream"] = await c.post(
            CHAT,
            json={
                "model": "pyrodash",
                "messages": Q,
                "max_tokens": 64,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        out["metrics"] = await c.get("/metrics")
    return out


def test_every_response_says_the_time_spent_in_pyrodash():
    """`x-pyrodash-overhead-ms` on every response (2xx, 4xx, streams); the full figure in the stream's usage chunk
    and the unary body; a small share of the request's time here, where the scripted models take >= 40 ms."""
    app = _load("server_load").pyrodash_app(tokens=4, token_s=0.005, streams=4)
    r = asyncio.run(_requests(app))
    assert [r[k].status_code for k in r] == [200, 404, 400, 200, 200, 200]
    ms = {k: float(v.headers["x-pyrodash-overhead-ms"]) for k, v in r.items()}
    assert all(v >= 0 for v in ms.values()), ms
    unary = r["unary"].json()["pyrodash"]["overhead_ms"]
    assert 0 <= unary < 40 and ms["unary"] >= unary  # the header is taken later (the response's status line)
    events = [json.loads(line[6:]) for line in r["stream"].text.splitlines() if line.startswith("data: {")]
    full = events[-1]["pyrodash"]["overhead_ms"]
    assert 0 <= ms["stream"] <= full < 40  # the header: up to the first token; the usage chunk: up to the end
    got = parse_metrics(r["metrics"].text)
    assert got["pyrodash_overhead_seconds_count"][(("model", "pyrodash"),)] == 2
    assert r["metrics"].headers["content-type"].startswith("text/plain; version=0.0.4")
