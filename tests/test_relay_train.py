"""Training that learns to relay (`curate.relay`, pyrodash.train.relay_rows): relay curation rows and their LLM spans,
and Stage 2's loss mask, 0 exactly on the LLM's steps, as TRL's SFTTrainer builds its labels from it. World problems
with their gold solutions and tiny models over the world's character tokenizer (tests/tiny_models.py)."""

from __future__ import annotations

import json

import pytest
from test_train import world_examples
from tiny_models import tiny_model

from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.train.config import CurateConfig
from pyrodash.train.curate import build_corpora

PROMPTS = get_prompts("world-v1")


def relay_corpora(n: int = 40, **kw):
    exs = world_examples(n)
    sols = {ex.id: ex.meta["solution"] for ex in exs}
    diff = {ex.id: "hard" if ex.meta["hard_steps"] else "easy" for ex in exs}
    cfg = CurateConfig(placement="at_hard", hard_target="to_first_offload", relay=True, seed=3, **kw)
    return exs, build_corpora(exs, sols, diff, PROMPTS, cfg)


def test_relay_rows_hand_off_every_untaught_step_and_mark_the_llms_spans():
    exs, (a, b, inserted) = relay_corpora(offload_max=1)  # relay hands off every untaught step, whatever the cap
    by_id = {ex.id: ex for ex in exs}
    hard = [r for r in b if r["difficulty"] == "hard"]
    assert hard and {r["difficulty"] for r in a} == {"easy"}  # the LLM's steps never reach Corpus A, unmasked
    assert any(r["n_offload"] > 1 for r in hard)
    assert inserted == {n: sum(r["n_offload"] == n for r in hard) for n in {r["n_offload"] for r in hard}}
    for r in b:
        text = r["completion"][-1]["content"]
        if r["difficulty"] == "easy":
            assert r["llm_spans"] == [] and OFFLOAD_TOKEN not in text
            continue
        ex = by_id[r["id"]]
        steps = ex.meta["steps"]
        want = [steps[h] for h in ex.meta["hard_steps"]]
        # each span: an untaught step and its separator, right after an <offload>, in order
        spans = [text[s:e] for s, e in r["llm_spans"]]
        assert [s.removesuffix("\n\n") for s in spans] == want and r["n_offload"] == len(want)
        assert all(text[:s].endswith(OFFLOAD_TOKEN) for s, _ in r["llm_spans"])
        assert text.count(OFFLOAD_TOKEN) == len(want)
        # without the <offload> tokens the row is the whole solution (the LLM's reconstruction; here the gold)
        assert text.replace(OFFLOAD_TOKEN, "") == ex.meta["solution"]
        # outside the spans: the SLM's text, no untaught step in it
        bounds = [0] + [x for span in r["llm_spans"] for x in span] + [len(text)]
        slm = "".join(text[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2))
        assert not any(w in slm for w in want)


def test_relay_needs_hard_examples_out_of_corpus_a():
    with pytest.raises(ValueError, match="to_first_offload"):
        CurateConfig(placement="at_hard", relay=True).validate()


def sft_cfg(tmp_path, **kw):
    from pyrodash.train.config import Stage2Config

    steps = dict(per_device_train_batch_size=4, max_steps=1, assistant_only_loss=True, max_length=2048, bf16=False)
    run = dict(output_dir=str(tmp_path / "trainer"), report_to="none", save_strategy="no", lora_r=2, lora_alpha=4)
    return Stage2Config(**{**steps, **run, **kw})


