"""No tool-bearing input makes `pyrodash serve` answer 5xx or break its own schema: schemathesis (positive and
negative modes, ALL its checks, as tests/test_server_fuzz.py runs them) on the three completion routes of a server
whose SLM and LLM take tools (the TEST DOUBLES of tests/tool_doubles.py, which call `lookup_g` when offered it), so
generated `tools`, `tool_choice`, tool calls and tool results in the history reach the engine and its parsers."""

from __future__ import annotations

import pytest
from test_server import UvicornThread, make_engine, serve_config
from test_server_fuzz import schemathesis_run
from tool_doubles import tool_pair

from pyrodash.server.app import build_app
from pyrodash.server.config import Limits

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402


@pytest.fixture(scope="module")
def server():
    slm, llm = tool_pair()
    limits = Limits(max_body_bytes=64 * 1024, max_tokens=64, default_max_tokens=16)
    cfg = serve_config(operating_points={"pyrodash": 0.0}, limits=limits)
    with UvicornThread(build_app(cfg, engine=make_engine(slm, llm, cfg))) as srv:
        yield srv


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda g: g.value)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_schemathesis_all_checks_with_tool_models(server, route, mode):
    schemathesis_run(server.url, route, "POST", mode, _no_5xx)


def _no_5xx(status: int, headers, text: str) -> None:
    assert status < 500, text[:500]
