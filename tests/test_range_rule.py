"""The range rule (`pyrodash.engine.range_rule`): past the SLM's range a collab turn is the LLM's alone, the same
answer and bill as mode "llm", in both drivers; it says so in the record, the served response and /metrics; a
request's own rule wins over the engine's (or the operating point's); within the range nothing changes."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server import KEY, PRICES, UvicornThread, make_engine, serve_config, tiny_llm, tiny_slm

from pyrodash.cost import Usage
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.calibrate import calibrate_range, within_range
from pyrodash.engine.range_rule import RangeRule
from pyrodash.eval.harness import EvalConfig
from pyrodash.events import Done
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.report.turns import gold_history_turns, per_turn, range_section
from pyrodash.server.app import build_app
from pyrodash.server.config import OperatingPoint
from pyrodash.train.config import CurateConfig, Stage3Config
from pyrodash.train.curate import load_conversations
from pyrodash.world.config import WorldConfig
from pyrodash.world.multiturn import LONG_SPLITS, ensure_long_split, make_multiturn_split
from pyrodash.world.task import make_known, make_table

PROMPTS = get_prompts("world-v1")
CHAT2 = [
    {"role": "user", "content": "3+4="},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Then: +2"},
]


def _engine(models, **kw) -> CollaborateEngine:
    return CollaborateEngine(*models, PROMPTS, PRICES, max_tokens=12, offload_bias=-100.0, **kw)


def test_rule_values_are_checked():
    assert not RangeRule().active and RangeRule.of(None) == RangeRule()
    assert RangeRule.of({"max_turns": 3}) == RangeRule(max_turns=3)
    assert RangeRule(max_turns=0).reason(1, lambda: None) == "turns"  # 0: no turn is the SLM's
    for bad in ({"max_turns": -1}, {"max_context_tokens": 0}, {"max_turns": 2.5}, {"max_turns": True}, {"turns": 3}, 3):
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
        bad = httpx.post(url, json={**body, "pyrodash": {"range_rule": {"max_turns": -1}}}, headers=auth)
        assert bad.status_code == 400 and "range_rule" in bad.json()["error"]["param"]
        card = httpx.get(f"{srv.url}/v1/models/ranged", headers=auth).json()
        assert card["range_rule"] == {"max_turns": 1, "max_context_tokens": None}
        metrics = httpx.get(f"{srv.url}/metrics", headers=auth).text
        assert 'pyrodash_range_routed_total{model="ranged"} 1.0' in metrics


# ---------------------------------------------------------------- calibration, the long split, the report


def _done(cost: float, ok: bool, slm_in: int = 0) -> Done:
    return Done(f"\\boxed{{{1 if ok else 0}}}", "", "", Usage(slm_in=slm_in), cost, "stop", None)


class _Engine:
    """An engine double: per turn, whether the policy / the LLM is right and what each costs."""

    def __init__(self, policy: dict, llm: dict):
        self.table, self.modes = {"collab": policy, "llm": llm}, []

    def batch(self, chats, mode="collab", options=None, **kw):
        self.modes.append((mode, options))
        return [_done(*self.table[mode][sum(m["role"] == "user" for m in c)], slm_in=10 * len(c)) for c in chats]


def test_calibration_keeps_turns_until_the_policy_stops_beating_the_llm():
    chats = [[{"role": "user", "content": "q"}] * t for t in (1, 2, 3, 4) for _ in range(2)]
    turns = [t for t in (1, 2, 3, 4) for _ in range(2)]
    engine = _Engine({1: (0.1, True), 2: (0.1, True), 3: (0.1, False), 4: (0.1, True)}, {t: (1.0, True) for t in turns})
    grade = lambda outs, golds: ["{1}" in o for o in outs]  # noqa: E731
    cal = calibrate_range(engine, chats, ["1"] * len(chats), turns, grade)
    # turn 3 is out of range; turn 4, where the policy would be right again, cannot move max_turns: neither model is
    # run there (a calibration that ran the policy would ask it for 8 turns and mark turn 4 within; one that ran the
    # LLM on every turn first would ask it for 8)
    assert cal.max_turns == 2 and [r["within"] for r in cal.by_turn] == [True, True, False, None]
    asked = [(mode, len(opts or [None] * 2)) for mode, opts in engine.modes]
    assert asked == [("llm", 2), ("collab", 2)] * 3 and cal.policy_questions == 6 and cal.questions == 8
    assert cal.by_turn[3] == {"turn": 4, "n": 2, "llm_acc": None, "llm_cost_usd": None, "policy_acc": None,
                              "policy_cost_usd": None, "policy_handoff_rate": None, "slm_prompt_tokens": None,
                              "within": None}  # fmt: skip
    assert cal.by_turn[2]["llm_acc"] == 1.0 and cal.by_turn[2]["policy_acc"] == 0.0
    assert cal.by_turn[0]["slm_prompt_tokens"] == {"mean": 10, "min": 10, "max": 10}
    assert all(o["range_rule"] == RangeRule() for mode, opts in engine.modes if mode == "collab" for o in opts)
    every = calibrate_range(_Engine({t: (0.1, True) for t in turns}, {t: (1.0, True) for t in turns}), chats,
                            ["1"] * len(chats), turns, grade)  # fmt: skip
    assert every.max_turns is None and every.rule == {"max_turns": None, "max_context_tokens": None}


def test_within_range_needs_accuracy_and_accuracy_per_dollar():
    row = {"policy_acc": 0.95, "llm_acc": 1.0, "policy_cost_usd": 0.4, "llm_cost_usd": 1.0}
    assert within_range(row, 0.9) and not within_range(row, 0.99)
    assert not within_range({**row, "policy_cost_usd": 1.2}, 0.9)  # as right, dearer per right answer
    assert within_range({**row, "policy_acc": 0.0, "llm_acc": 0.0}, 0.9)  # nobody right: nothing lost to the SLM
    assert not within_range({**row, "policy_acc": 0.0, "llm_acc": 0.1, "policy_cost_usd": 0.0}, 0.0)


def test_long_split_is_made_once_deterministically_and_shares_no_opener(tmp_path, monkeypatch):
    world = tmp_path / "w"
    (world / "data").mkdir(parents=True)
    cfg = WorldConfig.from_preset("quick")
    (world / "world.json").write_text(json.dumps({"config": cfg.to_dict(), "seed": 0}))
    built = make_multiturn_split(0, 5, 3, [1, 2], [1, 2], make_table(0), make_known(cfg.known_frac))
    (world / "data" / "multiturn.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in built))
    assert ensure_long_split(world, "multiturn") is None
    path = ensure_long_split(world, "multiturn6_val")
    test = (world / "data" / "multiturn6.jsonl").read_text()
    val = path.read_text()
    exs = [json.loads(x) for x in test.splitlines()]
    n, turns = LONG_SPLITS["multiturn6"]
    assert len(exs) == n * turns and {e["meta"]["turn"] for e in exs} == set(range(1, turns + 1))
    openers = lambda text: {json.loads(x)["question"] for x in text.splitlines() if '"turn": 1,' in x}  # noqa: E731
    assert not openers(test) & openers(val) and not openers(test) & {e.question for e in built}
    (world / "data" / "multiturn6.jsonl").unlink()
    (world / "data" / "multiturn6_val.jsonl").unlink()
    ensure_long_split(world, "multiturn6")  # the same files again, whichever is asked first
    assert (world / "data" / "multiturn6.jsonl").read_text() == test and path.read_text() == val
    # a split written at another size (a world cached before the test split grew) is made again, and a larger
    # test split keeps the smaller one's conversations as its first ones
    short = "".join(test.splitlines(keepends=True)[: 5 * turns])
    (world / "data" / "multiturn6.jsonl").write_text(short)
    ensure_long_split(world, "multiturn6_val")
    assert (world / "data" / "multiturn6.jsonl").read_text() == test and path.read_text() == val
    monkeypatch.setitem(LONG_SPLITS, "multiturn6", (5, turns))
    (world / "data" / "multiturn6.jsonl").unlink()
    ensure_long_split(world, "multiturn6")
    assert (world / "data" / "multiturn6.jsonl").read_text() == short


def test_report_section_draws_the_calibration_and_long_splits_stay_out_of_per_turn(tmp_path):
    rows = [
        {"turn": t, "n": 2, "policy_acc": a, "llm_acc": 1.0, "policy_cost_usd": 0.1, "llm_cost_usd": 1.0,
         "policy_handoff_rate": 0.5, "slm_prompt_tokens": {"mean": 10 * t, "min": 9, "max": 11}, "within": t < 3}
        for t, a in ((1, 1.0), (2, 1.0), (3, 0.0))
    ]  # fmt: skip
    rows.append({"turn": 4, "n": 2, "policy_acc": None, "llm_acc": 1.0, "policy_cost_usd": None, "llm_cost_usd": 1.0,
                 "policy_handoff_rate": None, "slm_prompt_tokens": None, "within": None})  # fmt: skip
    assert range_section(tmp_path) == []
    (tmp_path / "range_calibration.json").write_text(json.dumps({"max_turns": 2, "min_ratio": 0.9, "by_turn": rows}))
    md = "\n".join(range_section(tmp_path))
    assert "max_turns = 2" in md and "![Range rule](range.png)" in md and (tmp_path / "range.png").stat().st_size
    assert "| 4 | 2 | -- | -- | -- | 100.00 | 1.00000000 | not measured |" in md  # past the first turn out of range
    rec = {"correct": True, "llm_calls": 1, "handoff": None, "slm_in": 0, "slm_out": 0, "llm_in": 5, "llm_out": 5}
    runs = {
        "pyrodash@0.6": [
            {**rec, "benchmark": "world:multiturn", "meta": {"turn": 1}},
            {**rec, "benchmark": "world:multiturn6", "meta": {"turn": 4}, "routed": "range"},
        ]
    }
    assert set(gold_history_turns(runs, PRICES)["pyrodash@0.6"]) == {1}  # summary.json["per_turn"] as before
    six = per_turn(runs, PRICES, {"world:multiturn6"})["pyrodash@0.6"][4]
    assert (
        six["range_routed"] == 1.0
        and "range_routed" not in per_turn(runs, PRICES, {"world:multiturn"})["pyrodash@0.6"][1]
    )


def test_curation_and_stage3_drop_turns_past_the_range(tmp_path):
    data = tmp_path / "w" / "data"
    data.mkdir(parents=True)
    exs = make_multiturn_split(0, 3, 4, [1, 2], [1], make_table(0), make_known(0.65), split="multiturn_train")
    (data / "multiturn_train.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in exs))
    kept, counts = load_conversations("world:multiturn_train", tmp_path / "w", range_max_turns=3)
    assert {ex.meta["turn"] for ex in kept} == {1, 2, 3} and counts == {"conversations": 3, "turns": 9, "past_range": 3}
    assert load_conversations("world:multiturn_train", tmp_path / "w")[1]["past_range"] == 0
    assert (
        CurateConfig().range_max_turns is None and Stage3Config.__dataclass_fields__["range_max_turns"].default is None
    )


def test_eval_config_rule_is_checked_and_stored_whole():
    cfg = EvalConfig(run_dir="r", benchmarks=["world:multiturn6"], range_rule={"max_turns": 3})
    assert cfg.range_rule == {"max_turns": 3, "max_context_tokens": None}
    assert EvalConfig(run_dir="r", benchmarks=["x"]).range_rule is None
    with pytest.raises(ValueError, match="eval config: range rule"):
        EvalConfig(run_dir="r", benchmarks=["x"], range_rule={"max_turns": -2})
