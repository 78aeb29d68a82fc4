"""Anthropic's Messages API on `pyrodash serve` (POST /v1/messages), driven by the official `anthropic` SDK over real
HTTP and real tiny models: the message object and its events in the API's order, the handoff and the `pyrodash`
cost, the key as `x-api-key` or bearer, and every refusal in Anthropic's error shape."""

from __future__ import annotations

import json

import httpx
import pytest
from front_stack import QUESTION, assert_mid_handoff, front_stack
from test_server import KEY

anthropic = pytest.importorskip("anthropic", reason="anthropic is in the test extra")
ASK = [{"role": "user", "content": QUESTION}]
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
ORDER = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with front_stack(tmp_path_factory) as (srv, _):
        yield srv


@pytest.fixture()
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_create_gives_a_message_with_handoff_and_cost(client):
    m = client.messages.create(model="mid", max_tokens=24, messages=ASK)
    p = m.model_extra["pyrodash"]
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "mid"
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert_mid_handoff(p, m.content[0].text)
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens == p["slm_in"] + p["llm_in"]
    assert u.output_tokens == p["slm_out"] + p["llm_out"] and u.cache_creation_input_tokens == 0


def test_system_and_text_blocks_are_the_chat_request(client, server):
    system = [{"type": "text", "text": "Be brief."}]
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "Start 1: +1.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": QUESTION},
    ]
    m = client.messages.create(model="mid", max_tokens=16, system=system, messages=msgs)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Start 1: +1."}]
    chat += [{"role": "assistant", "content": "2"}, {"role": "user", "content": QUESTION}]
    body = {"model": "mid", "messages": chat, "max_tokens": 16}
    c = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}).json()
    assert m.content[0].text == c["choices"][0]["message"]["content"]
    assert m.model_extra["pyrodash"]["slm_in"] == c["pyrodash"]["slm_in"]


def test_stream_events_in_order_with_the_handoff_and_the_cost(client):
    whole = client.messages.create(model="mid", max_tokens=24, messages=ASK)
    extra = {"pyrodash": {"sources": True}}
    with client.messages.stream(model="mid", max_tokens=24, messages=ASK, extra_body=extra) as stream:
        events = [e for e in stream if e.type not in ("text",)]  # (the SDK's own text events)
        final = stream.get_final_message()
    kinds = [e.type for e in events]  # (the SDK drops pings)
    assert _runs(kinds) == [k for k in ORDER if k != "ping"] + ["message_delta", "message_stop"]
    deltas = [e for e in events if e.type == "content_block_delta"]
    tags = [e.model_extra["pyrodash"]["source"] for e in deltas]
    assert set(tags[: tags.index("handoff")]) == {"slm"} and "llm" in tags[tags.index("handoff") :]
    assert final.content[0].text == whole.content[0].text == "".join(e.delta.text for e in deltas)
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert_mid_handoff(delta.model_extra["pyrodash"], final.content[0].text)


def _runs(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]


def test_the_raw_stream_has_the_apis_events_with_a_ping(server):
    body = {"model": "mid", "max_tokens": 8, "messages": ASK, "stream": True}
    r = httpx.post(f"{server.url}/v1/messages", json=body, headers=HEADERS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    kinds = [line[len("event: ") :] for line in r.text.splitlines() if line.startswith("event: ")]
    datas = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert _runs(kinds) == [*ORDER, "message_delta", "message_stop"] and [d["type"] for d in datas] == kinds


def test_the_key_as_x_api_key_or_bearer_and_401_in_anthropics_shape(server):
    body = {"model": "slm-only", "max_tokens": 3, "messages": ASK}
    ok = httpx.post(f"{server.url}/v1/messages", json=body, headers=HEADERS)
    bearer = httpx.post(f"{server.url}/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == bearer.status_code == 200 and ok.json()["type"] == "message"
    for headers in ({"x-api-key": "wrong"}, {}):
        r = httpx.post(f"{server.url}/v1/messages", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["message"]
    with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError):
            c.messages.create(model="slm-only", max_tokens=3, messages=ASK)


@pytest.mark.parametrize(
    ("body", "kind", "says"),
    [
        ({"max_tokens": None}, "invalid_request_error", "max_tokens"),
        ({"messages": []}, "invalid_request_error", "messages"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "invalid_request_error", "tools.0.type"),
        ({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"}}, "invalid_request_error",
         "tool_choice"),  # (client tools are served: tests/test_tools_server.py; a forced call is not)
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "invalid_request_error", "thinking"),
        ({"top_k": 5}, "invalid_request_error", "top_k"),
        ({"temperature": 1.5}, "invalid_request_error", "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "invalid_request_error",
         "messages.0.content.0.type"),
        ({"system": [{"type": "document", "source": {}}]}, "invalid_request_error", "system.0.type"),
        ({"messages": [{"role": "system", "content": "x"}]}, "invalid_request_error", "messages.0.role"),
        ({"model": "nope"}, "not_found_error", "model"),
        ({"max_tokens": 10**6}, "invalid_request_error", "max_tokens"),
    ],
)  # fmt: skip
def test_bad_input_gets_anthropics_error_shape(server, body, kind, says):
    full = {"model": "slm-only", "max_tokens": 3, "messages": ASK, **body}
    full = {k: v for k, v in full.items() if v is not None}
    r = httpx.post(f"{server.url}/v1/messages", json=full, headers=HEADERS)
    assert r.status_code == (404 if kind == "not_found_error" else 400), r.text
    assert r.json() == {"type": "error", "error": {"type": kind, "message": r.json()["error"]["message"]}}
    assert says in r.json()["error"]["message"]


def test_the_sdk_raises_its_own_errors(client):
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="slm-only", max_tokens=3, messages=ASK, thinking={"type": "enabled", "budget_tokens": 9}
        )
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=3, messages=ASK)