@pytest.mark.parametrize("loss", ["assistant_only", "completion_only"])
def test_stage2_loss_mask_is_zero_exactly_on_the_llm_spans(tmp_path, loss):
    from pyrodash.train.chat_template import loss_mask_config
    from pyrodash.train.common import messages_dataset
    from pyrodash.train.length_chunks import LengthChunkedSFTTrainer
    from pyrodash.train.relay_rows import relay_dataset

    model, tok = tiny_model(seed=1)
    if loss == "completion_only":  # a template without generation markers: completion-only loss
        tok.chat_template = tok.chat_template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    _, (a, b, _) = relay_corpora(12)
    rows = a[:2] + b
    cfg = loss_mask_config(sft_cfg(tmp_path), rows, tok)
    dataset, relay_cfg = relay_dataset(rows, tok, cfg)
    trainer = LengthChunkedSFTTrainer(
        model=model, args=relay_cfg, train_dataset=dataset, processing_class=tok, peft_config=relay_cfg.lora_config()
    )
    # the rows without spans get exactly the labels TRL gives the same rows as chats
    plain = [r for r in rows if not r.get("llm_spans")]
    ref = LengthChunkedSFTTrainer(
        model=tiny_model(seed=1)[0], args=cfg, train_dataset=messages_dataset(plain), processing_class=tok
    )
    got = {tuple(x["input_ids"]): x["labels"] for x in trainer.train_dataset}
    for x in ref.train_dataset:
        assert got[tuple(x["input_ids"])] == x["labels"]
    checked = 0
    assert len(got) == len(rows)
    for r, x in zip(rows, dataset):
        ids = x["input_ids"]
        labels = got[tuple(ids)]  # TRL's labels of this row (its dataset preparation may reorder rows)
        if not r.get("llm_spans"):
            continue
        prompt = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, return_dict=True)
        prompt_len = len(prompt["input_ids"])
        content = r["completion"][-1]["content"]
        # the content's tokens: the world tokenizer is a character one, <offload> one token
        content_ids = tok(content, add_special_tokens=False)["input_ids"]
        assert ids[prompt_len : prompt_len + len(content_ids)] == content_ids
        pos, in_span = 0, []
        for t in content_ids:
            piece = tok.decode([t])
            in_span.append(any(s <= pos < e for s, e in r["llm_spans"]))
            pos += len(piece)
        trained = [lab != -100 for lab in labels[prompt_len : prompt_len + len(content_ids)]]
        assert trained == [not s for s in in_span]  # every SLM token (each <offload> too) trained, no LLM one
        assert all(lab == -100 for lab in labels[:prompt_len])  # never the prompt
        assert labels[prompt_len + len(content_ids)] == tok.convert_tokens_to_ids("<|im_end|>")  # its end of turn
        checked += 1
    assert checked >= 3
    trainer.train()  # and it trains on them


# --- Stage 3: relay rollouts ---------------------------------------------------------------------------------------


class CharTok:
    """Characters as token ids (the scripted models of tests/test_relay.py count characters); `<offload>` is id 5."""

    eos_token_id = 2

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) if i >= 10 else "" if skip_special_tokens else f"<{i}>" for i in ids)


class FakeTrainer:
    """What `RelayRollouts` reads of `CostAwareGRPOTrainer`: its prompt tokenizer, the policy backend and its first
    segments (here scripted: one rollout hands off after "a=1", one answers alone)."""

    def __init__(self, slm, first: list[list[int]], first_lps: list[list[float]] | None = None):
        from types import SimpleNamespace

        self.slm, self.first, self.first_lps = slm, first, first_lps
        self.processing_class, self.temperature, self.top_p = CharTok(), 0.3, 1.0
        self.collab = SimpleNamespace(batch_size=4, concurrency=2)

    def _tokenize_prompts(self, prompts):
        return [[7, 7, 7] for _ in prompts], None, {}

    def rollout_backend(self):
        import contextlib

        return contextlib.nullcontext(self.slm)

    def sample_first_segments(self, backend, prompt_ids):
        return self.first

    def first_segment_logprobs(self, backend, prompt_ids, ids):
        return self.first_lps  # None: off-policy masking off (the recipes)


