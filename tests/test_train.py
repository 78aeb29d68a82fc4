"""Training: recipes, Stage 1's invariant, the Stage 3 reward with real LLM handoffs, the pipeline on a quick world.

Fast tests build tiny random Qwen3 models over the world's character tokenizer (its chat template has the
`{% generation %}` markers the assistant-only loss needs) and world problems with their gold solutions; the slow
test runs curation and every stage on a `--quick` world.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model

from pyrodash.prompts import OFFLOAD_TOKEN
from pyrodash.train.config import ATTENTION_PROJECTIONS

# the layers the quick recipe's Stage 2 LoRA trains (configs/world/quick.yaml: attention and MLP); Stage 3's: attention
QUICK_STAGE2_LORA = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

ROOT = Path(__file__).resolve().parent.parent


def tiny_slm_dir(out: Path, tied: bool, seed: int = 0, hidden: int = 32) -> Path:
    """A random 2-layer Qwen3 with the world tokenizer, saved as an HF directory (no <offload> yet)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pyrodash.world.tokenizer import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        tie_word_embeddings=tied,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def world_examples(n: int, seed: int = 0):
    """World problems with their gold solutions; `hard` when a step needs an untaught lookup."""
    from pyrodash.world.task import make_known, make_split, make_table

    table, known = make_table(seed), make_known(0.65)
    return make_split(seed, "unit", n, [1, 2, 3], table, known)


def gold_corpora(n: int = 24):
    from pyrodash.prompts import get_prompts
    from pyrodash.train.config import CurateConfig
    from pyrodash.train.curate import build_corpora

    exs = world_examples(n)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    diff = {ex.id: "hard" if ex.meta["hard_steps"] else "easy" for ex in exs}
    return build_corpora(exs, sols, diff, get_prompts("world-v1"), CurateConfig(placement="before_hard"))


def stage1_cfg(tmp: Path, **kw):
    from pyrodash.train.config import Stage1Config

    base = dict(
        output_dir=str(tmp / "trainer"),
        learning_rate=5e-2,
        weight_decay=0.0,
        num_train_epochs=1,
        per_device_train_batch_size=8,
        lora_r=4,
        lora_alpha=8,
        assistant_only_loss=True,
        max_length=256,
        save_strategy="no",
        report_to="none",
        gradient_checkpointing=False,
        bf16=False,
        logging_steps=1,
        seed=0,
    )
    return Stage1Config(**{**base, **kw})


# --- recipes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "configs" / "world").glob("*.yaml")) + sorted((ROOT / "configs" / "paper").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_recipes_load_and_validate(path):
    from pyrodash.train.config import Stage2Config, Stage3Config, load_recipe

    r = load_recipe(path)
    s2 = r.stage_config("stage2", output_dir="/tmp/x", validate_only=True)
    s3 = r.stage_config("stage3", output_dir="/tmp/x", validate_only=True)
    assert isinstance(s2, Stage2Config) and isinstance(s3, Stage3Config)
    assert s2.assistant_only_loss and s3.num_generations == 8
    if path.parent.name == "paper":
        assert (s2.lora_r, s2.lora_alpha, s2.learning_rate, s2.num_train_epochs) == (8, 16, 1e-5, 4)
        assert (s3.lora_r, s3.lora_alpha, s3.learning_rate, s3.num_train_epochs) == (16, 32, 5e-6, 1)
        assert s3.use_vllm and str(r.llm.get("url", "")).startswith("http")


def test_recipe_yaml_reads_exponent_floats(tmp_path):
    from pyrodash.train.config import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text("name: x\nworld: {quick: true}\nstage2: {learning_rate: 1e-5, bf16: false}\n")
    assert load_recipe(p).stage_config("stage2", output_dir=str(tmp_path)).learning_rate == 1e-5
    assert load_recipe(p, {"stage3.lam": 0.6}).stage_config("stage3", output_dir=str(tmp_path)).lam == 0.6


