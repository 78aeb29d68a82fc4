"""A bias or share sweep in relay mode (`{pyrodash_bias: {biases: [...], max_llm_calls: n}}`): its names, its
engines' knobs, and the existing names unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_relay import GOLD, PAPER, PROMPTS, ScriptLLM, ScriptSLM

from pyrodash.data.example import Example
from pyrodash.eval.build import build_methods
from pyrodash.eval.methods import Env
from pyrodash.eval.names import method_name, parse_method, relay_calls, sort_key, sweep_kind


class Scripted:
    def get(self, spec, llm=False, mode=None, offload=False):
        return ScriptLLM() if llm else ScriptSLM()


def methods(*entries):
    cfg = SimpleNamespace(models={"llm": "l", "pyrodash": {0: "s2"}}, methods=list(entries), run_dir="unused")
    return build_methods(cfg, Env(PROMPTS, PAPER, max_tokens=200), Scripted())


def test_a_bias_sweep_in_relay_mode_names_and_runs_each_point_with_both_knobs():
    ms = methods({"pyrodash_bias": {"lambda": 0, "biases": [0, 2], "max_llm_calls": 4}})
    assert list(ms) == ["pyrodash@0+bias0+relay4", "pyrodash@0+bias2+relay4"]
    point = ms["pyrodash@0+bias2+relay4"]
    assert (point.engine.max_llm_calls, point.bias) == (4, 2.0)
    (rec,) = point([(Example("x", "b", "q", "98"), {})])
    assert rec["llm_calls"] == 2 and rec["output"] == GOLD
    share = methods({"pyrodash_share": {"lambda": 0, "shares": [0.5], "max_llm_calls": 3}})
    assert list(share) == ["pyrodash@0+share0.5+relay3"] and share["pyrodash@0+share0.5+relay3"].share == 0.5


def test_without_max_llm_calls_the_sweeps_keep_their_single_handoff_names():
    ms = methods(
        {"pyrodash_bias": {"lambda": 0, "biases": [2]}},
        {"pyrodash_bias": {"lambda": 0, "biases": [3], "max_llm_calls": 1}},
        {"pyrodash_relay": {"lambda": 0, "calls": [4]}},
    )
    assert list(ms) == ["pyrodash@0+bias2", "pyrodash@0+bias3", "pyrodash@0+relay4"]
    assert [m.engine.max_llm_calls for m in ms.values()] == [1, 1, 4]


@pytest.mark.parametrize("bad", [0, 2.5, "4", True])
def test_a_relay_sweeps_calls_must_be_a_whole_number(bad):
    with pytest.raises(ValueError, match="max_llm_calls"):
        methods({"pyrodash_bias": {"lambda": 0, "biases": [1], "max_llm_calls": bad}})
    with pytest.raises(ValueError, match="pyrodash_relay sweeps the calls itself"):
        methods({"pyrodash_relay": {"lambda": 0, "calls": [4], "max_llm_calls": 4}})


def test_combined_names_parse_sort_and_say_their_calls():
    name = method_name("pyrodash", 0, "bias", 2, relay=4)
    assert name == "pyrodash@0+bias2+relay4" and parse_method(name) == ("pyrodash", 0.0, 2.0)
    assert sweep_kind(name) == "bias+relay" and sweep_kind("pyrodash@0+share0.5+relay4") == "share+relay"
    assert [relay_calls(n) for n in (name, "pyrodash@0+relay3", "pyrodash@0+bias2", "oracle")] == [4, 3, 1, 1]
    assert sort_key("pyrodash@0+relay4") < sort_key("pyrodash@0+bias1+relay4") < sort_key(name) < sort_key("oracle")
    # the existing names are unchanged
    assert parse_method("pyrodash@0.6+bias-2") == ("pyrodash", 0.6, -2.0) and sweep_kind("pyrodash@2+relay4") == "relay"
    for bad in ("pyrodash@0+relay4+relay4", "routellm@0.5+bias1+relay4", "pyrodash@0+bias1+relay2.5"):
        with pytest.raises(ValueError, match="scheme|suffix|follows"):
            parse_method(bad)
    with pytest.raises(ValueError, match="relay mode"):
        method_name("pyrodash", 0, "bias", 2, relay=1)