def test_a_relay_rollout_masks_exactly_the_llms_tokens_and_its_reward_sums_every_call(tmp_path):
    from test_relay import GOLD, OFFLOAD_ID, PAPER, PROMPTS, ScriptLLM, ScriptSLM

    from pyrodash.engine import CollaborateEngine
    from pyrodash.train.relay_rollouts import RelayRollouts
    from pyrodash.train.reward import BaselineCache, CollaborativeReward

    tok, o = CharTok(), OFFLOAD_TOKEN
    slm, llm = ScriptSLM(), ScriptLLM()

    def engine(slm_backend, relay):
        return CollaborateEngine(slm_backend, llm, PROMPTS, PAPER, max_tokens=200, relay=relay)

    first = [tok("a=1\n\n")["input_ids"] + [OFFLOAD_ID], tok(GOLD)["input_ids"] + [tok.eos_token_id]]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    rollouts = RelayRollouts(engine, {json.dumps(prompts[0]): "q"}, max_llm_calls=4, step_max_tokens=64)
    out = rollouts(prompts, FakeTrainer(slm, first))
    ids, mask = out["completion_ids"], out["env_mask"]
    assert out["prompt_ids"] == [[7, 7, 7]] * 2 and out["logprobs"] is None
    # the relay rollout is the SLM's own context at its last resume, then what it wrote and its end of turn
    last = slm.requests[-1]
    assert last.prefix == f"a=1\n\n{o}H(a)=7\n\nb=7+1\n\n{o}H(b)=99\n\n" and last.temperature == 0.3
    assert tok.decode(ids[0]).replace("<5>", o) == last.prefix + "c=99-1\n\n\\boxed{98}<2>"
    # env_mask: 0 on the LLM's steps (with their separators) and nowhere else
    llm_part = "".join(chr(t) for t, m in zip(ids[0], mask[0]) if not m)
    assert llm_part == "H(a)=7\n\nH(b)=99\n\n" and all(mask[0][i] for i, t in enumerate(ids[0]) if t == OFFLOAD_ID)
    assert ids[1] == first[1] and mask[1] == [1] * len(first[1])  # an answer without a handoff: as sampled
    # the reward's cost: every call, from what each LLM request read (its packed trace) and wrote
    cache = BaselineCache(tmp_path / "cost_base.json", "k", PROMPTS, PAPER, 12)
    cache.entries[cache.key("q")] = {"cost_base": 1e-4}
    reward = CollaborativeReward(engine(slm, None), cache, lam=0.5)
    got = reward(prompts, None, ids, ["q", "q"], ["98", "98"], relay=out["relay"])
    reads = [len(r.prefix) for r in llm.requests]
    assert reads == [len("a=1\n\n"), len("a=1\n\nH(a)=7\n\nb=7+1\n\n")]
    t_slm = sum(mask[0]) - ids[0].count(OFFLOAD_ID)
    assert t_slm == len("a=1\n\nb=7+1\n\nc=99-1\n\n\\boxed{98}") + 1  # its text and its end of turn
    want = (PAPER.slm_out * t_slm + PAPER.llm_in * sum(reads) + PAPER.llm_out * len("H(a)=7H(b)=99")) / 1e6
    d = reward.last
    assert d[0]["cost_act"] == pytest.approx(want) and d[0]["handoffs"] == 2 and d[0]["r_acc"] == 1.0
    assert d[1]["cost_act"] == pytest.approx(PAPER.slm_out * len(first[1]) / 1e6) and not d[1]["offload"]
    assert got == pytest.approx([1 - 0.5 * want / 1e-4, 1 - 0.5 * d[1]["cost_act"] / 1e-4])
    assert reward.pop_stats()["pyrodash/llm_calls"] == 2