def test_recipe_gradient_checkpointing_goes_in_under_the_installed_name(tmp_path):
    """`gradient_checkpointing` (every transformers knows it) is passed as `activation_checkpointing` where that
    exists, so building a stage's config raises no deprecation warning, and its value holds."""
    import warnings
    from dataclasses import fields

    from transformers import TrainingArguments

    from pyrodash.train.config import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text("name: x\nworld: {quick: true}\nstage2: {gradient_checkpointing: true, bf16: false}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_recipe(p).stage_config("stage2", output_dir=str(tmp_path))
    assert cfg.gradient_checkpointing is True
    if "activation_checkpointing" in {f.name for f in fields(TrainingArguments)}:
        assert cfg.activation_checkpointing is True
        assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]


def test_recipe_errors_name_the_fix(tmp_path):
    from pyrodash.train.config import load_recipe

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworld: {quick: true}\nstage2: {learnin_rate: 0.1}\n")
    with pytest.raises(ValueError, match="learnin_rate"):
        load_recipe(bad)
    bad.write_text("name: x\nworld: {quick: true}\nstage3: {cost_penalty: cheap}\n")
    with pytest.raises(ValueError, match="normalized"):
        load_recipe(bad)
    # under several processes each one's generation batch must hold whole groups for explore_no_handoff (TRL checks
    # only the batch of all processes together, which one process here cannot miss)
    s3 = load_recipe(ROOT / "configs" / "world" / "quick.yaml").stage_config("stage3", output_dir=str(tmp_path))
    s3.validate()
    s3.per_device_train_batch_size, s3.steps_per_generation = 4, 1
    with pytest.raises(ValueError, match="multiple of num_generations"):
        s3.validate()
    bad.write_text("name: x\nslm: a\n")
    with pytest.raises(ValueError, match="llm"):
        load_recipe(bad)


