"""OpenTelemetry traces of `pyrodash serve`: one span per request, children for the SLM decode, the handoff and each
LLM call, tokens and dollars as attributes; exported by the SDK (in memory) and over OTLP/HTTP to a receiver.

The server is `build_app` + CollaborateEngine over `benchmarks/server_load.py`'s scripted in-process backends (TEST
DOUBLES: the SLM streams 4 tokens then stops on `<offload>`, the LLM streams 4 more), driven in process through
httpx's ASGI transport. The OTLP test runs a real `pyrodash serve --otlp-endpoint` process in front of
`benchmarks/engine_overhead.py`'s scripted OpenAI-compatible server, exporting to a minimal OTLP/HTTP receiver here
that decodes the protobuf requests the collector protocol defines.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra: pip install 'pyrodash[otel]'")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402
from servers import free_port, stop  # noqa: E402

from pyrodash.backends.base import BackendError  # noqa: E402
from pyrodash.cost import Prices  # noqa: E402
from pyrodash.engine import CollaborateEngine, FailurePolicy  # noqa: E402
from pyrodash.prompts import get_prompts  # noqa: E402
from pyrodash.server.app import build_app  # noqa: E402
from pyrodash.server.config import ServeConfig  # noqa: E402
from pyrodash.server.tracing import Tracing, traces_url  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripted doubles (a spawned server process imports them too)
import engine_overhead  # noqa: E402
import server_load  # noqa: E402

CHAT = "/v1/chat/completions"
Q = [{"role": "user", "content": "2+2?"}]
PARENT_TRACE, PARENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class FailingLLM(server_load.ScriptedBackend):
    """TEST DOUBLE: an LLM endpoint that refuses every call (a 503 from the server)."""

    async def stream(self, req):
        raise BackendError("HTTP 503 from the test double: overloaded", status=503)
        yield  # an async generator


def _app(llm=None):
    slm, scripted_llm = server_load.scripted_pair(4, 0.002)
    engine = CollaborateEngine(
        slm,
        llm or scripted_llm,
        get_prompts("world-v1"),
        Prices.from_yaml("paper"),
        failure=FailurePolicy(retries=1, backoff_s=0.0),
    )
    app = build_app(ServeConfig(prompts="world-v1", api_key_env=None), engine=engine)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.state.tracing = Tracing(provider)
    return app, exporter


def _post(app, body: dict, headers: dict | None = None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30) as c:
            return await c.post(CHAT, json={"model": "pyrodash", "messages": Q, **body}, headers=headers)

    return asyncio.run(go())


def _tree(exporter) -> tuple[object, dict[str, list]]:
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == f"POST {CHAT}"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    kids: dict[str, list] = {}
    for s in spans:
        if s is not root:
            assert s.parent is not None and s.parent.span_id == root.context.span_id, s.name
            assert s.context.trace_id == root.context.trace_id
            kids.setdefault(s.name, []).append(s)
    exporter.clear()
    return root, kids


def _info(r: httpx.Response, stream: bool) -> dict:
    if not stream:
        return r.json()["pyrodash"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return events[-1]["pyrodash"]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_request_span_with_slm_handoff_and_llm_children_carrying_tokens_and_dollars(stream):
    app, exporter = _app()
    body = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    r = _post(app, body)
    assert r.status_code == 200
    info = _info(r, stream)
    root, kids = _tree(exporter)
    assert sorted(kids) == ["handoff", "llm.call", "slm.decode"] and all(len(v) == 1 for v in kids.values())
    slm, handoff, llm = kids["slm.decode"][0], kids["handoff"][0], kids["llm.call"][0]
    a = root.attributes
    assert root.kind == SpanKind.SERVER and a["http.route"] == CHAT and a["http.response.status_code"] == 200
    assert a["gen_ai.request.model"] == "pyrodash" and a["pyrodash.stream"] is stream
    for comp in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in"):
        assert a[f"pyrodash.tokens.{comp}"] == info[comp]
    assert a["pyrodash.cost_usd"] == pytest.approx(info["cost_usd"])
    for comp, usd in info["cost_usd_by_component"].items():
        assert a[f"pyrodash.cost_usd.{comp}"] == pytest.approx(usd)
    assert a["pyrodash.handoff"] == info["handoff"] == 4 and a["pyrodash.llm_calls"] == 1
    assert 0 <= a["pyrodash.overhead_ms"]
    assert slm.attributes["gen_ai.usage.input_tokens"] == info["slm_in"]
    assert slm.attributes["gen_ai.usage.output_tokens"] == info["slm_out"]
    assert slm.attributes["pyrodash.cost_usd"] == pytest.approx(
        info["cost_usd_by_component"]["slm_in"] + info["cost_usd_by_component"]["slm_out"]
    )
    assert handoff.attributes["pyrodash.handoff.slm_tokens"] == 4
    ep = info["llm_endpoints"][0]
    assert llm.attributes["pyrodash.llm.endpoint"] == ep["endpoint"] and llm.attributes["pyrodash.llm.calls"] == 1
    assert (llm.attributes["gen_ai.usage.input_tokens"], llm.attributes["gen_ai.usage.output_tokens"]) == (
        info["llm_in"],
        info["llm_out"],
    )
    assert llm.attributes["pyrodash.cost_usd"] == pytest.approx(ep["cost_usd"])
    # in time: the request holds them all; the SLM decodes, then the handoff, then the LLM writes
    assert root.start_time <= slm.start_time <= slm.end_time == handoff.start_time == llm.start_time
    assert handoff.end_time <= llm.end_time <= root.end_time
    assert slm.end_time - slm.start_time >= 4 * 2_000_000  # 4 tokens at 2 ms: the scripted SLM's decode
    assert llm.end_time - handoff.end_time >= 3 * 2_000_000  # the LLM's tokens after its first


def test_no_handoff_traces_the_slm_alone_and_traceparent_joins_the_callers_trace():
    app, exporter = _app()
    r = _post(app, {"offload_bias": -100}, headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"})
    assert r.status_code == 200 and r.json()["pyrodash"]["handoff"] is None
    root, kids = _tree(exporter)
    assert list(kids) == ["slm.decode"] and root.attributes["pyrodash.handoff"] == -1
    assert root.attributes["pyrodash.tokens.llm_in"] == 0 and root.attributes["pyrodash.llm_calls"] == 0
    assert format(root.context.trace_id, "032x") == PARENT_TRACE
    assert format(root.parent.span_id, "016x") == PARENT_SPAN


def test_a_failed_handoff_has_error_events_and_a_fallback_span():
    app, exporter = _app(FailingLLM("l", 4, 0.0, offload=False))
    r = _post(app, {})
    assert r.status_code == 200 and r.json()["pyrodash"]["fallback"] is True
    root, kids = _tree(exporter)
    assert sorted(kids) == ["handoff", "llm.call", "slm.decode", "slm.fallback"]
    assert all(s.status.status_code == StatusCode.ERROR for s in kids["llm.call"])
    assert [e.name for e in root.events] == ["llm.error", "llm.error"]  # the first attempt and its one retry
    assert root.attributes["pyrodash.fallback"] is True and root.status.status_code != StatusCode.ERROR


def test_errors_before_the_engine_are_not_traced_and_tracing_off_costs_nothing():
    app, exporter = _app()
    assert _post(app, {"max_tokens": -1}).status_code == 400
    assert exporter.get_finished_spans() == ()
    app.state.tracing = None
    assert _post(app, {}).status_code == 200 and exporter.get_finished_spans() == ()


def test_traces_url():
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("https://otel.example/v1/traces") == "https://otel.example/v1/traces"
    with pytest.raises(ValueError, match="otlp-endpoint"):
        traces_url("127.0.0.1:4318")


class _Receiver(BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP trace receiver: decodes each ExportTraceServiceRequest (protobuf) it is sent."""

    spans: list = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        msg = ExportTraceServiceRequest()
        msg.ParseFromString(self.rfile.read(int(self.headers["content-length"])))
        assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
        for rs in msg.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: a.value for a in s.attributes}
                    type(self).spans.append((service, s.name, s.trace_id.hex(), attrs))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_pyrodash_serve_exports_over_otlp_http(tmp_path):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra")
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Receiver.spans = []
    upstream, up = engine_overhead.scripted_server_process(12, 5, 0.0)
    port = free_port()
    env = server_load.serve_env()
    cmd = server_load.serve_argv(upstream, port, "--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            threading.Event().wait(0.2)
        r = httpx.post(
            f"{url}{CHAT}",
            json={"model": "pyrodash", "messages": Q, "max_tokens": 64},
            timeout=30,
            headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"},
        )
        assert r.status_code == 200 and r.json()["pyrodash"]["handoff"] == 5
    finally:
        stop(proc, signal.SIGINT)  # a clean stop flushes the batch of spans not exported yet
        up.terminate()
        receiver.shutdown()
    names = sorted(name for _, name, _, _ in _Receiver.spans)
    assert names == ["POST /v1/chat/completions", "handoff", "llm.call", "slm.decode"], names
    assert {svc for svc, *_ in _Receiver.spans} == {"pyrodash"}
    assert {trace for _, _, trace, _ in _Receiver.spans} == {PARENT_TRACE}
    root = next(attrs for _, name, _, attrs in _Receiver.spans if name.startswith("POST"))
    assert root["pyrodash.tokens.llm_out"].int_value == 7 and root["pyrodash.cost_usd"].double_value > 0
