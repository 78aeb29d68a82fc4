"""EasyHard curation: sources, `<offload>` insertion at step boundaries, Corpus A / Corpus B.

The end-to-end curation run (base SLM -> easy/hard, LLM reconstructions) is in tests/test_train.py's quick-world
pipeline test; here the pieces are checked on world problems with their gold solutions.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.train.config import CurateConfig
from pyrodash.train.curate import boundary_candidates, build_corpora, insert_offloads, load_examples

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = "47+35=82\n\nf(82)=19\n\n19+12=31\n\nf(31)=64\n\n\\boxed{64}"


def world_examples(n: int, seed: int = 0):
    from pyrodash.world.task import make_known, make_split, make_table

    table, known = make_table(seed), make_known(0.65)
    return make_split(seed, "unit", n, [1, 2, 3, 4], table, known)


def test_boundaries_stop_at_the_final_answer():
    steps = SOLUTION.split("\n\n")
    assert boundary_candidates(steps) == [0, 1, 2, 3, 4]  # before any step, up to the answer step, never inside it
    assert boundary_candidates(["a", "b"]) == []  # no final answer: nowhere to insert


@pytest.mark.parametrize("seed", range(20))
def test_insert_offloads_count_and_placement(seed):
    rng = random.Random(seed)
    count = rng.randint(1, 4)
    text, n = insert_offloads(SOLUTION, "\n\n", count, rng)
    assert n == count == text.count(OFFLOAD_TOKEN)
    assert text.replace(OFFLOAD_TOKEN, "") == SOLUTION  # only insertions
    steps = text.split("\n\n")
    assert all(s.count(OFFLOAD_TOKEN) <= 1 and (OFFLOAD_TOKEN not in s or s.startswith(OFFLOAD_TOKEN)) for s in steps)
    assert steps[-1] in ("\\boxed{64}", OFFLOAD_TOKEN + "\\boxed{64}")  # the answer itself is never split
    # seeded: the same rng state gives the same text
    assert (
        insert_offloads(SOLUTION, "\n\n", count, random.Random(seed))[0]
        == insert_offloads(SOLUTION, "\n\n", count, random.Random(seed))[0]
    )


def test_before_hard_puts_the_first_offload_before_the_untaught_step():
    for seed in range(10):
        text, n = insert_offloads(SOLUTION, "\n\n", 3, random.Random(seed), "before_hard", hard_steps=[3])
        first = text.index(OFFLOAD_TOKEN)
        assert text[first:].startswith(OFFLOAD_TOKEN + "f(31)=64") and n == 2  # the other one: the only later boundary


def test_at_hard_puts_an_offload_before_every_untaught_step_and_nowhere_else():
    steps = SOLUTION.split("\n\n")
    for seed in range(5):
        text, n = insert_offloads(SOLUTION, "\n\n", 4, random.Random(seed), "at_hard", hard_steps=[3, 1])
        assert n == 2 and text.count(OFFLOAD_TOKEN) == 2
        assert text.split("\n\n")[1] == OFFLOAD_TOKEN + steps[1] and text.split("\n\n")[3] == OFFLOAD_TOKEN + steps[3]
    text, n = insert_offloads(SOLUTION, "\n\n", 1, random.Random(0), "at_hard", hard_steps=[3, 1])
    assert n == 1 and text.split("\n\n")[1].startswith(OFFLOAD_TOKEN)  # capped at `count`, earliest first
    exs = [ex for ex in world_examples(40) if len(ex.meta["hard_steps"]) >= 2]
    cfg = CurateConfig(offload_min=1, offload_max=4, placement="at_hard", seed=3)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    _, b, _ = build_corpora(exs, sols, {ex.id: "hard" for ex in exs}, get_prompts("world-v1"), cfg)
    assert exs and all(r["n_offload"] == min(4, len(ex.meta["hard_steps"])) for r, ex in zip(b, exs))


def test_hard_target_to_first_offload_ends_hard_targets_at_the_handoff():
    exs = world_examples(40)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    diff = {ex.id: "hard" if ex.meta["hard_steps"] else "easy" for ex in exs}
    prompts = get_prompts("world-v1")
    cfg = CurateConfig(placement="at_hard", hard_target="to_first_offload", seed=3)
    a, b, inserted = build_corpora(exs, sols, diff, prompts, cfg)
    full_a, full_b, _ = build_corpora(exs, sols, diff, prompts, CurateConfig(placement="at_hard", seed=3))
    assert {r["difficulty"] for r in a} == {"easy"} and a == [r for r in full_a if r["difficulty"] == "easy"]
    hard = [r for r in b if r["difficulty"] == "hard"]
    assert hard and len(b) == len(full_b)
    assert inserted == {1: len(hard)}  # the stats count the <offload> a target holds, not how many were placed first
    for r, f in zip(b, full_b):
        target, full = r["completion"][-1]["content"], f["completion"][-1]["content"]
        if r["difficulty"] == "easy":
            assert r == f
        else:  # the full target up to and including its first <offload>, nothing after it
            assert target.endswith(OFFLOAD_TOKEN) and target.count(OFFLOAD_TOKEN) == 1 == r["n_offload"]
            assert full.startswith(target) and len(full) > len(target)
    with pytest.raises(ValueError, match="hard_target"):
        CurateConfig(hard_target="half").validate()


def test_corpora_follow_the_paper():
    exs = world_examples(40)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    diff = {ex.id: "hard" if ex.meta["hard_steps"] else "easy" for ex in exs}
    cfg = CurateConfig(offload_min=1, offload_max=4, placement="random", seed=3)
    prompts = get_prompts("world-v1")
    a, b, inserted = build_corpora(exs, sols, diff, prompts, cfg)
    assert len(a) == len(b) == len(exs) and {"easy", "hard"} == {r["difficulty"] for r in a}
    for r in a:  # Corpus A: no P_s, no <offload> anywhere
        assert [m["role"] for m in r["prompt"] + r["completion"]] == ["user", "assistant"]
        assert all(OFFLOAD_TOKEN not in m["content"] for m in r["prompt"] + r["completion"]) and r["n_offload"] == 0
    for r in b:  # Corpus B: P_s as system message; easy targets clean, hard ones with 1-4 insertions
        assert r["prompt"][0] == {"role": "system", "content": prompts.offload_system}
        target = r["completion"][-1]["content"]
        if r["difficulty"] == "easy":
            assert OFFLOAD_TOKEN not in target and r["n_offload"] == 0
        else:
            assert 1 <= target.count(OFFLOAD_TOKEN) == r["n_offload"] <= 4
            assert OFFLOAD_TOKEN not in target.split("\n\n")[-1].replace(OFFLOAD_TOKEN + "\\boxed", "")
            assert target.replace(OFFLOAD_TOKEN, "") == sols[r["id"]]
    assert sum(v for k, v in inserted.items() if k != "no_boundary") == sum(r["difficulty"] == "hard" for r in b)
    # the same seed gives the same corpora; another seed moves the insertions
    assert build_corpora(exs, sols, diff, prompts, cfg)[1] == b
    other = build_corpora(exs, sols, diff, prompts, CurateConfig(placement="random", seed=4))[1]
    assert other != b


def test_sources_jsonl_and_errors(tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(5)))
    exs = load_examples(str(src), question_field="problem", answer_field="answer", limit=3, offset=1)
    assert [(e.question, e.gold) for e in exs] == [("1+1?", "2"), ("2+1?", "3"), ("3+1?", "4")]
    with pytest.raises(ValueError, match="question_field"):
        load_examples(str(src))
    with pytest.raises(ValueError, match="world"):
        load_examples("world:train")
    with pytest.raises(ValueError, match="hf:"):
        load_examples("data.csv")


def test_hf_source_offline_fails_clearly():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    code = (
        "from pyrodash.train.curate import load_examples\n"
        "try:\n    load_examples('hf:no-such-org/no-such-dataset', limit=2)\n"
        "except ValueError as e:\n    print('ValueError:', e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert "ValueError: could not load HF dataset 'no-such-org/no-such-dataset'" in res.stdout, res.stderr
    assert ".jsonl" in res.stdout  # ... and says what to do instead


def test_curate_config_validation():
    with pytest.raises(ValueError, match="offload_min"):
        CurateConfig(offload_min=3, offload_max=2).validate()
    with pytest.raises(ValueError, match="before_hard"):
        CurateConfig(placement="middle").validate()


def _user_data(tmp_path: Path) -> tuple[Path, Path]:
    """12 questions (train.jsonl) and 6 chat conversations of 1-3 answered turns (chats.jsonl), in the documented
    formats (docs/reference/formats.md)."""
    qs = tmp_path / "train.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+1?", "gold": str(i + 1)}) + "\n"
                          for i in range(12)))  # fmt: skip
    chats = tmp_path / "chats.jsonl"
    lines = []
    for c in range(6):
        msgs = []
        for t in range(1 + c % 3):
            msgs += [{"role": "user", "content": f"conv {c} turn {t}: {c}*{t}?"},
                     {"role": "assistant", "content": f"\\boxed{{{c * t}}}"}]  # fmt: skip
        lines.append(json.dumps({"messages": msgs}))
    chats.write_text("\n".join(lines) + "\n")
    return qs, chats


def _user_examples(cfg: CurateConfig) -> list:
    from pyrodash.train.curate import load_conversations

    return load_examples(cfg.source) + load_conversations(cfg.conversations)[0]


def test_curation_carves_val_from_your_data_by_conversation_and_says_so(tmp_path, capsys):
    """A user's questions and chat logs with no heldout_source: `val_share` of the conversations (a question is one)
    go to val whole, seeded, out of the examples curated; the carve is printed and returned for stats.json; val.jsonl
    reads back as a benchmark file with the carved questions and golds."""
    from pyrodash.data.benchmarks import load_benchmark
    from pyrodash.eval.carve import conversation_key
    from pyrodash.train.curate import carve_user_val, write_val

    qs, chats = _user_data(tmp_path)
    cfg = CurateConfig(source=str(qs), conversations=str(chats), heldout_source=None, val_share=0.25, val_seed=1)
    examples = _user_examples(cfg)
    assert len(examples) == 12 + sum(1 + c % 3 for c in range(6))
    rest, val, carve = carve_user_val(cfg, examples)
    out = capsys.readouterr().out
    convs = lambda part: {conversation_key(e) for e in part}  # noqa: E731
    assert convs(val).isdisjoint(convs(rest)) and len(val) + len(rest) == len(examples)
    assert len(convs(val)) == round(0.25 * 18) and any(e.meta.get("conversation") is not None for e in examples)
    assert carve == {"carved": True, "share": 0.25, "seed": 1, "from": [str(qs), str(chats)], "val": len(val),
                     "train": len(rest), "val_conversations": 4, "train_conversations": 14}  # fmt: skip
    assert f"val: {len(val)} of {len(examples)} examples (4 of 18 conversations, share 0.25, seed 1) carved" in out
    assert "kept out of training" in out
    again = carve_user_val(cfg, list(reversed(examples)))
    assert {e.id for e in again[1]} == {e.id for e in val}  # seeded: the same conversations, in any order
    other = carve_user_val(CurateConfig(**{**cfg.__dict__, "val_seed": 2}), examples)
    assert {e.id for e in other[1]} != {e.id for e in val}
    write_val(tmp_path / "val.jsonl", val, carve)
    back = load_benchmark("math500", path=tmp_path / "val.jsonl")
    assert [(b.question, b.gold) for b in back] == [(e.question, e.gold) for e in val]
    assert json.loads((tmp_path / "val.carve.json").read_text()) == carve


@pytest.mark.parametrize("change", [{"heldout_source": "my-val.jsonl"}, {"val_share": 0.0}, {"source": "world:train"}])
def test_no_carve_with_your_own_val_a_zero_share_or_the_world(tmp_path, capsys, change):
    from pyrodash.train.curate import carve_user_val

    qs, chats = _user_data(tmp_path)
    cfg = CurateConfig(**{"source": str(qs), "conversations": str(chats), "heldout_source": None, **change})
    examples = ["a", "b"]  # not read when there is no carve
    assert carve_user_val(cfg, examples) == (examples, [], None) and not cfg.carves_val()
    assert capsys.readouterr().out == ""


def test_val_share_must_be_a_fraction():
    with pytest.raises(ValueError, match=r"curate.val_share=1.0: give a fraction in \[0, 1\)"):
        CurateConfig(val_share=1.0).validate()
