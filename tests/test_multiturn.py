"""The world's conversations (pyrodash.world.multiturn): follow-up generator, pretraining examples, the multi-turn
split, and its evaluation per turn (records through `pyrodash.eval.harness` with real tiny
models, the report section)."""

from __future__ import annotations

import json
import random

import pytest
from tiny_models import tiny_model_dir

from pyrodash.backends.base import GenRequest
from pyrodash.cost import Prices
from pyrodash.eval.harness import EvalConfig, evaluate
from pyrodash.prompts import get_prompts
from pyrodash.world.multiturn import (
    FOLLOWUP,
    assistant_starts,
    chat_messages,
    followup_question,
    make_multiturn_split,
    pretrain_example,
    sample_conversation,
)
from pyrodash.world.task import Problem, make_known, make_split, make_table, solve, untaught_spans
from pyrodash.world.tokenizer import IM_END_ID, encode_chat

TABLE, KNOWN = make_table(0), make_known(0.65)


def test_followups_continue_from_the_previous_answer():
    convo = sample_conversation(random.Random(1), 4, 2, [1, 2], TABLE)
    assert len(convo) == 4 and not convo[0][0].startswith(FOLLOWUP)
    for (_, _, prev), (q, p, sol) in zip(convo, convo[1:]):
        assert q.startswith(FOLLOWUP) and p.start == prev.answer
        assert q == FOLLOWUP + p.question().split(": ", 1)[1] and sol == solve(p, TABLE)
        assert sol.steps[0].split(" ")[1].startswith(f"{prev.answer:02d}+")  # it starts from the previous answer
    assert followup_question(Problem(5, 3, 4, 1)) == FOLLOWUP + "+3x4 f1"
    with pytest.raises(ValueError, match="at least one turn"):
        sample_conversation(random.Random(0), 0, 1, [1], TABLE)


def test_multiturn_split_one_example_per_turn_with_gold_history():
    seen = {"01: +1x7 f1"}
    exs = make_multiturn_split(0, 5, 3, [1, 2], [1], TABLE, KNOWN, exclude=seen)
    assert len(exs) == 15 and len({e.id for e in exs}) == 15 and {e.benchmark for e in exs} == {"world:multiturn"}
    assert exs == make_multiturn_split(0, 5, 3, [1, 2], [1], TABLE, KNOWN, exclude={"01: +1x7 f1"})
    for c in range(5):
        t1, t2, t3 = exs[3 * c : 3 * c + 3]
        assert [e.meta["turn"] for e in (t1, t2, t3)] == [1, 2, 3] and t1.meta["history"] == []
        assert t1.question in seen and t3.meta["conversation"] == t1.meta["conversation"]
        assert t2.meta["history"] == [
            {"role": "user", "content": t1.question},
            {"role": "assistant", "content": t1.meta["solution"]},
        ]
        assert t3.meta["history"] == t2.meta["history"] + [
            {"role": "user", "content": t2.question},
            {"role": "assistant", "content": t2.meta["solution"]},
        ]
        assert t3.meta["solution"].split(" ")[1].startswith(f"{int(t2.gold):02d}+")
        assert t3.meta["solution"].endswith(f"{{{int(t3.gold):02d}}}")


@pytest.mark.parametrize("which", ["slm", "llm"])
def test_pretrain_conversations_train_every_turn_and_mask_untaught_lookups(which):
    rng = random.Random(3)
    for _ in range(20):
        state = rng.getstate()
        ids, labels = pretrain_example(rng, which, 3, [1, 2, 3], [1, 2], TABLE, KNOWN, encode_chat)
        replay = random.Random()
        replay.setstate(state)
        convo = sample_conversation(replay, replay.randint(2, 3), replay.choice([1, 2, 3]), [1, 2], TABLE)
        msgs = chat_messages(convo)
        assert ids == encode_chat(msgs)[0]
        want = [-100] * len(ids)
        for start, (_, _, sol) in zip(assistant_starts(msgs, encode_chat), convo):
            text = sol.text()
            keep = [True] * len(text)
            for a, b in untaught_spans(sol, KNOWN) if which == "slm" else []:
                keep[a:b] = [False] * (b - a)
            for i in range(len(text) + 1):  # the content, then its end-of-turn token
                if i == len(text) or keep[i]:
                    want[start + i] = ids[start + i]
            assert ids[start + len(text)] == IM_END_ID
        assert labels == want


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    from pyrodash.backends.hf.backend import HFBackend

    d = tmp_path_factory.mktemp("models")
    return HFBackend(tiny_model_dir(d / "slm", seed=1)), HFBackend(tiny_model_dir(d / "llm", seed=2))


