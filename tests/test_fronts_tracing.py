"""The Responses and Messages APIs are traced as chat is (tests/test_tracing.py's scripted app, in process): one
server span named after the route, with the route, the model, the tokens, the dollars and the handoff."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra: pip install 'pyrodash[otel]'")
from test_tracing import Q, _app  # noqa: E402

BODIES = {"/v1/responses": {"input": Q, "max_output_tokens": 16}, "/v1/messages": {"messages": Q, "max_tokens": 16}}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("route", list(BODIES))
def test_each_route_is_one_span_with_tokens_dollars_and_the_handoff(route, stream):
    app, exporter = _app()

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30) as c:
            return await c.post(route, json={"model": "pyrodash", "stream": stream, **BODIES[route]})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.name == f"POST {route}"]
    a = root.attributes
    assert a["http.route"] == route and a["http.response.status_code"] == 200 and a["pyrodash.stream"] is stream
    assert a["gen_ai.request.model"] == "pyrodash" and a["pyrodash.handoff"] == 4 and a["pyrodash.llm_calls"] == 1
    assert a["pyrodash.cost_usd"] > 0 and a["pyrodash.tokens.llm_out"] > 0
    assert sorted(s.name for s in spans if s is not root) == ["handoff", "llm.call", "slm.decode"]
