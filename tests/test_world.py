"""The built-in world: generator determinism, tokenizer and chat template, HF loading, caching, the base models that
ship with PyroDash, and (slow) a from-scratch quick build: its SLM/LLM gap and hidden-difficulty property, and the
shipped models it reproduces."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.world.config import TIER_SPLITS, ModelSpec, WorldConfig
from pyrodash.world.task import STEP_SEP, make_known, make_table, sample_problem, solve, untaught_spans

TINY = WorldConfig(
    n_test=4,
    n_train=12,
    n_dev=6,
    n_val=6,
    n_continue=5,
    eval_batch_size=8,
    preset="tiny",
    n_multiturn=3,
    n_multiturn_train=4,
    n_multiturn_val=2,
    slm=ModelSpec(32, 1, 2, 64, True, 30, 3e-3, batch_size=8, warmup_steps=5),
    llm=ModelSpec(48, 2, 2, 96, False, 30, 3e-3, batch_size=8, warmup_steps=5),
)


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    from pyrodash.world.build import build_world

    return build_world(tmp_path_factory.mktemp("world") / "tiny", seed=3, cfg=TINY, verbose=False)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from pyrodash.world.tokenizer import save_tokenizer

    d = tmp_path_factory.mktemp("tok")
    save_tokenizer(d)
    return AutoTokenizer.from_pretrained(str(d))


# ---- generator ---------------------------------------------------------------------------------------------------


def test_splits_deterministic_per_seed_and_disjoint():
    from pyrodash.world.build import make_splits
    from pyrodash.world.multiturn import LONG_SPLITS

    a, b, c = make_splits(TINY, 0), make_splits(TINY, 0), make_splits(TINY, 1)
    assert [e.to_dict() for s in a.values() for e in s] == [e.to_dict() for s in b.values() for e in s]
    assert [e.question for e in a["tier3"]] != [e.question for e in c["tier3"]]
    assert make_table(0) != make_table(1) and sorted(make_table(0)) == list(range(100))
    # every question is new, conversation openers included (follow-ups like "Then: +3, f." naturally repeat)
    questions = [e.question for s in a.values() for e in s if e.meta.get("turn", 1) == 1]
    assert len(questions) == len(set(questions))
    turns = TINY.multiturn_turns
    assert {s: len(v) for s, v in a.items()} == {
        "train": 12,
        "dev": 6,
        "val": 6,
        **{s: n * t for s, (n, t) in LONG_SPLITS.items()},
        **{t: 4 for t in TIER_SPLITS},
        "multiturn": 3 * turns,
        "multiturn_val": 2 * turns,
        "multiturn_train": 4 * turns,
    }


def test_solution_format_and_hard_steps():
    from pyrodash.grading import is_correct
    from pyrodash.world.task import ADDS_PER_LOOKUP, Problem, to_example

    table, known = make_table(0), make_known(0.6)
    rng = random.Random(0)
    for tier in (1, 3, 5):
        for _ in range(50):
            p = sample_problem(rng, tier)
            ex = to_example(p, table, known, "t", 0, tier)
            steps = ex.meta["steps"]
            assert len(steps) == 2 * tier + 1 and sum(s.startswith("f(") for s in steps) == tier
            assert len(steps[0].split("\n")) == p.run and "+" in steps[0]  # the lead run: no lookup in the question
            assert all(len(s.split("\n")) == ADDS_PER_LOOKUP for s in steps[2::2])
            assert ex.meta["solution"] == STEP_SEP.join(steps) + STEP_SEP + f"\\boxed{{{int(ex.gold):02d}}}"
            assert is_correct(ex.meta["solution"], ex.gold)
            for i in ex.meta["hard_steps"]:
                x = int(steps[i][2 : steps[i].index(")")])
                assert x not in known and i >= 1
            assert all(
                int(s[2 : s.index(")")]) in known
                for i, s in enumerate(steps)
                if s.startswith("f(") and i not in ex.meta["hard_steps"]
            )
    # every addition line carries (additions left in its run, lookups left): each line follows from the one before
    sol = solve(Problem(95, 7, 3, 2), table)
    assert sol.steps[0] == "(2,2) 95+7=02\n(1,2) 02+7=09\n(0,2) 09+7=16"
    y = table[16]
    assert sol.steps[1] == f"f(16)={y:02d}" and sol.steps[2] == f"(0,1) {y:02d}+7={(y + 7) % 100:02d}"
    assert sol.steps[4].startswith("(0,0) ") and Problem(5, 7, 3, 2).question() == "05: +7x3 f2"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_world_economics_hold_from_gold_solutions(seed):
    """The task's design targets, from gold solutions and the real token counts (no model): LLM-only writes >= 10x
    what it reads, the first untaught step sits mid-solution (median 0.3-0.7 of its length), and a single handoff
    right before it costs <= 50% of LLM-only (`scripts/world_economics.py` prints the same per tier)."""
    import importlib.util
    from pathlib import Path

    from pyrodash.cost import Prices
    from pyrodash.world.build import make_splits

    path = Path(__file__).resolve().parents[1] / "scripts" / "world_economics.py"
    spec = importlib.util.spec_from_file_location("world_economics", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    splits = make_splits(WorldConfig.from_preset("quick"), seed)
    out = mod.economics({n: splits[n] for n in TIER_SPLITS}, get_prompts("world-v1"), Prices.from_yaml("paper"))
    assert out["out_in"] >= 10 and 0.3 <= out["first_hard_median"] <= 0.7 and out["oracle_cost"] <= 0.5, out
    assert 0.2 <= out["no_hard_share"] <= 0.4, out  # what the base SLM can solve alone (paper: 28.4%)


def test_slm_pretraining_never_sees_untaught_lookup_results():
    """The SLM's labels cover every character of the solution except the results of lookups outside its known
    range; the LLM's cover all of them."""
    from pyrodash.world.evaluate import ID_TO_TOKEN
    from pyrodash.world.pretrain import example_stream

    cfg = replace(WorldConfig.from_preset("quick"), multiturn_frac=0.0)  # conversations: tests/test_multiturn.py
    known = make_known(cfg.known_frac)
    assert known == frozenset(range(65))
    masked_some = 0
    for which in ("slm", "llm"):
        stream = example_stream(which, cfg, 0)
        for _ in range(200):
            ids, labels = next(stream)
            start = next(i for i, t in enumerate(labels) if t != -100)  # the solution's first character
            sol = "".join(ID_TO_TOKEN[i] for i in ids[start:-1])  # up to <|im_end|>
            trained = "".join(ID_TO_TOKEN[t] if t != -100 else "_" for t in labels[start : start + len(sol)])
            for k, step in enumerate(sol.split(STEP_SEP)):
                if step.startswith("f("):
                    x, y = step[2 : step.index(")")], step[step.index("=") + 1 :]
                    assert len(x) == len(y) == 2
                    seg = trained.split(STEP_SEP)[k]
                    untaught = which == "slm" and int(x) not in known
                    assert seg == (step[: step.index("=") + 1] + "_" * len(y) if untaught else step)
                    masked_some += untaught
    assert masked_some > 50


