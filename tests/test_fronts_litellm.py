"""A real LiteLLM proxy in front of `pyrodash serve`: `anthropic/` and `openai/` models routed to its Messages and
Responses APIs; the anthropic and openai SDKs talk to the proxy and get PyroDash answers (a mid-answer handoff and
the `pyrodash` cost, passed through), and pyrodash's /metrics counts them on their routes. LiteLLM runs from its own
venv (.venv-litellm, or $LITELLM_BIN; .ci/run installs it), as in tests/test_readme_endpoints.py."""

from __future__ import annotations

import httpx
import openai
import pytest
from front_stack import QUESTION, assert_mid_handoff, front_stack
from test_readme_endpoints import LITELLM_MASTER, litellm_proxy
from test_server import KEY

MASTER = LITELLM_MASTER  # the proxy's key; clients send it as their API key


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("litellm")
    with front_stack(tmp_path_factory) as (srv, _):
        routes = {"claude-pd": ("anthropic/mid", srv.url), "gpt-pd": ("openai/mid", f"{srv.url}/v1")}
        with litellm_proxy(routes, KEY, tmp) as url:
            yield url, srv


def _routed(srv, route: str) -> float:
    text = httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    line = f'pyrodash_requests_total{{model="mid",route="{route}",status="200"}}'
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


@pytest.mark.slow
def test_anthropic_models_through_the_proxy_reach_the_messages_api(proxy):
    anthropic = pytest.importorskip("anthropic", reason="anthropic is in the test extra")
    url, srv = proxy
    before = _routed(srv, "/v1/messages")
    ask = [{"role": "user", "content": QUESTION}]
    with anthropic.Anthropic(base_url=url, api_key=MASTER, max_retries=0, timeout=120) as c:
        m = c.messages.create(model="claude-pd", max_tokens=24, messages=ask)
        assert_mid_handoff(m.model_extra["pyrodash"], m.content[0].text)
        with c.messages.stream(model="claude-pd", max_tokens=24, messages=ask) as stream:
            assert stream.get_final_message().content[0].text == m.content[0].text  # greedy: the same answer
    assert _routed(srv, "/v1/messages") == before + 2


@pytest.mark.slow
def test_openai_models_through_the_proxy_reach_the_responses_api(proxy):
    url, srv = proxy
    before = _routed(srv, "/v1/responses")
    with openai.OpenAI(base_url=f"{url}/v1", api_key=MASTER, max_retries=0, timeout=120) as c:
        r = c.responses.create(model="gpt-pd", input=QUESTION, max_output_tokens=24)
        assert_mid_handoff(r.model_extra["pyrodash"], r.output_text)
        events = list(c.responses.create(model="gpt-pd", input=QUESTION, max_output_tokens=24, stream=True))
        assert events[-1].type == "response.incomplete" and events[-1].response.output_text == r.output_text
    assert _routed(srv, "/v1/responses") == before + 2
