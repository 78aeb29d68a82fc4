"""OpenAI's Responses API on `pyrodash serve` (POST /v1/responses), driven by the official `openai` SDK and by
OpenAI's Agents SDK over real HTTP and real tiny models: the response object and its events in the API's order, the
handoff and the `pyrodash` cost, the 400s naming what the engine cannot honour, the route in /metrics."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from front_stack import QUESTION, assert_mid_handoff, front_stack
from test_server import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}
ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
PART = "input.0.content.0.type"
DONE_Q = "Start 5: *2, h."  # at "mid" the SLM hands off late and the LLM ends the answer within 60 tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with front_stack(tmp_path_factory) as (srv, _):
        yield srv


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_unary_response_object_with_handoff_and_cost(client):
    r = client.responses.create(model="mid", input=QUESTION, max_output_tokens=24)
    p = r.model_extra["pyrodash"]
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "mid"
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert [c.type for c in r.output[0].content] == ["output_text"] and r.output_text == r.output[0].content[0].text
    assert_mid_handoff(p, r.output_text)
    u = r.usage
    assert u.input_tokens == p["slm_in"] + p["llm_in"] and u.output_tokens == p["slm_out"] + p["llm_out"]
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # cut at the budget
    done = client.responses.create(model="mid", input=DONE_Q, max_output_tokens=60, instructions=None)
    assert done.status == "completed" and done.incomplete_details is None


def test_instructions_and_message_items_are_the_chat_request(client):
    """`instructions` + message items reach the engine as the same chat messages: the same greedy answer."""
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Start 1: +1."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "2", "annotations": []}]},
        {"role": "user", "content": QUESTION},
    ]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Start 1: +1."}]
    chat += [{"role": "assistant", "content": "2"}, {"role": "user", "content": QUESTION}]
    r = client.responses.create(model="mid", input=items, instructions="Be brief.", max_output_tokens=16)
    c = client.chat.completions.create(model="mid", messages=chat, max_tokens=16)
    assert r.output_text == c.choices[0].message.content
    assert r.model_extra["pyrodash"]["slm_in"] == c.model_extra["pyrodash"]["slm_in"]


def test_stream_events_in_order_with_the_handoff_and_the_cost(client):
    whole = client.responses.create(model="mid", input=QUESTION, max_output_tokens=24)
    events = list(
        client.responses.create(
            model="mid", input=QUESTION, max_output_tokens=24, stream=True, extra_body={"pyrodash": {"sources": True}}
        )
    )
    kinds = [e.type for e in events]
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == [*ORDER, "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    tags = [e.model_extra["pyrodash"]["source"] for e in deltas]
    first_llm = tags.index("llm")
    assert set(tags[: tags.index("handoff")]) == {"slm"} and tags.index("handoff") < first_llm
    text = "".join(e.delta for e in deltas)
    final = events[-1].response
    assert text == whole.output_text == final.output_text and final.status == "incomplete"
    assert events[-4].text == text and events[-2].item.content[0].text == text
    assert final.model_extra["pyrodash"]["handoff"] == whole.model_extra["pyrodash"]["handoff"]
    assert_mid_handoff(final.model_extra["pyrodash"], text)
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_the_agents_sdk_runs_one_turn(server):
    agents = pytest.importorskip("agents", reason="openai-agents is in the test extra")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    model = agents.OpenAIResponsesModel(model="mid", openai_client=client)
    agent = agents.Agent(name="pyrodash", model=model, model_settings=agents.ModelSettings(max_tokens=60))
    result = agents.Runner.run_sync(agent, DONE_Q)
    [raw] = result.raw_responses
    assert result.final_output and raw.usage.output_tokens > 0 and raw.response_id.startswith("resp_")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as c:
        r = c.responses.create(model="mid", input=DONE_Q, max_output_tokens=60)
    assert result.final_output == r.output_text  # the agent got the engine's answer (greedy: the same text)
    p = r.model_extra["pyrodash"]
    assert p["handoff"] is not None and p["llm_out"] > 0 and raw.usage.output_tokens == p["slm_out"] + p["llm_out"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),  # hosted tools (function tools are served)
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, PART),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, PART),
        ({"input": [{"type": "reasoning", "id": "r", "summary": []}]}, "input.0.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"model": "nope"}, "model"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_what_the_engine_cannot_honour_is_a_400_naming_it(server, body, param):
    r = httpx.post(f"{server.url}/v1/responses", json={"input": "hi", **body}, headers=AUTH)
    err = r.json()["error"]
    assert r.status_code == (404 if param == "model" else 400) and err["param"] == param, r.text
    assert list(err) == ["message", "type", "param", "code"] and err["message"]


def test_the_route_is_labelled_in_metrics(server, client):
    client.responses.create(model="slm-only", input="hi", max_output_tokens=3)
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    line = 'pyrodash_requests_total{model="slm-only",route="/v1/responses",status="200"}'
    assert any(x.startswith(line) for x in text.splitlines())
    r = httpx.post(f"{server.url}/v1/responses", content=b"{", headers=AUTH)
    assert r.status_code == 400 and json.loads(r.text)["error"]["code"] == "invalid_json"
