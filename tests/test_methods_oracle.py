"""The oracle single-handoff method: where it cuts, what it sends the LLM, and how it is billed (tiny real models)."""

from __future__ import annotations

import pytest
from tiny_models import tiny_model_dir

from pyrodash.cost import Prices, Usage
from pyrodash.data.example import Example
from pyrodash.prompts import get_prompts
from pyrodash.record import usage_of

GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": None}


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    from pyrodash.backends.hf.backend import HFBackend

    d = tmp_path_factory.mktemp("models")
    return HFBackend(tiny_model_dir(d / "slm", seed=1)), HFBackend(tiny_model_dir(d / "llm", seed=2))


def _env(max_tokens: int = 16):
    from pyrodash.eval.methods import Env

    return Env(get_prompts("world-v1"), Prices.from_yaml("paper"), max_tokens=max_tokens, batch_size=4)


def _ex(i: int, hard: list[int]) -> Example:
    return Example(
        id=f"o{i}",
        benchmark="world:tier1",
        question=f"Start {i}: +{i % 7 + 1}, f.",
        gold=str(i),
        meta={"steps": ["a", "b", "c"], "hard_steps": hard},
    )


def test_cut_before_step():
    from pyrodash.eval.oracle import cut_before_step

    text = "1+2=3\n\nf(3)=7\n\n7+1=8\n\n\\boxed{8}"
    assert cut_before_step(text, 0) == ""
    assert cut_before_step(text, 1) == "1+2=3\n\n"
    assert cut_before_step(text, 2) == "1+2=3\n\nf(3)=7\n\n"
    assert cut_before_step("1+2=3", 3) == "1+2=3"  # fewer steps than the cut: all of it


def test_oracle_hands_off_before_the_first_hard_step_and_bills_like_the_engine(backends):
    from pyrodash.backends.base import GenRequest
    from pyrodash.backends.retry import run_requests
    from pyrodash.engine.requests import handoff_request, with_system
    from pyrodash.eval.oracle import Oracle, cut_before_step

    slm, llm = backends
    env = _env()
    items = [(_ex(0, []), GREEDY), (_ex(1, [0]), GREEDY), (_ex(2, [1, 2]), GREEDY)]
    recs = Oracle("oracle", slm, llm, env)(items)
    assert [r["llm_calls"] for r in recs] == [0, 1, 1]
    assert [r["oracle_step"] for r in recs] == [None, 0, 1]
    # The SLM's own answer under P_s (what the engine's SLM request would produce), independently generated.
    p = env.prompts
    own = run_requests(
        slm,
        [
            GenRequest(
                messages=with_system(p.offload_system, p.plain_messages(ex.question)), max_tokens=env.max_tokens, **s
            )
            for ex, s in items
        ],
    )
    assert recs[0]["output"] == own[0].text and recs[0]["handoff"] is None
    assert usage_of(recs[0]) == Usage(slm_in=own[0].prompt_tokens, slm_out=own[0].completion_tokens)
    for r, g, (ex, s) in zip(recs[1:], own[1:], items[1:]):
        prefix = cut_before_step(g.text, ex.meta["hard_steps"][0])
        by = [(seg["by"], seg["text"]) for seg in r["segments"]]
        assert by[:-1] == ([("slm", prefix)] if prefix else []) and by[-1][0] == "llm"  # as the engine streamed it
        assert r["output"] == prefix + r["segments"][-1]["text"]
        # the LLM request is the engine's handoff request (P_l + question, the prefix continued as its own answer)
        req = handoff_request(p, "continue", p.plain_messages(ex.question), prefix, env.max_tokens, dict(s))
        lg = run_requests(llm, [req])[0]
        assert r["segments"][-1]["text"] == lg.text
        u = usage_of(r)
        n_prefix = slm.count_tokens(prefix) if prefix else 0
        assert u == Usage(
            slm_in=g.prompt_tokens,
            slm_out=n_prefix + 1,
            llm_in=lg.prompt_tokens,
            llm_out=lg.completion_tokens,
            llm_calls=1,
        )
        assert r["handoff"] == n_prefix


def test_oracle_needs_hard_steps(backends):
    from pyrodash.eval.oracle import Oracle

    slm, llm = backends
    ex = Example(id="x", benchmark="gsm8k", question="2+2?", gold="4", meta={})
    with pytest.raises(ValueError, match="hard_steps"):
        Oracle("oracle", slm, llm, _env())([(ex, GREEDY)])


def test_report_places_oracle_and_measures_distance():
    from pyrodash.eval.names import parse_method, sort_key
    from pyrodash.report.metrics import Metrics
    from pyrodash.report.tables import oracle_distance, verdict_sentence

    assert parse_method("oracle") == ("oracle", None, None)
    assert sorted(["llm", "oracle", "pyrodash@0.6", "slm"], key=sort_key) == ["slm", "pyrodash@0.6", "oracle", "llm"]
    fields = Metrics.__dataclass_fields__

    def m(name, acc, norm):
        base = {k: None for k in fields}
        base.update(name=name, accuracy=acc, cost_usd=norm, cost_normalized=norm, llm_calls=1.0)
        return Metrics(**{k: base[k] for k in fields})

    ms = {
        "oracle": m("oracle", 0.98, 0.45),
        "pyrodash@0.6": m("pyrodash@0.6", 0.95, 0.52),
        "pyrodash@2": m("pyrodash@2", 0.6, 0.2),
        "routellm@0.5": m("routellm@0.5", 0.9, 0.6),
    }
    table = "\n".join(oracle_distance(ms))
    assert "| pyrodash@0.6 | 95.00 | 0.5200 | -3.00 | +0.0700 | yes |" in table
    assert "| pyrodash@2 | 60.00 | 0.2000 | -38.00 | -0.2500 | no |" in table
    v = verdict_sentence(ms)
    assert "matches or beats 1 of 1" in v and "pyrodash@0.6 at 95.00%" in v
