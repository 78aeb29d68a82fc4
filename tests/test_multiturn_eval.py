"""Conversations evaluated as users live them (`world:multiturn-self`, pyrodash.eval.harness): each turn after the
method's OWN earlier answers, turn by turn, resumable; whole conversations under `limit`; and the report's per-turn
sections per benchmark (normalized cost, Pareto verdict, oracle distance) computed right on hand-made records."""

from __future__ import annotations

import io
import json
import re

import pytest

from pyrodash.cost import Prices
from pyrodash.data.benchmarks import load_benchmark, subsample_examples
from pyrodash.data.example import Example
from pyrodash.eval.harness import EvalConfig, evaluate, load_examples
from pyrodash.world.multiturn import make_multiturn_split
from pyrodash.world.task import make_known, make_split, make_table

TABLE, KNOWN = make_table(0), make_known(0.65)
SELF = "world:multiturn-self"


def _world(tmp_path, n=4, turns=3):
    """A world directory holding only the data splits the loaders read."""
    data = tmp_path / "world" / "data"
    data.mkdir(parents=True)
    exs = make_multiturn_split(0, n, turns, [1, 2], [1], TABLE, KNOWN)
    (data / "multiturn.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in exs))
    tier = make_split(0, "tier1", 3, [1], TABLE, KNOWN)
    (data / "tier1.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in tier))
    return tmp_path / "world", exs


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


class Fake:
    """A method that writes what it was asked after: its history length and a tag, then a boxed answer, the gold
    one except on the turns in `wrong` (there 99). Logs every call's (benchmark, id, history) items."""

    def __init__(self, name, wrong=(), tag="A", fail_on_turn=None):
        self.name, self.wrong, self.tag, self.fail_on_turn, self.calls = name, set(wrong), tag, fail_on_turn, []

    def __call__(self, items):
        self.calls.append([(ex.benchmark, ex.id, ex.meta.get("history")) for ex, _ in items])
        out = []
        for ex, _ in items:
            turn = ex.meta.get("turn")
            if turn == self.fail_on_turn:
                raise KeyboardInterrupt("killed")
            ans = 99 if turn in self.wrong else int(ex.gold)
            out.append(
                {
                    "output": f"{self.tag}: after {len(ex.meta.get('history') or [])} messages, \\boxed{{{ans}}}",
                    "slm_in": 10,
                    "slm_out": 5,
                    "llm_in": 0,
                    "llm_out": 0,
                    "llm_calls": 0,
                    "handoff": None,
                }
            )
        return out


# --- loading ------------------------------------------------------------------------------------------------------


def test_self_benchmark_is_the_same_conversations_renamed(tmp_path):
    world, exs = _world(tmp_path)
    own = load_benchmark(SELF, path=world)
    assert [e.id for e in own] == [e.id for e in exs] and {e.benchmark for e in own} == {SELF}
    assert [(e.question, e.gold, e.meta) for e in own] == [(e.question, e.gold, e.meta) for e in exs]
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=[SELF], world_dir=str(world))
    assert load_examples(cfg, SELF) == own
    with pytest.raises(ValueError, match="not a conversation benchmark"):
        load_benchmark("world:tier1-self", path=world)


@pytest.mark.parametrize("seed", [None, 0, 3])
def test_limit_keeps_whole_conversations(tmp_path, seed):
    world, exs = _world(tmp_path, n=6, turns=3)
    for limit in (1, 3, 5, 7, 17, 100):
        for name in ("world:multiturn", SELF):
            got = load_benchmark(name, path=world, limit=limit, seed=seed)
            convs = {e.meta["conversation"] for e in got}
            assert len(got) == 3 * len(convs) and len(convs) == max(1, min(limit // 3, 6))
            ids = [e.id for e in got]  # whole conversations, in file order
            assert ids == [e.id for e in exs if e.meta["conversation"] in convs]
        if seed is None:
            assert [e.id for e in got] == [e.id for e in exs[: 3 * max(1, min(limit // 3, 6))]]
    # plain examples subsample as before
    plain = [Example(id=str(i), benchmark="b", question="q", gold="1") for i in range(10)]
    assert [e.id for e in subsample_examples(plain, 4, None)] == ["0", "1", "2", "3"]
    assert len(subsample_examples(plain, 4, 1)) == 4


# --- own history --------------------------------------------------------------------------------------------------


def test_turns_are_answered_after_the_methods_own_answers(tmp_path):
    world, exs = _world(tmp_path, n=3, turns=3)
    own = load_benchmark(SELF, path=world)
    m = Fake("slm", wrong={1})  # a wrong number on turn 1
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=["world:multiturn", SELF], batch_size=2)
    evaluate(cfg, {"slm": m}, examples=exs + own, quiet=True)
    recs = _lines(tmp_path / "run" / "records" / "slm.jsonl")
    gold = {r["id"]: r for r in recs if r["benchmark"] == "world:multiturn"}
    mine = {r["id"]: r for r in recs if r["benchmark"] == SELF}
    assert len(recs) == 18 and len(gold) == len(mine) == 9
    for ex in exs:
        g, s = gold[ex.id], mine[ex.id]
        assert g["meta"] == ex.meta and "history_source" not in g["meta"]  # gold history: as the split has it
        assert s["meta"]["history_source"] == "self" and s["question"] == ex.question and s["gold"] == ex.gold
        turn = ex.meta["turn"]
        if turn == 1:
            assert s["meta"]["history"] == [] and s["output"] == g["output"]
            assert "\\boxed{99}" in s["output"] and not s["correct"]
            continue
        prev = next(e for e in exs if e.meta["conversation"] == ex.meta["conversation"] and e.meta["turn"] == turn - 1)
        assert s["meta"]["history"] == mine[prev.id]["meta"]["history"] + [
            {"role": "user", "content": prev.question},
            {"role": "assistant", "content": mine[prev.id]["output"]},
        ]
        assert s["meta"]["history"] != g["meta"]["history"]
        assert f"after {2 * (turn - 1)} messages" in s["output"] and s["correct"]
    t2 = next(r for r in mine.values() if r["meta"]["turn"] == 2)
    assert "\\boxed{99}" in t2["meta"]["history"][1]["content"]  # the method's wrong turn-1 answer, not the gold
    # the method saw exactly what the records store, turn 1 of every conversation before any turn 2
    seen = {(b, i): h for call in m.calls for b, i, h in call}
    assert all(seen[(SELF, i)] == r["meta"]["history"] for i, r in mine.items())
    turns = [int(re.search(r"-t(\d+)$", i).group(1)) for call in m.calls for b, i, _ in call if b == SELF]
    assert turns == sorted(turns) == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_own_history_resumes_from_stored_turns(tmp_path):
    world, exs = _world(tmp_path, n=3, turns=3)
    own = load_benchmark(SELF, path=world)
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=[SELF], batch_size=2)
    path = tmp_path / "run" / "records" / "slm.jsonl"
    # "killed" after turn 1: only turn 1 reached the records
    evaluate(cfg, {"slm": Fake("slm", tag="first run")}, examples=[e for e in own if e.meta["turn"] == 1], quiet=True)
    # killed while answering turn 2 (an exception mid-run): nothing of turn 2 is stored
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, {"slm": Fake("slm", tag="second run", fail_on_turn=2)}, examples=own, quiet=True)
    assert [r["meta"]["turn"] for r in _lines(path)] == [1, 1, 1]
    m = Fake("slm", tag="third run")
    evaluate(cfg, {"slm": m}, examples=own, quiet=True)
    recs = _lines(path)
    assert sorted(r["id"] for r in recs) == sorted(e.id for e in own)  # every turn once: no duplicate
    assert {i for call in m.calls for _, i, _ in call} == {e.id for e in own if e.meta["turn"] > 1}
    by = {r["id"]: r for r in recs}
    for r in recs:
        if r["meta"]["turn"] == 2:
            t1 = by[r["id"].replace("-t2", "-t1")]
            assert t1["output"].startswith("first run")  # the stored turn-1 output, not a new one
            assert r["meta"]["history"] == [
                {"role": "user", "content": t1["question"]},
                {"role": "assistant", "content": t1["output"]},
            ]
    # a finished run resumes to nothing
    m2 = Fake("slm")
    evaluate(cfg, {"slm": m2}, examples=own, quiet=True)
    assert m2.calls == [] and len(_lines(path)) == 9


def test_a_turn_without_its_earlier_turn_is_refused_before_anything_runs(tmp_path):
    world, _ = _world(tmp_path, n=2, turns=3)
    own = load_benchmark(SELF, path=world)
    m = Fake("slm")
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=[SELF])
    with pytest.raises(ValueError, match=r"turn 2 of conversation world-multiturn-00001 .* not among the examples"):
        evaluate(cfg, {"slm": m}, examples=[e for e in own if e.id != "world-multiturn-00001-t1"], quiet=True)
    assert m.calls == [] and not (tmp_path / "run" / "records" / "slm.jsonl").exists()
    bad = [Example(id="x", benchmark="mine-self", question="q", gold="1", meta={"turn": 1})]
    with pytest.raises(ValueError, match="meta.conversation"):
        evaluate(cfg, {"slm": m}, examples=bad, quiet=True)


def test_own_history_reaches_the_model(tmp_path):
    """With a real model (the engine's SLM alone), a turn's prompt is the method's own earlier answer."""
    from tiny_models import tiny_model_dir

    from pyrodash.backends.base import GenRequest
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.eval.methods import Env, Solo
    from pyrodash.eval.oracle import Oracle
    from pyrodash.prompts import get_prompts

    world, exs = _world(tmp_path, n=2, turns=2)
    own = load_benchmark(SELF, path=world)
    slm = HFBackend(tiny_model_dir(tmp_path / "slm", seed=1))
    llm = HFBackend(tiny_model_dir(tmp_path / "llm", seed=2))
    prompts = get_prompts("world-v1")
    env = Env(prompts, Prices.from_yaml("paper"), max_tokens=10, batch_size=4)
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=["world:multiturn", SELF], batch_size=4)
    evaluate(
        cfg,
        {"slm": Solo("slm", slm, "slm", env), "oracle": Oracle("oracle", slm, llm, env)},
        examples=exs + own,
        quiet=True,
    )
    # the oracle answers own-history turns too: its handoff follows the turn's hard steps, its history is its own
    orc = {r["id"]: r for r in _lines(tmp_path / "run" / "records" / "oracle.jsonl") if r["benchmark"] == SELF}
    for ex in exs:
        assert orc[ex.id]["llm_calls"] == int(bool(ex.meta["hard_steps"]))
        if ex.meta["turn"] == 2:
            assert orc[ex.id]["meta"]["history"][1]["content"] == orc[ex.id.replace("-t2", "-t1")]["output"]
    recs = _lines(tmp_path / "run" / "records" / "slm.jsonl")
    mine = {r["id"]: r for r in recs if r["benchmark"] == SELF}
    gold = {r["id"]: r for r in recs if r["benchmark"] == "world:multiturn"}
    for ex in exs:
        r = mine[ex.id]
        n = len(slm.prompt_ids(GenRequest(messages=r["meta"]["history"] + prompts.plain_messages(ex.question))))
        assert r["slm_in"] == n
        if ex.meta["turn"] == 2:  # the untrained model's turn 1 is not the gold solution: another prompt
            assert r["meta"]["history"][1]["content"] == mine[ex.id.replace("-t2", "-t1")]["output"]
            assert r["slm_in"] != gold[ex.id]["slm_in"]
        else:  # turn 1 is the same request in both benchmarks: the Solo answer is shared
            assert r["output"] == gold[ex.id]["output"] and r.get("reused_answer")


# --- the report ---------------------------------------------------------------------------------------------------

PRICES = Prices(slm_in=0, slm_out=0, llm_in=0, llm_out=1e6)  # $1 per LLM output token: cost = llm_out


def _rec(method, bench, conv, turn, correct, llm_out):
    return {
        "id": f"c{conv}-t{turn}",
        "benchmark": bench,
        "sample": 0,
        "method": method,
        "question": "q",
        "gold": "1",
        "correct": correct,
        "output": "x",
        "slm_in": 1,
        "slm_out": 1,
        "llm_in": 0,
        "llm_out": llm_out,
        "llm_calls": int(llm_out > 0),
        "handoff": 3 if llm_out and method != "llm" else None,
        "meta": {"turn": turn, "conversation": f"c{conv}", "history": []},
    }


# (benchmark, turn) -> method -> (accuracy out of 2 conversations, llm_out per example)
POINTS = {
    ("world:multiturn", 1): {
        "slm": (0, 0),
        "llm": (2, 100),
        "oracle": (2, 40),
        "pyrodash@0.5": (2, 60),
        "pyrodash@2": (1, 20),
    },
    ("world:multiturn", 2): {
        "slm": (0, 0),
        "llm": (2, 200),
        "oracle": (2, 50),
        "pyrodash@0.5": (2, 50),
        "pyrodash@2": (0, 10),
    },
    (SELF, 1): {"slm": (0, 0), "llm": (2, 100), "oracle": (2, 40), "pyrodash@0.5": (2, 60), "pyrodash@2": (1, 20)},
    (SELF, 2): {"slm": (0, 0), "llm": (2, 400), "oracle": (1, 100), "pyrodash@0.5": (1, 80), "pyrodash@2": (0, 0)},
}


@pytest.fixture
def run(tmp_path):
    rec = tmp_path / "records"
    rec.mkdir()
    (tmp_path / "config.resolved.json").write_text(json.dumps({"prices": PRICES.to_dict()}))
    by: dict[str, list] = {}
    for (bench, turn), ms in POINTS.items():
        for m, (right, out) in ms.items():
            by.setdefault(m, []).extend(_rec(m, bench, c, turn, c < right, out) for c in range(2))
    for m, rs in by.items():  # and one single question each, for Tables 1-4
        rs.append({**_rec(m, "world:tier1", 9, 1, True, 5), "meta": {}})
        (rec / f"{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    return tmp_path


def test_per_turn_normalized_cost_and_pareto_verdict(run):
    from pyrodash.report.load import load_run
    from pyrodash.report.turns import per_turn_by_benchmark, turn_pareto

    pt = per_turn_by_benchmark(load_run(run), PRICES)
    assert list(pt) == ["world:multiturn", SELF]
    for (bench, turn), ms in POINTS.items():
        for m, (right, out) in ms.items():
            v = pt[bench][m][turn]
            assert v["n"] == 2 and v["accuracy"] == right / 2 and v["cost_usd"] == pytest.approx(out)
            assert v["cost_normalized"] == pytest.approx(out / ms["llm"][1])
            assert v["llm_calls"] == (1.0 if out else 0.0)
    gold, own = turn_pareto(pt["world:multiturn"]), turn_pareto(pt[SELF])
    # gold turn 1: pyrodash@0.5 (100%, 0.6) is dominated by the oracle (100%, 0.4); pyrodash@2 (50%, 0.2) is not
    assert gold[1]["points"]["pyrodash@0.5"]["dominated_by"] == ["oracle"]
    assert gold[1]["points"]["pyrodash@2"]["on_frontier"] and gold[1]["points"]["pyrodash@2"]["dominated_by"] == []
    assert gold[1]["frontier"] == ["slm", "pyrodash@2", "oracle"]  # the report's method order
    # gold turn 2: pyrodash@0.5 ties the oracle exactly (nobody strictly better): both on the frontier;
    # pyrodash@2 (0%, 0.05) is dominated by the SLM alone (0%, 0.0)
    assert gold[2]["points"]["pyrodash@0.5"]["on_frontier"]
    assert gold[2]["points"]["pyrodash@2"]["dominated_by"] == ["slm"]
    assert set(gold[2]["frontier"]) == {"slm", "oracle", "pyrodash@0.5"}
    p = gold[1]["points"]["pyrodash@0.5"]
    assert p["oracle_acc_gap"] == 0 and p["oracle_cost_gap"] == pytest.approx(0.6 - 0.4)
    assert gold[1]["points"]["pyrodash@2"]["oracle_acc_gap"] == -0.5
    # own turn 2: pyrodash@0.5 (50%, 0.2) dominates the oracle (50%, 0.25); pyrodash@2 costs as much as the SLM
    q = own[2]["points"]["pyrodash@0.5"]
    assert q["on_frontier"] and q["oracle_acc_gap"] == 0 and q["oracle_cost_gap"] == pytest.approx(0.2 - 0.25)
    assert "oracle" not in own[2]["frontier"] and own[2]["points"]["pyrodash@2"]["on_frontier"]  # tie with slm


def test_report_sections_summary_and_console_per_benchmark(run):
    from rich.console import Console

    from pyrodash.report.console import print_turns
    from pyrodash.report.render import render, write_report

    md, summary, ms = render(run)
    assert "### Conversations, gold history: `world:multiturn`" in md
    assert "### Conversations, own history: `world:multiturn-self`" in md
    assert md.index("gold history: `world:multiturn`") < md.index("own history: `world:multiturn-self`")
    own_md = md[md.index("own history: `world:multiturn-self`") :]
    assert "| pyrodash@0.5 | 2 | 2 | 50.00 | 1.00 | 100.00 | 80.00000000 | 0.2000 |" in own_md
    assert (
        "  - pyrodash@0.5 (acc 50.00%, 0.2000 of LLM-only): on the frontier; vs oracle +0.00 points, "
        "-0.0500 of LLM-only cost" in own_md
    )
    gold_md = md[: md.index("own history: `world:multiturn-self`")]
    assert "  - pyrodash@2 (acc 0.00%, 0.0500 of LLM-only): dominated by slm;" in gold_md
    # summary: per_turn keeps the gold-history turns only (as before), the rest under their own keys
    assert summary["per_turn"]["llm"][2]["cost_usd"] == pytest.approx(200)
    assert summary["per_turn"]["llm"][2]["n"] == 2 and "cost_normalized" not in summary["per_turn"]["llm"][2]
    assert summary["per_turn_by_benchmark"][SELF]["llm"][2]["cost_usd"] == pytest.approx(400)
    assert summary["turn_pareto"][SELF][2]["points"]["pyrodash@0.5"]["on_frontier"]
    assert set(ms) == set(POINTS[(SELF, 1)]) and all(m.n == 1 for m in ms.values())  # single questions only
    write_report(run)
    out = io.StringIO()
    print_turns(run, Console(file=out, width=200))
    text = out.getvalue()
    assert "gold history (world:multiturn)" in text and "own history (world:multiturn-self)" in text
    assert text.count("oracle") >= 2 and "50% / 0.200" in text and "100% / 0.600" in text
    assert "turn 2: on the frontier: pyrodash@0.5; dominated: pyrodash@2 (by slm)" in text
    # a summary from before own-history benchmarks still prints
    s = json.loads((run / "summary.json").read_text())
    s.pop("per_turn_by_benchmark")
    s.pop("turn_pareto")
    (run / "summary.json").write_text(json.dumps(s))
    out = io.StringIO()
    print_turns(run, Console(file=out, width=200))
    assert "gold history (conversations)" in out.getvalue() and "100% / --" in out.getvalue()


def test_gold_history_turns_are_batched_turn_by_turn(tmp_path):
    """A conversation benchmark after the gold history answers its turns grouped by turn (a batch's histories have
    one length, so a left-padded batch pads little); single questions keep their order. Reverting to the split's
    order (conversation by conversation) mixes turns within a batch."""
    world, exs = _world(tmp_path, n=3, turns=3)
    tier = load_benchmark("world:tier1", path=world)
    m = Fake("slm", fail_on_turn=-1)  # (a single question has no turn: None would match the default)
    cfg = EvalConfig(run_dir=str(tmp_path / "run"), benchmarks=["world:tier1", "world:multiturn"], batch_size=3)
    evaluate(cfg, {"slm": m}, examples=tier + exs, quiet=True)
    asked = [[(b, i) for b, i, _ in call] for call in m.calls]
    assert [i for call in asked for b, i in call if b == "world:tier1"] == [ex.id for ex in tier]
    turns = [[int(re.search(r"-t(\d+)$", i).group(1)) for b, i in call if b == "world:multiturn"] for call in asked]
    assert [t for t in turns if t] == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