def test_dry_run_loads_nothing(tmp_path, capsys):
    from pyrodash.cli import main

    paper = sorted((ROOT / "configs" / "paper").glob("*.yaml"))[0]
    for argv in (["curate"], ["train", "stage1"], ["train", "stage3", "--lambdas", "0.05,0.6"]):
        assert main([*argv, "--config", str(paper), "--output-dir", str(tmp_path / "run"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "config OK" in out
    assert "stage3-lambda0.6" in out and "Qwen/Qwen3.5-4B" in out and "lam = 0.6" in out
    assert not (tmp_path / "run").exists()
    assert main(["train", "stage2", "--lambda", "0.1", "--config", str(paper), "--output-dir", "x"]) == 2
    assert "stage3 only" in capsys.readouterr().err


# --- Stage 1 -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_stage1_changes_only_the_offload_rows(tmp_path, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pyrodash.tokens import add_offload_token
    from pyrodash.train.stage1 import changed_params, offload_rows, train_stage1

    base = tiny_slm_dir(tmp_path / "base", tied=tied)
    _, rows_b, _ = gold_corpora(24)
    assert any("<offload>" in r["completion"][-1]["content"] for r in rows_b)
    out, stats = train_stage1(base, rows_b, stage1_cfg(tmp_path), tmp_path / "stage1", tmp_path / "log.jsonl")

    base_model = AutoModelForCausalLM.from_pretrained(base)
    base_sd = {k: v.clone() for k, v in base_model.state_dict().items()}
    new = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    tid = tok.convert_tokens_to_ids("<offload>")
    assert tid == stats["offload_token_id"] == base_model.config.vocab_size  # a new row
    assert changed_params(base_sd, new, tid) == []  # every other parameter is bit-identical
    assert not any("lora" in k for k in new.state_dict())  # the transient adapters are gone
    assert stats["other_rows_max_change_in_training"] == 0.0  # the gradient mask held during training too
    # ... and the <offload> rows did train away from their eq:offload-embed-init values
    init_tok = AutoTokenizer.from_pretrained(base)
    add_offload_token(base_model, init_tok, sigma=0.1, seed=0)
    init, trained = offload_rows(base_model, tid), offload_rows(new, tid)
    assert set(trained) == ({"input"} if tied else {"input", "output"})
    for k in trained:
        assert not torch.equal(init[k], trained[k]), k
    # the check itself catches a change elsewhere
    with torch.no_grad():
        new.model.layers[0].self_attn.q_proj.weight[0, 0] += 1e-3
        new.get_input_embeddings().weight[5, 0] += 1e-3
    bad = set(changed_params(base_sd, new, tid))
    assert {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"} <= bad
    assert bad <= {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"}


def test_stage1_does_not_depend_on_the_rng_state_before_it(tmp_path):
    """Stage 1 seeds the transient adapters' init itself: the same rows after any earlier use of the global RNG."""
    from safetensors.torch import load_file

    from pyrodash.train.stage1 import train_stage1

    base = tiny_slm_dir(tmp_path / "base", tied=False)
    _, rows_b, _ = gold_corpora(24)
    outs = []
    for k in (1, 2):
        torch.manual_seed(k)  # e.g. a world built earlier in the same process
        out, _ = train_stage1(base, rows_b, stage1_cfg(tmp_path), tmp_path / f"s{k}", tmp_path / f"log{k}.jsonl")
        outs.append(load_file(str(out / "model.safetensors")))
    assert outs[0].keys() == outs[1].keys()
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def test_stage1_refuses_weight_decay(tmp_path):
    from pyrodash.train.stage1 import train_stage1

    base = tiny_slm_dir(tmp_path / "base", tied=False)
    with pytest.raises(ValueError, match="weight_decay"):
        train_stage1(base, [], stage1_cfg(tmp_path, weight_decay=0.01), tmp_path / "s1", tmp_path / "l.jsonl")


# --- Stage 3 reward --------------------------------------------------------------------------------------------


def test_reward_hands_off_to_the_llm_and_prices_each_rollout(tmp_path):
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.cost import Prices, grpo_cost_actual, grpo_cost_base
    from pyrodash.engine import handoff_request as engine_handoff
    from pyrodash.prompts import get_prompts, pack
    from pyrodash.train.models import FrozenLLM
    from pyrodash.train.reward import BaselineCache, CollaborativeReward
    from pyrodash.train.stage3 import collaboration_engine

    prompts, prices = get_prompts("world-v1"), Prices.from_yaml("paper")
    llm_dir = tiny_slm_dir(tmp_path / "llm", tied=False, seed=1)
    llm = FrozenLLM.from_spec(str(llm_dir), batch_size=8)
    cache = BaselineCache(tmp_path / "cost_base.json", "tiny", prompts, prices, max_tokens=12)
    qs, golds = ["Start 1: +2.", "Start 5: +1, f."], ["3", "7"]
    assert cache.fill(llm, qs, golds) == 2 and cache.fill(llm, qs, golds) == 0  # cached on disk, not recomputed
    assert (
        BaselineCache(tmp_path / "cost_base.json", "tiny", prompts, prices, 12).cost_base(qs[0])
        == cache.cost_base(qs[0])
        > 0
    )
    tok = llm.backend.tokenizer
    slm, slm_tok = tiny_model(seed=2)  # the policy being trained: its <offload> id ends a rollout
    engine = collaboration_engine(HFBackend(slm, slm_tok), llm, prompts, prices, 12, 12)
    off = engine.offload_id
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    completions = ["1+2=3\n\n\\boxed{3}", "5+1=6\n\n", "5+1=6\n\nf(6)=9\n\n\\boxed{9}"]
    ids = [enc(completions[0]) + [tok.eos_token_id], enc(completions[1]) + [off], enc(completions[2])]
    question, gold = [qs[0], qs[1], qs[1]], ["3", "7", "7"]
    for lam, penalty in ((0.3, "normalized"), (0.3, "direct")):
        reward = CollaborativeReward(engine, cache, lam=lam, cost_penalty=penalty)
        sent, batch = [], llm.backend.generate_batch
        llm.backend.generate_batch = lambda reqs, _s=sent, _b=batch, **kw: _s.extend(reqs) or _b(reqs, **kw)
        r = reward(
            prompts=None,
            completions=[[{"role": "assistant", "content": c}] for c in completions],
            completion_ids=ids,
            question=question,
            gold=gold,
        )
        del llm.backend.generate_batch
        assert len(sent) == 1  # exactly one LLM call (counted at the backend): the rollout that ended in <offload>
        d = reward.last
        assert [x["offload"] for x in d] == [False, True, False] and [x["r_acc"] for x in d] == [1.0, 0.0, 0.0]
        # the handoff is the engine's request, answered by the real LLM; its text joins the SLM's
        want = HFBackend(llm.backend.model, tok).generate(
            engine_handoff(prompts, "continue", prompts.plain_messages(qs[1]), pack(completions[1]), 12)
        )
        assert d[1]["joint"] == completions[1] + want.text and d[1]["t_llm_dec"] == want.completion_tokens > 0
        assert d[1]["t_slm"] == len(ids[1]) - 1 and d[0]["t_slm"] == len(ids[0])
        cost1 = grpo_cost_actual(d[1]["t_slm"], want.completion_tokens, prices, handoff=True)
        cost0 = grpo_cost_actual(len(ids[0]), 0, prices, handoff=False)
        assert d[1]["cost_act"] == pytest.approx(cost1) and d[0]["cost_act"] == pytest.approx(cost0)
        if penalty == "normalized":
            base = cache.cost_base(qs[1])
            assert d[1]["r_eff"] == pytest.approx(cost1 / base)
            e = cache.entries[cache.key(qs[1])]
            assert base == pytest.approx(grpo_cost_base(e["t_in"], e["t_llm_dec"], prices))
        else:
            assert d[1]["r_eff"] == pytest.approx(cost1)
        assert r == pytest.approx([x["r_acc"] - lam * x["r_eff"] for x in d])
        stats = reward.pop_stats()
        assert stats["pyrodash/offload_rate"] == pytest.approx(1 / 3) and stats["pyrodash/llm_calls"] == 1
        assert stats["pyrodash/handoff_position"] == d[1]["t_slm"] and reward.pop_stats() == {}
    with pytest.raises(ValueError, match="normalized"):
        CollaborativeReward(engine, cache, lam=0.1, cost_penalty="dollars")


# --- the whole pipeline on a quick world (run once, checked by the tests below) ---------------------------------


def _changed(before: dict, after: dict) -> tuple[set, set]:
    """(names that changed, names that did not) between two state dicts of the same shapes."""
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    return changed, set(before) - changed


# Stage 3 in `quick_run`: the quick recipe's 40 steps cut to these (the tests check its mechanics; the demo runs the
# whole recipe): 4 for λ 0.1, the λ 0.6 sweep and its --resume; 16, as before, for the masked λ 0.6 run (its check
# needs the steps over which an unmasked run's KL grows: docs/training.md, "Stage 3's KL and off-policy masking")
QUICK_STAGE3_STEPS = 4
MASKED_STAGE3_STEPS = 16


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, quick_demo):
    """Curation and Stages 1-2 of the quick recipe (the session's quick demo made them: tests/conftest.py), then
    Stage 3 at λ 0.1 in process, a CLI sweep over λ 0.6 and a --resume of it (`QUICK_STAGE3_STEPS` each), and λ 0.6
    with off-policy masking (`MASKED_STAGE3_STEPS`)."""
    import shutil

    import yaml

    from pyrodash.cli import main
    from pyrodash.train.config import load_recipe, load_yaml
    from pyrodash.train.stage3 import run_stage3
    from pyrodash.world.build import build_world

    world = build_world(quick=True, seed=0, verbose=False)
    out = tmp_path_factory.mktemp("quick") / "run"
    for part in ("curated", "stage1", "stage2"):
        shutil.copytree(quick_demo / part, out / part)
    data = load_yaml((ROOT / "configs" / "world" / "quick.yaml").read_text())
    data["world"] = {"dir": str(world)}
    data["stage3"].update(max_steps=QUICK_STAGE3_STEPS, save_steps=QUICK_STAGE3_STEPS // 2)
    path = out.parent / "quick-short.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    run = {
        "world": world,
        "out": out,
        "curated": out / "curated",
        "stage1": out / "stage1",
        "stage2": out / "stage2",
        "stage3": run_stage3(recipe, out, lam=0.1),
    }
    # the CLI: a sweep over a second λ (reuses the cached Cost_base), then --resume from its last checkpoint
    cli = ["--config", str(path), "--output-dir", str(out)]
    run["sweep_rc"] = main(["train", "stage3", "--lambdas", "0.6", *cli])
    run["sweep"] = json.loads((out / "stage3-sweep.json").read_text())
    run["resume_rc"] = main(["train", "stage3", "--lambda", "0.6", "--resume", *cli])
    run["resumed"] = json.loads((out / "stage3-lambda0.6" / "stage3_stats.json").read_text())
    # λ 0.6 again with TRL's off-policy sequence masking fed the banned rollouts' sampling log-probabilities
    masked = out.parent / "masked"
    for part in ("curated", "stage2"):
        shutil.copytree(out / part, masked / part)
    data["stage3"].update(off_policy_mask_threshold=0.001, max_steps=MASKED_STAGE3_STEPS, save_steps=8)
    path.with_name("quick-short-masked.yaml").write_text(yaml.safe_dump(data))
    masked_recipe = load_recipe(path.with_name("quick-short-masked.yaml"))
    run["masked"] = run_stage3(masked_recipe, masked, lam=0.6, heldout=False)  # (its KL is read, not its dev figures)
    return run


@pytest.mark.slow
def test_quick_curation(quick_run):
    stats = json.loads((quick_run["curated"] / "stats.json").read_text())
    assert stats["easy"] > 0 and stats["hard_kept"] > 0 and stats["corpus_b_hard"] > 0, stats
    # the world recipe cuts hard targets at their first <offload> (curate.hard_target), so Corpus A is the easy rows
    assert stats["corpus_a"] == stats["easy"] and stats["llm_calls"] == stats["hard"]
    b = [json.loads(x) for x in (quick_run["curated"] / "corpus_b.jsonl").read_text().splitlines()]
    # the quick recipe trains the relay (curate.relay): a hard row is the whole solution, <offload> before each of the
    # LLM's steps (its `llm_spans`, masked in Stage 2), not a target cut at the first <offload>
    hard = [r for r in b if r["difficulty"] == "hard"]
    assert hard and all(OFFLOAD_TOKEN in r["completion"][-1]["content"] and r.get("llm_spans") for r in hard)
    # conversation turns (curate.conversations) went through the same path: every turn after its gold history
    conv = stats["conversations"]
    assert conv["turns"] == 3 * conv["conversations"] > 0 and set(conv["rows_by_turn"]) == {"1", "2", "3"}
    turn3 = [r for r in b if r["turn"] == 3]
    assert turn3 and all(len(r["prompt"]) == 6 for r in turn3)  # P_s, 2 earlier turns, the question
    assert (quick_run["curated"] / "dataset" / "corpus_b").is_dir()


@pytest.mark.slow
def test_quick_stage1_changed_only_the_offload_rows(quick_run):
    from transformers import AutoModelForCausalLM

    from pyrodash.train.stage1 import changed_params

    base = AutoModelForCausalLM.from_pretrained(quick_run["world"] / "slm")
    m1 = AutoModelForCausalLM.from_pretrained(quick_run["stage1"])
    st = json.loads((quick_run["stage1"] / "stage1_stats.json").read_text())
    assert changed_params(base.state_dict(), m1, st["offload_token_id"]) == [] and st["rows"]["input"]["moved"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage2", "stage3"])
def test_quick_stages_2_and_3_train_only_their_lora_targets(quick_run, stage):
    """The quick recipe's LoRA targets, merged: Stage 2 every linear layer (attention and MLP), Stage 3 attention; the
    embeddings, norms and head never move."""
    from transformers import AutoModelForCausalLM

    prev = AutoModelForCausalLM.from_pretrained(quick_run["stage1" if stage == "stage2" else "stage2"])
    new = AutoModelForCausalLM.from_pretrained(quick_run[stage])
    changed, same = _changed(prev.state_dict(), new.state_dict())
    targets = QUICK_STAGE2_LORA if stage == "stage2" else set(ATTENTION_PROJECTIONS)
    assert changed and {k.split(".")[-2] for k in changed} == targets
    assert "model.embed_tokens.weight" in same  # embeddings frozen (merged LoRA touches only its targets)


@pytest.mark.slow
def test_explore_no_handoff_bans_offload_in_the_last_rollouts_of_each_group():
    from pyrodash.train.rollouts import ExploreBranches

    proc = ExploreBranches(token_id=3, group=8, k=2)
    scores = torch.zeros(16, 5)
    out = proc(None, scores.clone())
    banned = [i for i in range(16) if out[i, 3] == float("-inf")]
    assert banned == [6, 7, 14, 15] and proc.banned_rows(16) == banned
    assert torch.equal(out[:, [0, 1, 2, 4]], scores[:, [0, 1, 2, 4]])  # nothing else moves
    assert ExploreBranches(3, 8, 0).banned_rows(16) == []


def test_explore_handoff_pushes_offload_in_the_first_rollouts_of_each_group():
    """`stage3.explore_handoff`: the first rows of each group get `explore_handoff_bias` on `<offload>` (the decode
    loop's per-request logit bias and the logits processor agree); a recipe that leaves no rollout to the policy is
    refused."""
    from pyrodash.train.config import Stage3Config
    from pyrodash.train.rollouts import ExploreBranches

    proc = ExploreBranches(token_id=3, group=4, k=1, push=2, push_bias=3.0)
    out = proc(None, torch.zeros(8, 5))
    assert out[:, 3].tolist() == [3.0, 3.0, 0.0, float("-inf"), 3.0, 3.0, 0.0, float("-inf")]
    assert [proc.logit_bias(i).get(3, 0.0) for i in range(8)] == out[:, 3].tolist()
    assert (out[:, [0, 1, 2, 4]] == 0).all()
    with pytest.raises(ValueError, match="explore_handoff"):
        Stage3Config(
            output_dir="x", use_cpu=True, bf16=False, num_generations=8, explore_no_handoff=2, explore_handoff=6
        ).validate()


def test_quick_stage3_reward_used_real_llm_handoffs(quick_run):
    from pyrodash.train.common import read_log

    st3 = json.loads((quick_run["stage3"] / "stage3_stats.json").read_text())
    assert st3["llm_handoff_calls"] > 0 and st3["cost_base_computed"] == st3["prompts"], st3
    log = [r for r in read_log(quick_run["stage3"] / "log.jsonl") if "reward" in r]
    assert len(log) == st3["steps"] and sum(r["pyrodash/llm_calls"] for r in log) == st3["llm_handoff_calls"]
    assert all({"pyrodash/accuracy", "pyrodash/offload_rate", "pyrodash/r_eff"} <= set(r) for r in log)
    # the world recipe bans <offload> in 2 of every 8 rollouts (stage3.explore_no_handoff): no step offloads more
    k, g = 2, 8
    assert max(r["pyrodash/offload_rate"] for r in log) <= (g - k) / g, [r["pyrodash/offload_rate"] for r in log]
    assert 0 <= st3["heldout"]["llm_calls_per_example"] <= 1
    # the sweep reused the cached Cost_base; --resume picked up the last checkpoint
    assert quick_run["sweep_rc"] == 0 and quick_run["resume_rc"] == 0
    assert "py.warnings" in (quick_run["out"] / "train.log").read_text()  # library warnings there, not on the console
    st3b = quick_run["sweep"]["runs"]["0.6"]
    assert st3b["cost_base_computed"] == 0 and st3b["cost_base_cached"] == st3["prompts"]
    assert quick_run["resumed"]["resumed_from"].endswith(f"checkpoint-{st3b['steps']}")


@pytest.mark.slow
def test_quick_stage3_off_policy_masking_keeps_the_kl_to_stage2_small(quick_run):
    """At λ 0.6 the policy hands off eagerly, so a banned rollout's token where it wanted `<offload>` is one it
    would almost never draw; scored below its group, GRPO pushed it further down and the KL to Stage 2 grew to
    hundreds (docs/training.md, "Stage 3's KL"). With `off_policy_mask_threshold` the trainer gets each banned
    token's sampling log-probability and TRL leaves such rollouts out: the KL stays small on every step."""
    from pyrodash.train.common import read_log

    kl = [r["kl"] for r in read_log(quick_run["masked"] / "log.jsonl") if "kl" in r]
    assert len(kl) == MASKED_STAGE3_STEPS and max(kl) < 0.1, kl
    plain = [r["kl"] for r in read_log(quick_run["out"] / "stage3-lambda0.6" / "log.jsonl") if "kl" in r]
    print(f"max KL to Stage 2 at λ 0.6: {max(plain):.3g} unmasked ({QUICK_STAGE3_STEPS} steps), {max(kl):.3g} masked")


@pytest.mark.slow
def test_quick_stage2_offloads_on_hard_not_easy(quick_run):
    rates = json.loads((quick_run["stage2"] / "offload_rates.json").read_text())
    assert rates["hard_with_ps"] > rates["easy_with_ps"], rates  # offloads where the SLM fails
    assert rates["all_without_ps"] < rates["hard_with_ps"], rates  # ... and only when P_s enables it


# --- several processes: `accelerate launch` (gloo on this CPU machine) ---------------------------------------------


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3"])
def test_accelerate_configs_parse_as_accelerate_reads_them(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    assert cfg.num_processes > 1 and not cfg.use_cpu and cfg.mixed_precision == "bf16"
    if name == "ddp":
        assert cfg.distributed_type == DistributedType.MULTI_GPU
    else:
        assert cfg.distributed_type == DistributedType.DEEPSPEED
        assert cfg.deepspeed_config["zero_stage"] == int(name[-1])


def test_a_cpu_launch_that_started_one_of_n_processes_is_refused(monkeypatch):
    """`accelerate launch --cpu --num_processes 2` without MPI starts ONE process (with MASTER_ADDR set and no
    RANK): training alone while the user asked for two would be silent, so setup() stops and names the fix."""
    from pyrodash.train import distributed

    for key in ("WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ValueError, match="--multi_gpu"):
        distributed.setup()
    monkeypatch.delenv("MASTER_ADDR")
    assert distributed.setup().num_processes == 1 and distributed.is_main() and distributed.world_size() == 1
    assert distributed.gather_objects({"a": 1}) == [{"a": 1}]


def _accelerate_launch(nproc: int, argv: list[str], cwd: Path):
    """`accelerate launch --num_processes N -m pyrodash ARGV` on this CPU machine. N > 1 goes through `--multi_gpu`
    (torchrun starts the N processes; accelerate's `--cpu` form starts one unless MPI is set up) and the ranks join
    one gloo group because there is no GPU; N = 1 is the plain `--cpu` launch."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(nproc),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        "--multi_gpu" if nproc > 1 else "--cpu",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
    }  # tiny models: one thread per process (accelerate's --cpu would pick 2 here)
    proc = subprocess.run(
        [*launch, "-m", "pyrodash", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_quick_stages_2_and_3_under_accelerate_launch(quick_run, tmp_path, nproc):
    """Stage 2 and Stage 3 of the quick world, 2 steps each, launched with `accelerate launch --num_processes N`:
    the checkpoints load; logs, checkpoints and held-out files come from one process; Cost_base is computed by the
    main process only; every rank's rollouts hand off to the LLM and the stats and logs count all of them."""
    import shutil

    import yaml
    from transformers import AutoModelForCausalLM

    from pyrodash.train.common import read_log
    from pyrodash.train.config import load_yaml

    recipe = load_yaml((ROOT / "configs" / "world" / "quick.yaml").read_text())
    recipe["world"] = {"dir": str(quick_run["world"])}
    recipe["stage2"].update(max_steps=2, logging_steps=1, measure_limit=8)
    recipe["stage3"].update(max_steps=2, logging_steps=1, save_steps=2, save_strategy="steps", train_limit=8)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run, cur = tmp_path / "run", tmp_path / "run" / "curated"
    cur.mkdir(parents=True)
    for name in ("corpus_a.jsonl", "corpus_b.jsonl"):
        shutil.copy(quick_run["curated"] / name, cur / name)
    held = (quick_run["curated"] / "heldout.jsonl").read_text().splitlines()[:8]
    (cur / "heldout.jsonl").write_text("\n".join(held) + "\n")
    cli = ["--config", str(tmp_path / "recipe.yaml"), "--output-dir", str(run)]

    _accelerate_launch(nproc, ["train", "stage2", *cli, "--from", str(quick_run["stage1"])], tmp_path)
    prev = AutoModelForCausalLM.from_pretrained(quick_run["stage1"])
    changed, same = _changed(prev.state_dict(), AutoModelForCausalLM.from_pretrained(run / "stage2").state_dict())
    assert changed and {k.split(".")[-2] for k in changed} == QUICK_STAGE2_LORA
    steps2 = [r for r in read_log(run / "stage2" / "log.jsonl") if "loss" in r]
    assert [r["step"] for r in steps2] == [1, 2]  # one log line per step: the main process writes the log
    assert json.loads((run / "stage2" / "offload_rates.json").read_text())["n"] == 8

    out = _accelerate_launch(nproc, ["train", "stage3", *cli, "--from", str(quick_run["stage2"])], tmp_path).stdout
    assert out.count("saved ") == 1  # the main process reports
    dest = run / "stage3-lambda0.1"
    st = json.loads((dest / "stage3_stats.json").read_text())
    per_step = recipe["stage3"]["per_device_train_batch_size"]
    assert st["processes"] == nproc and st["steps"] == 2 and st["rollouts_by_rank"] == [2 * per_step] * nproc
    assert all(n > 0 for n in st["llm_handoff_calls_by_rank"]), st  # every rank's rollouts called the LLM
    assert sum(st["llm_handoff_calls_by_rank"]) == st["llm_handoff_calls"]
    assert st["cost_base_computed_by_rank"] == [st["prompts"]] + [0] * (nproc - 1)  # Cost_base: one rank's calls
    log = [r for r in read_log(dest / "log.jsonl") if "pyrodash/llm_calls" in r]
    assert [r["step"] for r in log] == [1, 2] and sum(r["pyrodash/llm_calls"] for r in log) == st["llm_handoff_calls"]
    for r in log:  # each log line averages the rollouts of every rank
        if r["pyrodash/llm_calls"]:
            assert round(r["pyrodash/llm_calls"] / r["pyrodash/llm_calls_per_rollout"]) == per_step * nproc
    assert [p.name for p in (dest / "trainer").glob("checkpoint-*")] == ["checkpoint-2"]
    assert AutoModelForCausalLM.from_pretrained(dest).config.vocab_size == prev.config.vocab_size
    assert st["heldout"]["n"] == 8
