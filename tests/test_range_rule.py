"""The range rule (`pyrodash.engine.range_rule`): past the SLM's range a collab turn is the LLM's alone, the same
answer and bill as mode "llm", in both drivers; it says so in the record, the served response and /metrics; a
request's own rule wins over the engine's (or the operating point's); within the range nothing changes."""

from __future__ import annotations

import httpx
import pytest
from test_server import KEY, PRICES, UvicornThread, make_engine, serve_config, tiny_llm, tiny_slm

from pyrodash.engine import CollaborateEngine
from pyrodash.engine.range_rule import RangeRule
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.server.app import build_app
from pyrodash.server.config import OperatingPoint

PROMPTS = get_prompts("world-v1")
CHAT2 = [
    {"role": "user", "content": "3+4="},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Then: +2"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)


def _engine(models, **kw) -> CollaborateEngine:
    return CollaborateEngine(*models, PROMPTS, PRICES, max_tokens=12, offload_bias=-100.0, **kw)


def test_rule_values_are_checked():
    assert not RangeRule().active and RangeRule.of(None) == RangeRule()
    assert RangeRule.of({"max_turns": 3}) == RangeRule(max_turns=3)
    for bad in ({"max_turns": 0}, {"max_turns": 2.5}, {"max_turns": True}, {"turns": 3}, 3):
        with pytest.raises(ValueError, match="range rule"):
            RangeRule.of(bad)
    assert RangeRule(max_turns=3).reason(3, lambda: None) is None
    assert RangeRule(max_turns=3).reason(4, lambda: None) == "turns"
    assert RangeRule(max_context_tokens=10).reason(1, lambda: 11) == "tokens"
    with pytest.raises(ValueError, match="counts its prompt"):
        RangeRule(max_context_tokens=10).reason(1, lambda: None)


def test_past_the_range_the_llm_answers_alone_as_mode_llm(models):
    ruled, plain = _engine(models, range_rule=RangeRule(max_turns=1)), _engine(models)
    alone = plain.run(CHAT2, mode="llm")
    for done in (ruled.run(CHAT2), ruled.batch([CHAT2])[0]):
        assert (done.mode, done.routed, done.turn) == ("llm", "range", 2)
        assert (done.output, done.usage, done.cost_usd) == (alone.output, alone.usage, alone.cost_usd)
        assert done.usage.slm_in == done.usage.slm_out == 0 and done.handoff is None
    rec = Record.from_done(ruled.run(CHAT2)).to_json()
    assert rec["routed"] == "range" and rec["mode"] == "llm"


def test_within_the_range_nothing_changes(models):
    ruled, plain = _engine(models, range_rule=RangeRule(max_turns=2)), _engine(models)
    mine, base = ruled.batch([CHAT2, "3+4="]), plain.batch([CHAT2, "3+4="])
    for a, b in zip(mine, base):
        assert (a.mode, a.routed, a.output, a.usage) == ("collab", None, b.output, b.usage)


def test_a_request_rule_wins_and_tokens_count_the_slm_prompt(models):
    ruled = _engine(models, range_rule=RangeRule(max_turns=1))
    assert ruled.run(CHAT2, range_rule=RangeRule()).routed is None  # the request turns it off
    n = len(models[0].prompt_ids(ruled.slm_request(CHAT2, range_rule=RangeRule())))
    tight, loose = RangeRule(max_context_tokens=n - 1), RangeRule(max_context_tokens=n)
    assert _engine(models).run(CHAT2, range_rule=tight).routed == "range"
    assert _engine(models).run(CHAT2, range_rule=loose).routed is None


def test_operating_point_rule_is_parsed_and_refused_by_name():
    point = OperatingPoint.parse("p", {"offload_bias": 1.0, "range_rule": {"max_turns": 3}})
    assert point.range_rule == RangeRule(max_turns=3)
    with pytest.raises(ValueError, match="range rule"):
        OperatingPoint.parse("p", {"range_rule": {"max_turns": -1}})


def test_served_chat_past_the_range_says_so_and_counts_it(tmp_path_factory):
    slm, llm = tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
    ops = {"pyrodash": 0.0, "ranged": {"offload_bias": 0.0, "range_rule": {"max_turns": 1}}}
    config = serve_config(operating_points=ops)
    with UvicornThread(build_app(config, engine=make_engine(slm, llm, config))) as srv:
        auth = {"Authorization": f"Bearer {KEY}"}
        url = f"{srv.url}/v1/chat/completions"
        r = httpx.post(url, json={"model": "ranged", "messages": CHAT2, "max_tokens": 8}, headers=auth, timeout=60)
        p = r.json()["pyrodash"]
        assert r.status_code == 200 and (p["routed"], p["mode"], p["answered_by"]) == ("range", "collab", "llm")
        assert p["slm_out"] == 0 and p["llm_only_cost_usd"] == p["cost_usd"]
        first = httpx.post(url, json={"model": "ranged", "messages": CHAT2[:1]}, headers=auth, timeout=60).json()
        assert first["pyrodash"]["routed"] is None and first["pyrodash"]["answered_by"] == "collab"
        body = {"model": "ranged", "messages": CHAT2, "pyrodash": {"range_rule": {}}}
        assert httpx.post(url, json=body, headers=auth, timeout=60).json()["pyrodash"]["routed"] is None
        bad = httpx.post(url, json={**body, "pyrodash": {"range_rule": {"max_turns": 0}}}, headers=auth)
        assert bad.status_code == 400 and "range_rule" in bad.json()["error"]["param"]
        card = httpx.get(f"{srv.url}/v1/models/ranged", headers=auth).json()
        assert card["range_rule"] == {"max_turns": 1, "max_context_tokens": None}
        metrics = httpx.get(f"{srv.url}/metrics", headers=auth).text
        assert 'pyrodash_range_routed_total{model="ranged"} 1.0' in metrics
