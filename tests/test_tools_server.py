"""Agents through `pyrodash serve`: a real server on 127.0.0.1 answering tool-calling clients on every wire API
(the openai SDK's loop on chat completions, unary and streamed; the Responses API; the anthropic SDK's tool-use
loop; the Agents SDK with a `function_tool`). The task needs two calls and an answer, with a handoff mid-task whose
LLM call reaches the client; the models are the TEST DOUBLES of tests/tool_doubles.py (the built-in world's models
do not call tools)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from test_server import KEY, UvicornThread, make_engine, serve_config
from tool_doubles import OFFLOAD_ID, TASK, TOOL, run_tool, tool_pair

from pyrodash.backends.base import GenResult
from pyrodash.chat import Tools, ToolSpec
from pyrodash.record import Record
from pyrodash.server.app import build_app


@pytest.fixture(scope="module")
def server():
    slm, llm = tool_pair()
    cfg = serve_config(operating_points={"pyrodash": 0.0})
    with UvicornThread(build_app(cfg, engine=make_engine(slm, llm, cfg))) as srv:
        yield srv


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def chat_loop(client: openai.OpenAI, stream: bool, info_optional: bool = False) -> list[tuple[str, list, dict]]:
    """The openai SDK's tool loop: (finish_reason, tool calls, pyrodash object) per request, to the answer
    (`info_optional`: a proxy between may drop the `pyrodash` object: None then)."""
    messages: list = [{"role": "user", "content": TASK}]
    steps = []
    for _ in range(5):
        kw = dict(model="pyrodash", messages=messages, tools=[TOOL], max_tokens=200)
        if stream:
            finish, calls, text, info = _streamed(client, kw)
            assert info is not None or info_optional
        else:
            r = client.chat.completions.create(**kw)
            msg, finish = r.choices[0].message, r.choices[0].finish_reason
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []
            ]
            text, info = msg.content or "", (r.model_extra or {}).get("pyrodash")
            assert info is not None or info_optional
        assert "<tool_call" not in text
        steps.append((finish, calls, info))
        if finish != "tool_calls":
            return steps
        wire = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
        messages.append({"role": "assistant", "content": text or None, "tool_calls": wire})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": run_tool(c["name"], c["arguments"])} for c in calls
        ]
    raise AssertionError("no answer")


def _streamed(client, kw):
    calls: dict[int, dict] = {}
    text, finish, info = "", None, None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            d = chunk.choices[0].delta
            text += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.id or ""
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = chunk.choices[0].finish_reason or finish
        else:
            info = (chunk.model_extra or {}).get("pyrodash")
    return finish, [calls[i] for i in sorted(calls)], text, info


def assert_the_task(steps) -> None:
    (f1, c1, p1), (f2, c2, p2), (f3, c3, p3) = steps
    assert f1 == f2 == "tool_calls" and f3 == "stop" and c3 == []
    assert [json.loads(c["arguments"]) for c in c1 + c2] == [{"x": 3}, {"x": 4}]
    assert [c["by"] for c in p1["tool_calls"]] == ["slm"] and p1["handoff"] is None
    assert [c["by"] for c in p2["tool_calls"]] == ["llm"] and p2["handoff"] is not None and p2["llm_calls"] == 1
    assert p3["handoff"] is None and p3["llm_calls"] == 0  # the turn after the result starts with the SLM again
    assert [c["id"] for c in p2["tool_calls"]] == [c["id"] for c in c2]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_the_openai_sdk_tool_loop(client, stream):
    assert_the_task(chat_loop(client, stream))


def test_tool_calls_are_counted_by_writer_in_metrics(client, server):
    chat_loop(client, stream=False)
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    by = {
        ln.split("{")[1].split("}")[0]: float(ln.split()[-1])
        for ln in text.splitlines()
        if ln.startswith("pyrodash_tool_calls_total{")
    }
    assert by['by="slm"'] >= 1 and by['by="llm"'] >= 1


@pytest.mark.parametrize(
    "extra, param, code",
    [
        ({"tool_choice": "required"}, "tool_choice", "unsupported_value"),
        ({"tool_choice": {"type": "function", "function": {"name": "lookup_g"}}}, "tool_choice", "unsupported_value"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "unsupported_value"),
        ({"tools": [TOOL, TOOL]}, "tools", None),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools.0.function.name",
            "invalid_value",
        ),
    ],
)
def test_what_the_engine_cannot_honour_is_a_named_400(server, extra, param, code):
    body = {"model": "pyrodash", "messages": [{"role": "user", "content": TASK}], "tools": [TOOL], **extra}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and (code is None or err["code"] == code), err


def test_a_tool_message_without_its_call_id_is_a_400(server):
    msgs = [{"role": "user", "content": TASK}, {"role": "tool", "content": "g(3) = 11"}]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "pyrodash", "messages": msgs, "tools": [TOOL]},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.tool_call_id"


def test_tool_choice_none_answers_without_calls(client):
    r = client.chat.completions.create(
        model="pyrodash", messages=[{"role": "user", "content": TASK}], tools=[TOOL], tool_choice="none", max_tokens=200
    )
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "without the tool" in r.choices[0].message.content  # the models were shown no tool


def test_the_responses_api_tool_loop_unary_and_streamed(client):
    """function_call output items, function_call / function_call_output input items, both ways of reading them."""
    for stream in (False, True):
        items: list = [{"role": "user", "content": TASK}]
        infos = []
        for _ in range(5):
            kw = dict(model="pyrodash", input=items, tools=[RESPONSES_TOOL], max_output_tokens=200)
            if stream:
                events = list(client.responses.create(**kw, stream=True))
                kinds = [e.type for e in events]
                assert "response.function_call_arguments.delta" in kinds or kinds[-1] == "response.completed"
                r = events[-1].response
            else:
                r = client.responses.create(**kw)
            infos.append(r.model_extra["pyrodash"])
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:
                break
            items += [o.model_dump(exclude_none=True) for o in r.output]
            items += [
                {"type": "function_call_output", "call_id": c.call_id, "output": run_tool(c.name, c.arguments)}
                for c in calls
            ]
        assert [[c["by"] for c in p["tool_calls"]] for p in infos] == [["slm"], ["llm"], []], stream
        assert r.output_text.endswith("\\boxed{41}") and infos[1]["handoff"] is not None


RESPONSES_TOOL = {"type": "function", **TOOL["function"]}
ANTHROPIC_TOOL = {
    "name": "lookup_g",
    "description": "The value of g at x.",
    "input_schema": TOOL["function"]["parameters"],
}


def test_the_anthropic_sdk_tool_use_loop_unary_and_streamed(server):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    for stream in (False, True):
        messages: list = [{"role": "user", "content": TASK}]
        infos = []
        for _ in range(5):
            kw = dict(model="pyrodash", max_tokens=200, messages=messages, tools=[ANTHROPIC_TOOL])
            if stream:
                with c.messages.stream(**kw) as s:
                    events = list(s)
                    msg = s.get_final_message()
                kinds = [e.type for e in events]
                assert kinds.count("content_block_start") == 1 + sum(b.type == "tool_use" for b in msg.content)
                infos.append(next(e for e in events if e.type == "message_delta").model_extra["pyrodash"])
            else:
                msg = c.messages.create(**kw)
                infos.append(msg.model_extra["pyrodash"])
            uses = [b for b in msg.content if b.type == "tool_use"]
            if msg.stop_reason != "tool_use":
                break
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
            results = [
                {"type": "tool_result", "tool_use_id": u.id, "content": run_tool(u.name, json.dumps(u.input))}
                for u in uses
            ]
            messages.append({"role": "user", "content": results})
        assert [[c["by"] for c in p["tool_calls"]] for p in infos] == [["slm"], ["llm"], []], stream
        assert msg.stop_reason == "end_turn" and msg.content[0].text.endswith("\\boxed{41}")


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_agents_sdk_runs_the_task_with_a_function_tool(server, api, stream):
    agents = pytest.importorskip("agents", reason="openai-agents is in the test extra")
    agents.set_tracing_disabled(True)
    called = []

    @agents.function_tool
    def lookup_g(x: int) -> str:
        """The value of g at x."""
        called.append(x)
        return run_tool("lookup_g", json.dumps({"x": x}))

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    model_cls = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
    model = model_cls(model="pyrodash", openai_client=client)
    agent = agents.Agent(name="g", model=model, tools=[lookup_g], model_settings=agents.ModelSettings(max_tokens=200))
    if stream:

        async def streamed():
            run = agents.Runner.run_streamed(agent, TASK)
            kinds = [ev.type async for ev in run.stream_events()]
            return run, kinds

        result, kinds = asyncio.run(streamed())
        assert "raw_response_event" in kinds  # the model's answers arrived as streamed events
    else:
        result = agents.Runner.run_sync(agent, TASK)
    assert called == [3, 4] and result.final_output.endswith("\\boxed{41}")


def test_serve_and_the_batch_driver_agree_on_every_step_of_the_task(client):
    """Parity with tool turns: each request of the task answered by `pyrodash serve` (the stream driver, over HTTP)
    and by the engine's batch driver (what `pyrodash eval` and Stage 3 run) gives the same record: text, segments,
    handoff, calls and who wrote them, tokens and dollars."""

    slm, llm = tool_pair()
    cfg = serve_config(operating_points={"pyrodash": 0.0})
    engine = make_engine(slm, llm, cfg)
    spec = TOOL["function"]
    tools = Tools.of([ToolSpec(spec["name"], spec["description"], spec["parameters"])])
    messages: list = [{"role": "user", "content": TASK}]
    same = ("segments", "handoff", "finish_reason", "slm_in", "slm_out", "llm_in", "llm_out", "llm_calls", "cost_usd")
    for _ in range(3):
        r = client.chat.completions.create(model="pyrodash", messages=messages, tools=[TOOL], max_tokens=200)
        served = r.model_extra["pyrodash"]
        opts = [{"tools": tools, "max_tokens": 200}]
        rec = Record.from_done(engine.batch([messages], options=opts)[0]).to_json()
        # Stage 3's path: the SLM's generation made elsewhere (a rollout), handed to the batch driver
        rollout = Record.from_done(
            engine.batch([messages], options=opts, slm_results=[_rollout(engine, messages, tools)])[0]
        )
        for other in (rec, rollout.to_json()):
            assert {k: served[k] for k in same} == {k: other[k] for k in same}
            assert [(c["name"], c["arguments"], c["by"]) for c in served["tool_calls"]] == [
                (c["name"], c["arguments"], c["by"]) for c in other["tool_calls"]
            ]
        msg = r.choices[0].message
        if r.choices[0].finish_reason != "tool_calls":
            break
        messages.append(msg.model_dump(exclude_none=True))
        for c in msg.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)}
            )


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/responses", {"input": TASK, "tools": [RESPONSES_TOOL], "tool_choice": "required"}),
        ("/v1/responses", {"input": TASK, "tools": [RESPONSES_TOOL],
                           "tool_choice": {"type": "function", "name": "lookup_g"}}),
        ("/v1/messages", {"messages": [{"role": "user", "content": TASK}], "max_tokens": 9, "tools": [ANTHROPIC_TOOL],
                          "tool_choice": {"type": "any"}}),
        ("/v1/messages", {"messages": [{"role": "user", "content": TASK}], "max_tokens": 9, "tools": [ANTHROPIC_TOOL],
                          "tool_choice": {"type": "tool", "name": "lookup_g"}}),
    ],
)  # fmt: skip
def test_a_forced_call_is_refused_by_name_on_every_api(server, route, body):
    r = httpx.post(
        f"{server.url}{route}", json={"model": "pyrodash", **body}, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 400 and "cannot force a tool call" in r.text, r.text


def _rollout(engine, messages: list, tools):
    """The SLM's generation for the engine's own SLM request (P_s, the history, the tools), as a Stage 3 rollout
    hands it over (`GenResult`: its text, one id per streamed piece, the `<offload>` id as its stop when it hands
    off)."""
    req = engine.slm_request(messages, tools=tools, max_tokens=200)

    async def run():
        return [ch async for ch in engine.slm.stream(req)]

    chunks = asyncio.run(run())
    last = chunks[-1]
    ids = [i for ch in chunks for i in ch.token_ids] + ([OFFLOAD_ID] if last.stop_token_id else [])
    text = "".join(ch.text for ch in chunks)
    return GenResult(text=text, token_ids=ids, finish_reason="stop", stop_token_id=last.stop_token_id,
                     prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens)  # fmt: skip
