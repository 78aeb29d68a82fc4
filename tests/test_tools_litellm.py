"""A real LiteLLM proxy in front of `pyrodash serve` with tools: the openai SDK's tool loop (chat completions, through
LiteLLM's `openai/` provider) and the anthropic SDK's tool-use loop (its `anthropic/` provider, to the Messages API)
run the task of tests/tool_doubles.py end to end, the LLM's call after a handoff reaching the client through the
proxy. The models are those TEST DOUBLES (models that call tools); LiteLLM runs from its own venv, as in
tests/test_fronts_litellm.py."""

from __future__ import annotations

import json

import openai
import pytest
from test_readme_endpoints import LITELLM_MASTER, litellm_proxy
from test_server import KEY, UvicornThread, make_engine, serve_config
from test_tools_server import ANTHROPIC_TOOL, chat_loop
from tool_doubles import TASK, run_tool, tool_pair

from pyrodash.server.app import build_app

MASTER = LITELLM_MASTER


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    slm, llm = tool_pair()
    cfg = serve_config(operating_points={"pyrodash": 0.0})
    with UvicornThread(build_app(cfg, engine=make_engine(slm, llm, cfg))) as srv:
        routes = {"claude-pd": ("anthropic/pyrodash", srv.url), "gpt-pd": ("openai/pyrodash", f"{srv.url}/v1")}
        with litellm_proxy(routes, KEY, tmp_path_factory.mktemp("litellm-tools")) as url:
            yield url


class _Renamed:
    """The proxy's model name in place of the server's (chat_loop asks for "pyrodash")."""

    def __init__(self, client: openai.OpenAI, model: str) -> None:
        self.client, self.model = client, model
        self.chat = self
        self.completions = self

    def create(self, **kw):
        return self.client.chat.completions.create(**{**kw, "model": self.model})


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_the_openai_sdk_tool_loop_through_litellm(proxy, stream):
    with openai.OpenAI(base_url=f"{proxy}/v1", api_key=MASTER, max_retries=0, timeout=120) as c:
        steps = chat_loop(_Renamed(c, "gpt-pd"), stream, info_optional=True)
    finishes = [f for f, _, _ in steps]
    args = [json.loads(call["arguments"]) for _, calls, _ in steps for call in calls]
    assert finishes == ["tool_calls", "tool_calls", "stop"] and args == [{"x": 3}, {"x": 4}]


@pytest.mark.slow
def test_the_anthropic_tool_use_loop_through_litellm(proxy):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=proxy, api_key=MASTER, max_retries=0, timeout=120)
    messages: list = [{"role": "user", "content": TASK}]
    reasons, inputs = [], []
    for _ in range(5):
        msg = c.messages.create(model="claude-pd", max_tokens=200, messages=messages, tools=[ANTHROPIC_TOOL])
        reasons.append(msg.stop_reason)
        uses = [b for b in msg.content if b.type == "tool_use"]
        inputs += [u.input for u in uses]
        if msg.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": run_tool(u.name, json.dumps(u.input))}
                   for u in uses]  # fmt: skip
        messages.append({"role": "user", "content": results})
    assert reasons == ["tool_use", "tool_use", "end_turn"] and inputs == [{"x": 3}, {"x": 4}]
    assert msg.content[-1].text.endswith("\\boxed{41}")