def test_a_relay_rollout_hands_trl_the_first_segments_sampling_logprobs_then_nan():
    """With off-policy masking on, the first segment's sampling log-probabilities (the biased rows') lead each
    completion's `logprobs`; everything after it (the LLM's steps, the SLM's resumes: sampled by the policy) is NaN,
    TRL's "no evidence"."""
    import math

    from test_relay import GOLD, OFFLOAD_ID, PAPER, PROMPTS, ScriptLLM, ScriptSLM

    from pyrodash.engine import CollaborateEngine
    from pyrodash.train.relay_rollouts import RelayRollouts

    tok, slm, llm = CharTok(), ScriptSLM(), ScriptLLM()
    first = [tok("a=1\n\n")["input_ids"] + [OFFLOAD_ID], tok(GOLD)["input_ids"] + [tok.eos_token_id]]
    lps = [[-0.5] * len(first[0]), [math.nan] * len(first[1])]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    rollouts = RelayRollouts(
        lambda b, relay: CollaborateEngine(b, llm, PROMPTS, PAPER, max_tokens=200, relay=relay),
        {json.dumps(prompts[0]): "q"},
        max_llm_calls=4,
        step_max_tokens=64,
    )
    out = rollouts(prompts, FakeTrainer(slm, first, lps))
    assert [len(x) for x in out["logprobs"]] == [len(x) for x in out["completion_ids"]]
    got = out["logprobs"][0]
    assert got[: len(first[0])] == lps[0] and len(got) > len(first[0])
    assert all(math.isnan(x) for x in got[len(first[0]) :]) and all(math.isnan(x) for x in out["logprobs"][1])


def test_relay_cost_with_one_call_is_the_single_handoff_cost():
    from pyrodash.cost import Prices, grpo_cost_actual
    from pyrodash.train.reward import relay_cost_actual

    p = Prices.from_yaml("paper")
    assert relay_cost_actual(40, [40], 25, p) == pytest.approx(grpo_cost_actual(40, 25, p, handoff=True))
    assert relay_cost_actual(40, [], 0, p) == pytest.approx(grpo_cost_actual(40, 0, p, handoff=False))


def test_back_to_back_handoffs_keep_an_offload_between_the_llms_steps(monkeypatch):
    import test_relay
    from test_relay import OFFLOAD_ID, PAPER, PROMPTS, ScriptLLM, ScriptSLM

    from pyrodash.engine import CollaborateEngine
    from pyrodash.engine.relay import RelayConfig
    from pyrodash.train.relay_rollouts import _first_result, relay_completion

    monkeypatch.setattr(test_relay, "HARD", {1, 2})  # the SLM hands off again at once after the first LLM step
    tok, slm = CharTok(), ScriptSLM()
    engine = CollaborateEngine(slm, ScriptLLM(), PROMPTS, PAPER, max_tokens=200, relay=RelayConfig(max_llm_calls=4))
    first = tok("a=1\n\n")["input_ids"] + [OFFLOAD_ID]
    (done,) = engine.batch(["q"], slm_results=[_first_result(tok, first, OFFLOAD_ID)])
    assert [s["by"] for s in done.segments] == ["slm", "llm", "llm", "slm"] and len(done.handoffs) == 2
    row = relay_completion(done, first, tok, OFFLOAD_ID, tok.eos_token_id, "\n\n", 4)
    o = OFFLOAD_TOKEN
    assert tok.decode(row["ids"]).replace("<5>", o) == slm.requests[-1].prefix + "H(b)=99\n\nc=99-1\n\n\\boxed{98}<2>"
    assert "".join(chr(t) for t, m in zip(row["ids"], row["env_mask"]) if not m) == "H(a)=7\n\nb=7+1\n\n"
    assert row["reads"] == [len("a=1\n\n"), len("a=1\n\nH(a)=7\n\n")]


