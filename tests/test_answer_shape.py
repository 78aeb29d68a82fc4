"""One answer shape: the engine's `Done` -> `Record.from_done` (every field of the answer, once) -> the wire's
`pyrodash` object (`PyroDashInfo.from_done`, every record field but `output` by code); and the cost split is
`Usage.components`' own, so it sums to `cost_usd` for a relay priced with the cached sheet and for a mesh whose
endpoints have their own prices."""

from __future__ import annotations

import dataclasses

import pytest
from test_relay import ScriptLLM, ScriptSLM

from pyrodash.backends import load_llm
from pyrodash.chat import ToolCall
from pyrodash.cost import COMPONENTS, Prices, Usage
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.relay import RelayConfig
from pyrodash.events import Done, LLMFailure
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.server.model_server import build_model_app, serve_in_thread
from pyrodash.server.protocol import PyroDashInfo

PROMPTS, CACHED = get_prompts("world-v1"), Prices.from_yaml("cached")
# Done fields the record holds under another name or in another form
RENAMED = {"errors": "llm_errors", "failures": "llm_failures", "usage": None, "slm_text": None, "llm_text": None}


def full_done() -> Done:
    """A Done whose every field differs from its default."""
    fail = LLMFailure(1, "http", "HTTP 500 from up", 500)
    return Done(
        output="a b",
        slm_text="a ",
        llm_text="b",
        usage=Usage(1, 2, 3, 4, 1, 1, 1, 1),
        cost_usd=0.5,
        finish_reason="stop",
        handoff=2,
        offload_bias=1.5,
        handoff_share=0.5,
        handoff_admitted=False,
        fallback=True,
        errors=[str(fail)],
        failures=[fail],
        usage_estimated=True,
        latency_s=1.25,
        turn=2,
        trimmed={"slm": 1, "llm": 2},
        segments=[{"by": "slm", "text": "a "}, {"by": "llm", "endpoint": "e", "text": "b"}],
        llm_endpoints=[{"endpoint": "e", "calls": 1, "cost_usd": 0.25}],
        mode="llm",
        routed="range",
        handoffs=[2, 5],
        relay_fallback="step_cap",
        cost_usd_by_component={"slm_in": 0.1, "slm_out": 0.1, "llm_in": 0.2, "llm_out": 0.1},
        tool_calls=[ToolCall("call_1", "lookup", '{"x": 1}', "llm")],
        tool_call_errors=["slm: a tool call that is not a JSON {name, arguments}: dropped"],
    )


def test_every_field_of_the_answer_reaches_the_record():
    done, defaults = full_done(), Done("", "", "", Usage(), 0.0, "", None)
    changed = [f.name for f in dataclasses.fields(Done) if getattr(done, f.name) != getattr(defaults, f.name)]
    assert len(changed) == len(dataclasses.fields(Done))  # (the fixture sets every field)
    rec = Record.from_done(done)
    for name in changed:
        target = RENAMED.get(name, name)
        if target is not None:
            assert hasattr(rec, target), f"Done.{name} has no home in Record"
    assert rec.usage == done.usage and rec.llm_failures[0]["kind"] == "http" and rec.llm_errors == done.errors
    assert rec.output == done.output and "".join(s["text"] for s in rec.segments) == done.slm_text + done.llm_text


def test_every_record_field_reaches_the_wire():
    done = full_done()
    rec, wire = Record.from_done(done).to_json(), PyroDashInfo.from_done(done, done.mode).model_dump()
    declared = set(PyroDashInfo.model_fields)
    missing = [k for k in rec if k != "output" and k not in declared]
    assert not missing, f"record fields the wire does not declare: {missing}"
    client_form = {"llm_errors", "llm_failures"}  # reason codes; the failures without their upstream text
    for k, v in rec.items():
        if k != "output" and k not in client_form:
            assert wire[k] == v, k
    assert wire["llm_errors"] == ["attempt 1: upstream_http_500"] and "message" not in wire["llm_failures"][0]


def assert_split_sums(done: Done) -> dict[str, float]:
    split = done.cost_usd_by_component
    assert set(split) == set(COMPONENTS) and sum(split.values()) == pytest.approx(done.cost_usd, rel=1e-12)
    info = PyroDashInfo.from_done(done)
    assert info.cost_usd_by_component == split and info.cost_usd == done.cost_usd
    return split


def test_a_relay_priced_with_the_cached_sheet_splits_into_its_billed_components():
    with serve_in_thread(build_model_app(ScriptLLM(), "llm")) as url:
        llm = load_llm({"url": url, "model": "llm", "mode": "continue"})
        relay = RelayConfig(max_llm_calls=8)
        done = CollaborateEngine(ScriptSLM(), llm, PROMPTS, CACHED, max_tokens=200, relay=relay).run("q")
    assert done.usage.llm_calls == 2 and done.usage.cache_estimated(CACHED)  # the prefix cache's estimate applies
    split = assert_split_sums(done)
    assert split == pytest.approx(done.usage.components(CACHED), rel=1e-12)  # the sheet's own terms, cache included


def test_a_mesh_with_its_own_prices_splits_at_each_endpoints_prices():
    own = {"input_cost_per_token": 7e-6, "output_cost_per_token": 3e-5}  # far from the server's sheet
    with serve_in_thread(build_model_app(ScriptLLM(), "llm")) as url:
        mesh = load_llm(
            [
                {"url": "http://127.0.0.1:9/v1", "model": "llm", "name": "down", "mode": "continue"},
                {"url": url, "model": "llm", "name": "priced", "prices": own, "mode": "continue"},
            ]
        )
        relay = RelayConfig(max_llm_calls=8)
        done = CollaborateEngine(ScriptSLM(), mesh, PROMPTS, CACHED, max_tokens=200, relay=relay).run("q")
    split = assert_split_sums(done)
    priced = next(e for e in done.llm_endpoints if e["endpoint"] == "priced")
    assert priced["own_price"] and priced["calls"] >= 1
    assert split["llm_in"] + split["llm_out"] == pytest.approx(sum(e["cost_usd"] for e in done.llm_endpoints))
    assert split["llm_out"] == pytest.approx(
        done.usage.llm_out * 30.0 / 1e6
    )  # at the endpoint's price, not the sheet's
    assert split["llm_out"] != pytest.approx(done.usage.components(CACHED)["llm_out"])
