"""No client input makes POST /v1/responses or /v1/messages answer 5xx or break the server's own schema: schemathesis
over the server's OpenAPI document (positive and negative modes, ALL its checks, as tests/test_server_fuzz.py runs
them for the chat routes), and hypothesis posting arbitrary JSON and valid requests with one field replaced; every
refusal is the route's API's error body (OpenAI's, Anthropic's)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_server_fuzz import AUTH, FUZZ, JSON, _header, http, server  # noqa: F401 - module fixtures

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from test_server_fuzz import schemathesis_run  # noqa: E402

ROUTES = ("/v1/responses", "/v1/messages")
VALID = {
    "/v1/responses": {"model": "pyrodash", "input": "1+1", "max_output_tokens": 3},
    "/v1/messages": {"model": "pyrodash", "messages": [{"role": "user", "content": "1+1"}], "max_tokens": 3},
}
ENDS = {  # the last event of an accepted stream
    "/v1/responses": ("event: response.completed", "event: response.incomplete"),
    "/v1/messages": ("event: message_stop",),
}
FIELDS = ["model", "input", "instructions", "messages", "system", "max_tokens", "max_output_tokens", "temperature",
          "top_p", "stream", "stop_sequences", "tools", "metadata", "pyrodash"]  # fmt: skip


def _check(route: str, status: int, headers, text: str) -> None:
    """Never a 5xx; a refusal is the route's error body; an accepted stream carries no error event."""
    assert status < 500, f"{status}: {text[:500]}"
    if status >= 400:
        body = json.loads(text)
        if route == "/v1/messages":
            assert list(body) == ["type", "error"] and body["type"] == "error"
            assert list(body["error"]) == ["type", "message"] and body["error"]["message"]
        else:
            assert list(body["error"]) == ["message", "type", "param", "code"] and body["error"]["message"]
    if status == 200 and _header(headers, "content-type").startswith("text/event-stream"):
        last = [line for line in text.splitlines() if line.startswith("event: ")][-1]
        assert "event: error" not in text and last in ENDS[route], text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda g: g.value)
@pytest.mark.parametrize("route", ROUTES)
def test_schemathesis_all_checks(server, route, mode):  # noqa: F811
    schemathesis_run(server.url, route, "POST", mode, lambda *r: _check(route, *r))


@FUZZ
@given(body=JSON, route=st.sampled_from(ROUTES))
def test_arbitrary_json_bodies_get_4xx_not_5xx(http, body, route):  # noqa: F811
    r = http.post(route, content=json.dumps(body))
    _check(route, r.status_code, r.headers, r.text)


@FUZZ
@given(field=st.sampled_from(FIELDS), value=JSON, stream=st.booleans())
def test_one_wrong_field_in_a_valid_request(http, field, value, stream):  # noqa: F811
    for route in ROUTES:
        body = {**VALID[route], "stream": stream, field: value}
        r = http.post(route, content=json.dumps(body))
        _check(route, r.status_code, r.headers, r.text)