def test_one_grpo_step_on_relay_rollouts_masks_the_llms_tokens_from_the_loss(tmp_path):
    """CostAwareGRPOTrainer with `RelayRollouts` on tiny models: every rollout's first segment hands off (scripted),
    the tiny LLM writes a step, the policy resumes; TRL's loss mask is the rollouts' env_mask (0 on the LLM's)."""
    import datasets
    from test_train import tiny_slm_dir

    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.cost import Prices
    from pyrodash.train.config import Stage3Config
    from pyrodash.train.models import FrozenLLM
    from pyrodash.train.reward import BaselineCache, CollaborativeReward
    from pyrodash.train.stage3 import CostAwareGRPOTrainer, collaboration_engine, relay_rollouts

    prices = Prices.from_yaml("paper")
    llm = FrozenLLM.from_spec(str(tiny_slm_dir(tmp_path / "llm", tied=False, seed=1)), batch_size=8)
    model, tok = tiny_model(seed=2)
    off = tok.convert_tokens_to_ids(OFFLOAD_TOKEN)
    cfg = Stage3Config(
        output_dir=str(tmp_path / "s3"), max_steps=1, num_generations=2, per_device_train_batch_size=2,
        max_completion_length=24, max_llm_calls=3, relay_step_max_tokens=6, llm_max_new_tokens=12,
        report_to="none", save_strategy="no", bf16=False, lora_r=2, lora_alpha=4, beta=0.0, logging_steps=1,
    )  # fmt: skip
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "Start 1: +2."}], "question": "Start 1: +2.", "gold": "3", "chat": ""}]
    )
    cache = BaselineCache(tmp_path / "cost_base.json", "tiny", PROMPTS, prices, max_tokens=12)
    cache.fill(llm, ["Start 1: +2."], ["3"])
    engine = collaboration_engine(HFBackend(model, tok), llm, PROMPTS, prices, 24, 12)
    reward = CollaborativeReward(engine, cache, lam=0.5)
    seen = []

    class Trainer(CostAwareGRPOTrainer):
        def sample_first_segments(self, backend, prompt_ids):
            return [tok("1+2=3\n\n", add_special_tokens=False)["input_ids"] + [off] for _ in prompt_ids]

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append(out)
            return out

    rollout = relay_rollouts(cfg, llm, PROMPTS, prices, dataset)
    inner = rollout.__call__
    rollout_out = []
    trainer = Trainer(
        model=model, reward_funcs=[reward], args=cfg, train_dataset=dataset, processing_class=tok,
        peft_config=cfg.lora_config(), collab=reward,
        rollout_func=lambda p, t: rollout_out.append(inner(p, t)) or rollout_out[-1],
    )  # fmt: skip
    trainer.train()
    (out,) = rollout_out
    assert all(r["handoffs"] for r in out["relay"]) and llm.calls > 0
    mask = seen[0]["tool_mask"]
    for i, (ids, env) in enumerate(zip(out["completion_ids"], out["env_mask"])):
        assert seen[0]["completion_ids"][i, : len(ids)].tolist() == ids
        assert mask[i, : len(env)].tolist() == env and 0 in env and env[:8] == [1] * 8
        assert seen[0]["completion_mask"][i, : len(ids)].all()
    assert reward.last and all(d["handoffs"] >= 1 for d in reward.last)


def test_a_relay_resumes_seed_depends_on_its_rollout_and_count_not_on_the_order_of_requests():
    """`SampledSLM`: the k-th resume of the rollout with seed s samples with `resume_seed(s, k)`, at the rollout's
    temperature and top-p, whichever rollout asks first; so the in-process backends may decode the rollouts' resumes
    together. Fails if the seed is drawn per request (the order then decides it) or a resume goes unseeded."""
    from pyrodash.backends.base import GenRequest
    from pyrodash.train.relay_rollouts import SampledSLM, resume_seed

    class Recorder:  # the policy's backend: records what it is asked
        def __init__(self):
            self.asked = []

        def stream(self, req):
            self.asked.append(req)
            return iter(())

    def seeds(order: list[int]) -> dict[tuple[int, int], tuple]:
        inner = Recorder()
        slm = SampledSLM(inner, temperature=0.3, top_p=0.9)
        for s in order:
            slm.stream(GenRequest(messages=[], prefix=f"{s}", seed=s))
        per, out = {}, {}
        for r in inner.asked:
            k = per[int(r.prefix)] = per.get(int(r.prefix), -1) + 1
            out[int(r.prefix), k] = (r.seed, r.temperature, r.top_p)
        return out

    first, second = seeds([11, 11, 22, 11, 22]), seeds([22, 11, 22, 11, 11])
    assert first == second
    assert first[11, 2] == (resume_seed(11, 2), 0.3, 0.9)
    assert len({v[0] for v in first.values()}) == 5  # every resume its own seed
    with pytest.raises(ValueError, match="seed"):
        SampledSLM(Recorder(), 0.3, 0.9).stream(GenRequest(messages=[], prefix="x"))