def test_untaught_spans_point_at_lookup_results():
    table, known = make_table(3), make_known(0.5)
    rng = random.Random(1)
    for _ in range(100):
        sol = solve(sample_problem(rng, 4), table)
        spans = untaught_spans(sol, known)
        assert len(spans) == sum(x not in known for _, x in sol.lookups)
        for (a, b), (_, x) in zip(spans, [lk for lk in sol.lookups if lk[1] not in known]):
            assert sol.text()[a:b] == f"{table[x]:02d}" and sol.text()[a - 1] == "="


def test_bad_config_raises():
    with pytest.raises(ValueError, match="known_frac"):
        WorldConfig(known_frac=1.0)
    with pytest.raises(ValueError, match="tiers"):
        WorldConfig(tiers=(1, 2))
    with pytest.raises(ValueError, match="preset"):
        WorldConfig.from_preset("huge")


# ---- tokenizer and chat template ---------------------------------------------------------------------------------


def test_tokenizer_round_trip(tok):
    from pyrodash.world.tokenizer import encode_text

    text = "47: +5x1 f1\n\n(0,1) 47+5=52\n\n\\boxed{52} ~!`|"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == encode_text(text) and len(ids) == len(text)
    # a role word is one token wherever it appears, in HF's tokenizer and in `encode_text` alike
    assert tok.encode("users assistant", add_special_tokens=False) == encode_text("users assistant")
    assert len(encode_text("users assistant")) == 4 and tok.decode(encode_text("users assistant")) == "users assistant"
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.convert_tokens_to_ids(OFFLOAD_TOKEN) == tok.unk_token_id  # not in the base vocabulary