def test_multiturn_split_is_evaluated_and_reported_per_turn(tmp_path, backends):
    from pyrodash.eval.methods import Env, PyroDash, Solo
    from pyrodash.report.render import render
    from pyrodash.report.turns import per_turn

    slm, llm = backends
    prompts, prices = get_prompts("world-v1"), Prices.from_yaml("paper")
    env = Env(prompts, prices, max_tokens=10, batch_size=4)
    exs = make_multiturn_split(0, 3, 2, [1], [1], TABLE, KNOWN)
    single = make_split(0, "tier1", 2, [1], TABLE, KNOWN)
    methods = {
        "slm": Solo("slm", slm, "slm", env),
        "llm": Solo("llm", llm, "llm", env),
        "pyrodash@0.1": PyroDash("pyrodash@0.1", slm, llm, env, offload_bias=100.0),
    }
    evaluate(
        EvalConfig(run_dir=str(tmp_path), benchmarks=["world:multiturn"], batch_size=4),
        methods,
        examples=exs + single,
        quiet=True,
    )

    def turns(name: str) -> list[dict]:  # the method's conversation records, in the split's order
        by_id = {r["id"]: r for r in map(json.loads, (tmp_path / "records" / f"{name}.jsonl").read_text().splitlines())}
        return [by_id[ex.id] for ex in exs]

    recs = turns("pyrodash@0.1")
    assert [r["meta"]["turn"] for r in recs] == [1, 2] * 3 and all(r["llm_calls"] == 1 for r in recs)
    slm_recs = turns("slm")
    for ex, r in zip(exs, slm_recs):  # each model read the gold history, then the turn's question
        n = len(slm.prompt_ids(GenRequest(messages=ex.meta["history"] + prompts.plain_messages(ex.question))))
        assert r["slm_in"] == n
    assert slm_recs[1]["slm_in"] > slm_recs[0]["slm_in"]
    # the batched PyroDash path equals the engine on the same conversation
    assert recs[1]["output"] == methods["pyrodash@0.1"].engine.run(env.chat(exs[1]), offload_bias=100.0).output
    pt = per_turn({"pyrodash@0.1": recs, "slm": slm_recs}, prices)
    assert set(pt["pyrodash@0.1"]) == {1, 2} and pt["pyrodash@0.1"][2]["n"] == 3
    assert pt["pyrodash@0.1"][2]["llm_calls"] == 1.0 and pt["slm"][1]["llm_calls"] == 0.0
    assert pt["slm"][2]["accuracy"] == sum(r["correct"] for r in slm_recs[1::2]) / 3
    md, summary, _ = render(tmp_path)
    assert "## Conversations: per turn" in md and "| pyrodash@0.1 | 2 | 3 |" in md
    assert summary["per_turn"]["llm"][1]["n"] == 3
    # the paper's tables cover single questions: turns are only in their own section
    assert set(summary["methods"]["slm"]["per_benchmark"]) == {"world:tier1"} and summary["methods"]["slm"]["n"] == 2


def test_turn_prompts_and_per_turn_accuracy_of_a_world_model(backends):
    from pyrodash.world.multiturn import evaluate_turns, turn_prompt_ids
    from pyrodash.world.tokenizer import encode_chat

    exs = make_multiturn_split(1, 2, 3, [1], [1], TABLE, KNOWN)
    slm = backends[0]
    ids = turn_prompt_ids(exs[2], encode_chat)
    assert ids == slm.prompt_ids(
        GenRequest(messages=exs[2].meta["history"] + [{"role": "user", "content": exs[2].question}])
    )
    acc = evaluate_turns(slm.model, exs, batch_size=8)
    # the same turns decoded one by one through the engine's own greedy loop, graded by the gold answers
    from pyrodash.grading import grade_batch

    outs = [
        slm.generate(
            GenRequest(
                messages=ex.meta["history"] + [{"role": "user", "content": ex.question}],
                max_tokens=len(ex.meta["solution"]) + 24,
            )
        ).text
        for ex in exs
    ]
    ok = grade_batch(outs, [ex.gold for ex in exs], workers=0)
    assert acc == {t: sum(ok[t - 1 :: 3]) / 2 for t in (1, 2, 3)}


def test_pretraining_mix_adds_conversations_without_changing_single_questions():
    from dataclasses import replace

    from pyrodash.world.config import WorldConfig
    from pyrodash.world.pretrain import example_stream
    from pyrodash.world.tokenizer import IM_START_ID

    cfg = WorldConfig.from_preset("quick")
    with pytest.raises(ValueError, match="multiturn_frac"):
        replace(cfg, multiturn_frac=1.5)
    plain = example_stream("slm", replace(cfg, multiturn_frac=0.0), 0)
    mixed = example_stream("slm", cfg, 0)
    singles, convos = [], 0
    for _ in range(400):
        ids, labels = next(mixed)
        if ids.count(IM_START_ID) >= 4:  # [system] user assistant user assistant ...: a conversation
            convos += 1
        else:
            singles.append((ids, labels))
    assert 0.12 < convos / 400 < 0.28  # multiturn_frac = 0.2
    assert singles == [next(plain) for _ in singles]  # the single-question stream is untouched
