"""Training on conversations: the world's conversation splits, chat logs as curation input, corpora of
prompt-completion rows whose loss is on the current turn only, Stage 3's mix of questions and turns, and a handoff
inside the reward that carries the turn's history exactly as the engine (and so the server) sends it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_models import tiny_model, tiny_model_dir

from pyrodash.data.example import Example
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.train.chat_logs import load_chat_turns, row_messages, turn_messages
from pyrodash.train.config import CurateConfig
from pyrodash.train.curate import build_corpora, load_conversations
from pyrodash.world.config import WorldConfig

PROMPTS = get_prompts("world-v1")


def world_turns(n: int = 6):
    """n world conversations of 3 turns (gold history in meta), with their gold solutions."""
    from pyrodash.world.multiturn import make_multiturn_split
    from pyrodash.world.task import make_known, make_table

    return make_multiturn_split(0, n, 3, [1, 2], [1, 2], make_table(0), make_known(0.65), split="multiturn_train")


# --- the world's splits --------------------------------------------------------------------------------------------


def test_world_has_train_val_and_test_conversations_and_single_splits_do_not_move():
    from pyrodash.world.build import make_splits

    cfg = replace(
        WorldConfig.from_preset("quick"),
        n_test=4,
        n_train=6,
        n_dev=3,
        n_val=3,
        n_multiturn=5,
        n_multiturn_val=2,
        n_multiturn_train=7,
    )
    splits = make_splits(cfg, 0)
    assert [len(splits[s]) for s in ("multiturn", "multiturn_val", "multiturn_train")] == [15, 6, 21]
    openers = {
        s: {ex.question for ex in splits[s] if ex.meta["turn"] == 1}
        for s in ("multiturn", "multiturn_val", "multiturn_train")
    }
    singles = {ex.question for s in ("train", "dev", "val", "tier1", "tier5") for ex in splits[s]}
    assert not (openers["multiturn"] & openers["multiturn_train"]) and not (openers["multiturn_train"] & singles)
    # more conversations change nothing else: the single-question splits and the first test conversations stay
    more = make_splits(replace(cfg, n_multiturn=8, n_multiturn_train=20), 0)
    for s in ("train", "dev", "tier1", "tier3"):  # (val is drawn last: tests/test_world_splits.py)
        assert more[s] == splits[s]
    assert more["multiturn"][:15] == splits["multiturn"]


def test_models_hash_ignores_split_sizes_only():
    cfg = WorldConfig.from_preset("quick")
    assert cfg.models_hash() == WorldConfig.from_preset("full").models_hash()  # same models, other splits
    assert cfg.models_hash() == replace(cfg, n_multiturn=7, n_multiturn_train=1).models_hash()
    assert cfg.config_hash() != replace(cfg, n_multiturn=7).config_hash()
    assert cfg.models_hash() != replace(cfg, multiturn_frac=0.1).models_hash()  # pretraining reads it
    assert cfg.models_hash() != replace(cfg, slm=replace(cfg.slm, train_steps=10)).models_hash()


def test_a_build_reuses_the_models_of_a_world_that_differs_in_its_splits_only(tmp_path, monkeypatch):
    from pyrodash.world import build

    monkeypatch.setenv("PYRODASH_CACHE", str(tmp_path))
    cfg = WorldConfig.from_preset("quick")
    worlds = tmp_path / "worlds"

    def fake_world(name: str, c: WorldConfig, seed: int, models: bool = True) -> Path:
        d = worlds / name
        for m in ("slm", "llm"):
            (d / m).mkdir(parents=True)
            if models:
                (d / m / "config.json").write_text("{}")
        (d / "world.json").write_text(
            json.dumps({"config": c.to_dict(), "seed": seed, "build_recipe": build.BUILD_RECIPE})
        )
        return d

    fake_world("other-seed", cfg, 1)
    fake_world("other-models", replace(cfg, multiturn_frac=0.1), 0)
    fake_world("half-built", replace(cfg, n_multiturn=3), 0, models=False)
    assert build.find_models(cfg, 0, shipped=False) is None  # (the shipped seed-0 models: tests/test_world.py)
    donor = fake_world("splits-differ", replace(cfg, n_multiturn=3, n_test=5), 0)
    assert build.find_models(cfg, 0) == donor  # the cache before the shipped models
    assert build.find_models(cfg, 0, exclude=donor, shipped=False) is None  # never itself


# --- chat logs -----------------------------------------------------------------------------------------------------


def test_chat_log_turns_carry_their_logged_history_and_gold(tmp_path):
    log = tmp_path / "chats.jsonl"
    convo = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "2+3=5 \\boxed{5}"},
        {"role": "user", "content": "times 4?"},
        {"role": "assistant", "content": "5*4=20 \\boxed{20}"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "no answer here"},
    ]
    rows = [
        {"messages": convo},
        [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "two", "gold": "2"}],
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    turns, counts = load_chat_turns(log)
    assert counts == {"conversations": 2, "turns": 3, "turns_without_answer": 1}
    t1, t2, other = turns
    assert (t1.question, t1.gold, t1.meta["history"]) == ("2+3?", "5", convo[:1])
    assert (t2.question, t2.gold, t2.meta["turn"]) == ("times 4?", "20", 2) and t2.meta["history"] == convo[:3]
    assert other.gold == "2" and other.meta["history"] == []
    # a logged turn is asked verbatim (as the server is asked), a world turn under the prompt set's template
    assert turn_messages(get_prompts("qwen-math-v1"), t2) == convo[:4]
    world = world_turns(1)[2]
    assert turn_messages(get_prompts("qwen-math-v1"), world)[-1]["content"] == get_prompts("qwen-math-v1").question(
        world.question
    )
    assert row_messages(PROMPTS, world.to_dict()) == turn_messages(PROMPTS, world)
    assert load_chat_turns(log, limit=1)[1]["conversations"] == 1
    assert load_conversations(str(log))[0] == turns  # curation's conversations source reads it
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user"}]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_chat_turns(bad)


def test_curate_chats_flag_checks_the_file(tmp_path, capsys):
    from pyrodash.cli import main

    not_chats = tmp_path / "qa.jsonl"
    not_chats.write_text(json.dumps({"question": "1+1", "gold": "2"}) + "\n")
    root = Path(__file__).resolve().parent.parent
    for path, msg in ((tmp_path / "none.jsonl", "no such file"), (not_chats, 'one {"messages"')):
        rc = main(
            [
                "curate",
                "--config",
                str(root / "configs/world/quick.yaml"),
                "--output-dir",
                str(tmp_path / "o"),
                "--chats",
                str(path),
            ]
        )
        assert rc != 0 and msg in capsys.readouterr().err


# --- corpora: prompt-completion, loss on the current turn only --------------------------------------------------


def test_turn_rows_put_the_history_in_the_prompt_and_only_the_turn_in_the_completion():
    exs = world_turns(6)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    diff = {ex.id: "hard" if ex.meta["hard_steps"] else "easy" for ex in exs}
    cfg = CurateConfig(placement="at_hard", hard_target="to_first_offload")
    a, b, _ = build_corpora(exs, sols, diff, PROMPTS, cfg)
    by_id = {ex.id: ex for ex in exs}
    assert {r["turn"] for r in b} == {1, 2, 3}
    for r in b:
        ex = by_id[r["id"]]
        assert r["prompt"][0] == {"role": "system", "content": PROMPTS.offload_system}
        assert r["prompt"][1:] == ex.meta["history"] + [{"role": "user", "content": ex.question}]
        assert [m["role"] for m in r["completion"]] == ["assistant"]
        target = r["completion"][0]["content"]
        if r["difficulty"] == "hard":  # <offload> before the first untaught step of THIS turn, cut there
            assert target.endswith(OFFLOAD_TOKEN) and sols[r["id"]].startswith(target[: -len(OFFLOAD_TOKEN)])
            first_hard = ex.meta["steps"][ex.meta["hard_steps"][0]]
            assert sols[r["id"]][len(target) - len(OFFLOAD_TOKEN) :].startswith(first_hard)
    for r in a:
        assert r["prompt"] == by_id[r["id"]].meta["history"] + [{"role": "user", "content": r["question"]}]


def test_sft_trains_the_current_turn_only(tmp_path):
    """TRL tokenizes a turn row with labels on the completion: not one history token is trained."""
    from trl import SFTConfig, SFTTrainer

    from pyrodash.train.common import messages_dataset

    model, tok = tiny_model(seed=0)
    ex = world_turns(1)[2]  # turn 3: two earlier solutions in the history
    sol = ex.meta["solution"]
    a, _, _ = build_corpora([ex], {ex.id: sol}, {ex.id: "easy"}, PROMPTS, CurateConfig())
    args = SFTConfig(
        output_dir=str(tmp_path),
        assistant_only_loss=True,
        max_length=2048,
        report_to="none",
        bf16=False,
        per_device_train_batch_size=1,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=messages_dataset(a), processing_class=tok)
    row = trainer.train_dataset[0]
    ids = row["input_ids"]
    trained = [t for t, label in zip(ids, row["labels"], strict=True) if label != -100]
    text = tok.decode(trained)
    assert text.startswith(sol) and len(text) < len(sol) + 20  # the turn (+ end-of-turn), nothing before it
    seen = tok.decode(ids)
    assert all(m["content"] in seen for m in ex.meta["history"])  # ... though the model reads the whole history


# --- Stage 3: the mix and the reward -----------------------------------------------------------------------------


def test_stage3_mixes_conversation_turns_in(tmp_path):
    from pyrodash.train.stage3 import training_prompts
    from pyrodash.world.build import write_splits

    world = tmp_path / "w"
    singles = [Example(id=f"q{i}", benchmark="world:train", question=f"{i}: +1x1", gold=str(i + 1)) for i in range(12)]
    write_splits({"train": singles, "multiturn_train": world_turns(10)}, world / "data")

    class Cfg:
        source, source_split, question_field, answer_field = "world:train", "train", "question", "gold"
        train_limit, train_offset, conversations, conversation_share = 8, 0, "world:multiturn_train", 0.2

    got = training_prompts(Cfg, world)
    assert [ex.id for ex in got[:8]] == [f"q{i}" for i in range(8)]  # train_limit single questions, as before
    turns = got[8:]
    assert len(turns) == 2 and all(ex.meta["turn"] > 1 for ex in turns)  # 2 / 10 = 0.2, follow-ups first
    Cfg.conversation_share = 0.0
    assert training_prompts(Cfg, world) == got[:8]


def test_reward_hands_a_turn_off_with_its_history(tmp_path):
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.cost import Prices
    from pyrodash.engine import handoff_request
    from pyrodash.train.models import FrozenLLM
    from pyrodash.train.reward import BaselineCache, CollaborativeReward
    from pyrodash.train.stage3 import collaboration_engine

    prices = Prices.from_yaml("paper")
    llm = FrozenLLM.from_spec(str(tiny_model_dir(tmp_path / "llm", seed=3, offload=False)), batch_size=8)
    ex = world_turns(1)[1]  # turn 2
    chat = turn_messages(PROMPTS, ex)
    cache = BaselineCache(tmp_path / "cb.json", "tiny", PROMPTS, prices, max_tokens=10)
    assert cache.fill(llm, [ex.question, chat], ["1", ex.gold]) == 2
    assert cache.key(ex.question) != cache.key(chat)  # Cost_base per turn: the LLM after the same history
    assert cache.entries[cache.key(chat)]["t_in"] > cache.entries[cache.key(ex.question)]["t_in"]
    slm, slm_tok = tiny_model(seed=2)
    engine = collaboration_engine(HFBackend(slm, slm_tok), llm, PROMPTS, prices, 10, 10)
    sent, batch = [], llm.backend.generate_batch
    llm.backend.generate_batch = lambda reqs, **kw: sent.extend(reqs) or batch(reqs, **kw)
    ids = slm_tok.encode("(1,1) 5+1=6\n\n", add_special_tokens=False) + [engine.offload_id]
    reward = CollaborativeReward(engine, cache, lam=0.5)
    r = reward(
        prompts=None,
        completions=["(1,1) 5+1=6\n\n"],
        completion_ids=[ids],
        question=[ex.question],
        gold=[ex.gold],
        chat=[json.dumps(chat)],
    )
    # one handoff: [P_l] + the turn's history + its question, the SLM's partial turn as the prefix, exactly the
    # server's request (the engine may hand an in-process model that request already rendered: compare the prompts)
    want = handoff_request(PROMPTS, engine.llm_style, chat, "(1,1) 5+1=6\n\n", 10)
    assert want.messages[1:-1] == ex.meta["history"] and want.messages[-1]["content"] == ex.question
    assert len(sent) == 1 and llm.backend.render(sent[0]) == llm.backend.render(want)
    assert all(m["content"] in llm.backend.render(sent[0]) for m in ex.meta["history"])
    assert reward.last[0]["r_eff"] == pytest.approx(reward.last[0]["cost_act"] / cache.cost_base(chat))
    assert r[0] == pytest.approx(reward.last[0]["r_acc"] - 0.5 * reward.last[0]["r_eff"])


def test_curate_chats_runs_each_logged_turn_through_curation(tmp_path, capsys):
    """`pyrodash curate --chats FILE` on real (tiny) models: every answered turn of the log is judged by the SLM
    after its logged history, the hard ones sent to the LLM after the same history."""
    from pyrodash.cli import main

    slm, llm = tiny_model_dir(tmp_path / "slm", seed=2), tiny_model_dir(tmp_path / "llm", seed=3, offload=False)
    log = tmp_path / "chats.jsonl"
    convo = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "\\boxed{5}"},
        {"role": "user", "content": "times 4?"},
        {"role": "assistant", "content": "\\boxed{20}"},
    ]
    log.write_text(json.dumps({"messages": convo}) + "\n" + json.dumps({"messages": convo[:2]}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: t\nslm: {slm}\nllm: {llm}\nprompts: world-v1\ncurate: {{source: null, "
        "heldout_source: null, val_share: 0, slm_max_new_tokens: 6, llm_max_new_tokens: 6, batch_size: 4}\n"
    )
    assert main(["curate", "--config", str(recipe), "--output-dir", str(tmp_path / "o"), "--chats", str(log)]) == 0
    stats = json.loads((tmp_path / "o" / "curated" / "stats.json").read_text())
    assert stats["examples"] == 3 and stats["conversations"]["turns"] == 3
    assert stats["llm_calls"] == stats["hard"]  # one reconstruction per hard turn
    journal = [json.loads(x) for x in (tmp_path / "o" / "curated" / "llm_calls.jsonl").read_text().splitlines()]
    lengths = sorted({x["gen"]["prompt_tokens"] for x in journal})
    # turn 1 asked alone; turn 2 after the logged turn 1 (its question and answer: char-level tokens)
    assert len(lengths) == 2 and lengths[1] - lengths[0] >= len("\\boxed{5}") + len("times 4?") - len("2+3?")