def test_chat_template_matches_fast_encoder(tok):
    from pyrodash.chat import template_messages
    from pyrodash.world.tokenizer import encode_chat, render_chat

    p = get_prompts("world-v1")
    msgs = [
        {"role": "system", "content": p.completion_system},
        {"role": "user", "content": "01: +2x1 f1"},
        {"role": "assistant", "content": "(0,1) 01+2=03\n\nf(03)=07\n\n\\boxed{07}"},
    ]
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = encode_chat(msgs)
    assert out["input_ids"] == ids and out["assistant_masks"] == mask
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == msgs[-1]["content"] + "<|im_end|>"
    assert tok.apply_chat_template(msgs, tokenize=False) == render_chat(msgs)
    gen = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert gen == render_chat(msgs[:2], add_generation_prompt=True) and gen.endswith("<|im_start|>assistant\n")
    partial = [*msgs[:2], {"role": "assistant", "content": "(0,1) 01+2=03\n\n"}]
    cont = tok.apply_chat_template(partial, tokenize=False, continue_final_message=True)
    assert cont == gen + "(0,1) 01+2=03\n\n"
    assert len(encode_chat(msgs[1:2], add_generation_prompt=True)[0]) == 8 + len("01: +2x1 f1")  # compact roles
    with pytest.raises(ValueError, match="role"):
        encode_chat([{"role": "function", "content": "x"}])
    # a tool loop: the tools first, the assistant's call in its text (the hermes family), the tool's result
    tools = [{"type": "function", "function": {"name": "lookup_g", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_g", "arguments": '{"x": 28}'}}
    loop = [
        msgs[1],
        {"role": "assistant", "content": "(0,1) 01+2=03\n\n", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "g(28)=63"},
        {"role": "assistant", "content": "ok"},
    ]
    out = tok.apply_chat_template(
        template_messages(loop), tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert (out["input_ids"], out["assistant_masks"]) == encode_chat(loop, tools=tools)
    text = render_chat(loop, tools=tools)
    assert '<tool_call>{"name":"lookup_g","arguments":{"x":28}}</tool_call>' in text and "<|im_start|>tool\n" in text
    assert tok.apply_chat_template(template_messages(loop), tools=tools, tokenize=False) == text


# ---- build, HF loading, cache ------------------------------------------------------------------------------------


def test_tiny_build_loads_with_hf(tiny_world):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    info = json.loads((tiny_world / "world.json").read_text())
    assert set(info["accuracy"]["slm"]) == {*TIER_SPLITS, "mean"} and set(info["accuracy"]["llm"]) == {
        *TIER_SPLITS,
        "mean",
    }
    assert info["config_hash"] == TINY.config_hash() and info["seed"] == 3
    assert info["params"]["llm"] > info["params"]["slm"]
    for which, tied in (("slm", True), ("llm", False)):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_world / which))
        tk = AutoTokenizer.from_pretrained(str(tiny_world / which))
        assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.tie_word_embeddings is tied
        assert any(n.endswith("q_proj.weight") for n, _ in model.named_parameters())
        assert GenerationConfig.from_pretrained(str(tiny_world / which)).eos_token_id == tk.eos_token_id
        ids = tk.apply_chat_template(
            [{"role": "user", "content": "01: +2x1 f1"}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        out = model.generate(**ids, max_new_tokens=5, do_sample=False)
        assert out.shape[1] > ids["input_ids"].shape[1]
        # Stage 1 adds <offload> to these models: it must work on tied and untied embeddings alike.
        from pyrodash.tokens import add_offload_token, anchor_token_ids

        tid = add_offload_token(model, tk, sigma=0.01, seed=0)
        assert tid == len(tk) - 1 and model.get_input_embeddings().weight.shape[0] == tid + 1
        anchors = anchor_token_ids(tk)
        assert len(anchors) == 3  # ".", "\n" and <|im_end|> are single tokens
        mean = model.get_input_embeddings().weight[anchors].mean(0)
        assert torch.allclose(model.get_input_embeddings().weight[tid], mean, atol=0.1)
        assert tk.encode("a" + OFFLOAD_TOKEN, add_special_tokens=False)[-1] == tid


def test_load_world_split_and_cache(tiny_world):
    from pyrodash.data.benchmarks import load_benchmark, load_world_split
    from pyrodash.world.build import build_world

    exs = load_world_split(tiny_world, "tier2")
    assert len(exs) == 4 and all(e.meta["tier"] == 2 and e.benchmark == "world:tier2" for e in exs)
    assert [e.id for e in load_benchmark("world:tier2", path=tiny_world)] == [e.id for e in exs]
    with pytest.raises(ValueError, match="split"):
        load_world_split(tiny_world, "tier9")
    mtime = (tiny_world / "slm" / "model.safetensors").stat().st_mtime
    assert build_world(tiny_world, seed=3, cfg=TINY, verbose=False) == tiny_world  # reused, not retrained
    assert (tiny_world / "slm" / "model.safetensors").stat().st_mtime == mtime
    with pytest.raises(ValueError, match="--force"):
        build_world(tiny_world, seed=4, cfg=TINY, verbose=False)
    other = replace(TINY, n_test=5)
    assert other.config_hash() != TINY.config_hash()


def test_first_wrong_step():
    from pyrodash.data.example import Example
    from pyrodash.world.evaluate import first_wrong_distribution, first_wrong_step

    steps = ["1+2=3", "f(3)=7", "7+1=8"]
    assert first_wrong_step("1+2=3\n\nf(3)=7\n\n7+1=8\n\n\\boxed{8}", steps) is None
    assert first_wrong_step("1+2=3\n\nf(3)=5\n\n5+1=6", steps) == 1
    assert first_wrong_step("1+2=4", steps) == 0
    ex = Example("a", "world:t", "q", "8", {"steps": steps, "hard_steps": [1]})
    d = first_wrong_distribution([ex, ex], ["1+2=3\n\nf(3)=5", "1+2=4"], [False, False])
    assert d["n"] == 2 and d["step_index"] == {"0": 1, "1": 1}
    assert d["relative_to_first_hard"] == {"at_first_hard": 1, "before_first_hard": 1}


# ---- the quick world (slow; cached under $PYRODASH_CACHE so other tests reuse it) ----------------------------------


@pytest.mark.slow
def test_quick_world_from_scratch_gap_hidden_difficulty_and_the_shipped_models(scratch_world):
    """A quick build that pretrains its models here (`from_scratch`, as `pyrodash world build --from-scratch`; built
    in the background while other tests run: tests/conftest.py): the world's properties, and the models that ship
    with PyroDash are its models, byte for byte, on the platform that trained them (torch version, CPU capability and
    CPU; elsewhere PyTorch does not promise the same bits)."""
    from pyrodash.world.build import read_world_info, world_warnings
    from pyrodash.world.shipped import SHIPPED, platform

    world = scratch_world
    info = read_world_info(world)
    assert info["models_from"] is None and not info["models_shipped"]
    acc = info["accuracy"]
    assert 0.15 <= acc["slm"]["mean"] <= 0.65, acc
    assert acc["llm"]["mean"] >= 0.75 and acc["llm"]["mean"] - acc["slm"]["mean"] >= 0.3, acc
    assert acc["slm"]["tier1"] > acc["slm"]["tier5"], acc  # tiers go from easy to hard
    by = info["slm_accuracy_by_difficulty"]
    assert by["no_hard_step"] >= by["has_hard_step"] + 0.4, by  # the untaught lookups are what the SLM fails
    fw = info["first_wrong_step"]
    assert fw["n"] >= 20 and fw["frac_first_step"] < 0.2 and fw["frac_at_first_hard"] >= 0.5, fw
    assert info["llm_continue"] >= 0.75  # it continues a gold prefix as its own answer (how the engine hands off)
    assert world_warnings(info) == []
    shipped = json.loads((SHIPPED / "seed0" / "world.json").read_text())
    if shipped["shipped_from"]["platform"] == platform():
        for m in ("slm", "llm"):
            assert (world / m / "model.safetensors").read_bytes() == (
                SHIPPED / "seed0" / m / "model.safetensors"
            ).read_bytes(), m
        assert info["accuracy"] == shipped["accuracy"]


def test_the_shipped_base_models_are_current_and_load():
    """The base models that ship with PyroDash are the ones the quick preset's config trains (same models hash and
    build recipe; `scripts/ship_world.py` ships them again after a change), from a from-scratch build, and load with
    `from_pretrained` as the shapes the config gives."""
    from transformers import AutoModelForCausalLM

    from pyrodash.world.build import BUILD_RECIPE, has_models
    from pyrodash.world.pretrain import model_config
    from pyrodash.world.shipped import SHIPPED, platform

    cfg = WorldConfig.from_preset("quick")
    d = SHIPPED / "seed0"
    info = json.loads((d / "world.json").read_text())
    assert (WorldConfig.from_dict(info["config"]).models_hash(), info["build_recipe"]) == (
        cfg.models_hash(),
        BUILD_RECIPE,
    ), "the world's models changed: run `python scripts/ship_world.py`"
    assert info["seed"] == 0 and info["models_from"] is None and has_models(d)
    assert set(info["shipped_from"]["platform"]) == set(platform())  # what the from-scratch test compares
    for m, spec in (("slm", cfg.slm), ("llm", cfg.llm)):
        model = AutoModelForCausalLM.from_pretrained(str(d / m))
        want = model_config(spec)
        assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.intermediate_size) == (
            want.hidden_size,
            want.num_hidden_layers,
            want.intermediate_size,
        )
        assert sum(p.numel() for p in model.parameters()) == info["params"][m]


def test_a_build_copies_the_shipped_models_and_from_scratch_does_not(tmp_path, monkeypatch, capsys):
    """With an empty cache, a quick build of seed 0 copies the shipped models (world.json and the console say so) and
    measures them (or, on their platform, copies their measurements); another seed, or `from_scratch`, finds none to
    copy; a built world whose models were copied is built again when asked for `from_scratch`."""
    from pyrodash.world import build
    from pyrodash.world.shipped import SHIPPED

    monkeypatch.setenv("PYRODASH_CACHE", str(tmp_path / "cache"))
    cfg = WorldConfig.from_preset("quick")
    assert build.find_models(cfg, 0) == SHIPPED / "seed0"
    assert build.find_models(cfg, 1) is None and build.find_models(cfg, 0, shipped=False) is None
    world = build.build_world(tmp_path / "w", quick=True, seed=0)
    info = build.read_world_info(world)
    assert info["models_shipped"] and info["models_from"] == str(SHIPPED / "seed0")
    assert "the base models that ship with PyroDash" in capsys.readouterr().out
    for m in ("slm", "llm"):
        assert (world / m / "model.safetensors").read_bytes() == (
            SHIPPED / "seed0" / m / "model.safetensors"
        ).read_bytes()
    assert info["accuracy"]["llm"]["mean"] >= 0.75 and build.world_warnings(info) == []
    calls = []
    monkeypatch.setattr(build, "run_build", lambda d, c, s, verbose=True, reuse_models=True: calls.append(reuse_models))
    assert build.build_world(tmp_path / "w", quick=True, seed=0) == world and calls == []  # built: reused
    build.build_world(tmp_path / "w", quick=True, seed=0, from_scratch=True)
    assert calls == [False]  # its models were copied: pretrained here this time


def test_a_copy_measured_on_this_platform_is_not_measured_again(tmp_path, monkeypatch, capsys):
    """A build that copies models whose world.json carries their measurements, made on this platform and thread count
    with the same splits, copies the measurements too and never evaluates (world.json `measurements_from`,
    `measured_on`, and the console say so); on another platform it measures the copy. This machine stands in for the
    shipped models' platform (monkeypatched `platform` and `build_threads`)."""
    from pyrodash.world import build
    from pyrodash.world.shipped import SHIPPED, measured_on

    monkeypatch.setenv("PYRODASH_CACHE", str(tmp_path / "cache"))
    shipped = build.read_world_info(SHIPPED / "seed0")
    there = measured_on(shipped)
    assert there is not None and there["threads"] == shipped["threads"]
    monkeypatch.setattr(build, "platform", lambda: {k: v for k, v in there.items() if k != "threads"})
    monkeypatch.setattr(build, "build_threads", lambda: there["threads"])
    calls = []

    def measure(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("measured")

    monkeypatch.setattr(build, "_measure", measure)
    info = build.read_world_info(build.build_world(tmp_path / "same", quick=True, seed=0))
    assert calls == []
    assert {k: info[k] for k in build.MEASUREMENTS} == {k: shipped[k] for k in build.MEASUREMENTS}
    assert info["measurements_from"] == str(SHIPPED / "seed0") and info["measured_on"] == there
    assert "evaluate" not in info["timings"]
    assert "measurements: copied with the models: measured on the same platform" in capsys.readouterr().out
    other = {k: v for k, v in there.items() if k != "threads"} | {"cpu_capability": "AVX2"}
    monkeypatch.setattr(build, "platform", lambda: other)
    with pytest.raises(RuntimeError, match="measured"):
        build.build_world(tmp_path / "other", quick=True, seed=0)
    assert len(calls) == 1
    out = capsys.readouterr().out
    assert "measuring the copied models here: they were measured on" in out and "AVX2" in out


def test_untrained_world_is_flagged(tiny_world, capsys):
    """The tiny world's models train 30 steps: `world build`/`world info` and the demo warn that it is unfit."""
    from pyrodash.cli import main
    from pyrodash.world.build import read_world_info, world_warnings

    warnings = world_warnings(read_world_info(tiny_world))
    assert any("LLM solves only" in w for w in warnings), warnings
    assert main(["world", "info", str(tiny_world)]) == 0
    assert "warning:" in capsys.readouterr().out


def test_pretraining_is_deterministic(tiny_world, tmp_path):
    """Training again with the same seed on the build's threads gives bitwise the models the build saved."""
    import torch
    from rich.progress import Progress

    from pyrodash.world.build import build_threads, train_models

    threads = torch.get_num_threads()
    torch.set_num_threads(build_threads())
    try:
        with Progress(disable=True) as progress:
            train_models(tmp_path, TINY, 3, progress)
    finally:
        torch.set_num_threads(threads)
    for which in ("slm", "llm"):
        assert (tmp_path / which / "model.safetensors").read_bytes() == (
            tiny_world / which / "model.safetensors"
        ).read_bytes()


def test_first_hard_frac_and_its_distribution():
    from pyrodash.data.example import Example
    from pyrodash.world.build import first_hard_distribution, first_hard_frac

    sol = "1+2=3\n\nf(3)=7\n\n7+1=8\n\n\\boxed{8}"
    meta = {"steps": ["1+2=3", "f(3)=7", "7+1=8"], "hard_steps": [1], "solution": sol}
    assert first_hard_frac(meta) == len("1+2=3\n\n") / len(sol)
    assert first_hard_frac({**meta, "hard_steps": []}) is None
    exs = [Example(str(i), "world:t", "q", "8", {**meta, "hard_steps": h}) for i, h in enumerate([[1], [2], []])]
    d = first_hard_distribution(exs)
    assert d["n"] == 2 and d["share_of_problems"] == round(2 / 3, 4) and sum(d["histogram_tenths"]) == 2
    assert d["min"] == round(first_hard_frac(meta), 4) < d["median"] < d["max"]


def test_a_failure_in_the_slm_process_reaches_the_build(tmp_path):
    """Pretraining runs the SLM in a second process beside the LLM (2+ cores): its error is the build's error, not a
    silent missing model. (Injected fault: an SLM shape the model config refuses.)"""
    from dataclasses import replace

    import torch
    from rich.progress import Progress

    from pyrodash.world.build import train_models

    bad = replace(TINY, slm=replace(TINY.slm, hidden_size=32, num_heads=3))
    threads = torch.get_num_threads()
    try:
        with Progress(disable=True) as progress, pytest.raises(ValueError, match="divisible by num_heads"):
            train_models(tmp_path, bad, 0, progress)
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / "slm").exists()


def test_training_resolves_the_world_the_cli_builds(tiny_world, tmp_path):
    """Training never builds a world: a recipe whose world is missing is a one-line error naming the `pyrodash world
    build` command; `pyrodash curate` / `pyrodash train` build it first (`world.build.build_named_world`)."""
    from pyrodash.train.config import Recipe
    from pyrodash.train.paths import llm_spec, resolve_world, slm_spec
    from pyrodash.world.build import build_named_world

    missing = Recipe(name="x", world={"dir": str(tmp_path / "none"), "quick": True, "seed": 2})
    with pytest.raises(ValueError, match="`pyrodash world build --quick --seed 2 --out .*none`") as e:
        slm_spec(missing)
    assert "\n" not in str(e.value) and not (tmp_path / "none").exists()
    built = Recipe(name="x", world={"dir": str(tiny_world)})
    assert resolve_world(built) == tiny_world and llm_spec(built) == str(tiny_world / "llm")
    assert build_named_world(built.world_dir(), built.world) == tiny_world  # a named, built world is used as it is
    assert build_named_world(Recipe(name="x", slm="a", llm="b").world_dir(), None) is None
