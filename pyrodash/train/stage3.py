"""Stage 3 — cost-aware GRPO with the frozen LLM inside the rollout.

    pyrodash train stage3 --config configs/world/quick.yaml --output-dir runs/quick [--lambda 0.3]
    pyrodash train stage3 --config configs/world/full.yaml --output-dir runs/full --lambdas 0.05,0.6,2,4

Loads the Stage 2 model, caches Cost_base (DIR/cost_base.json), trains with TRL's GRPOTrainer and
`CollaborativeReward` (R_total = R_acc - λ R_eff; only SLM tokens enter the loss), logs to
DIR/stage3-lambda<λ>/log.jsonl, merges the adapters into DIR/stage3-lambda<λ>/ and evaluates on the held-out set
(a sweep writes DIR/stage3-sweep.json). The five steps in full: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

from trl import GRPOTrainer

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, FailurePolicy, slm_chat
from pyrodash.engine.relay import RelayConfig
from pyrodash.events import Done
from pyrodash.grading import grade_batch
from pyrodash.prompts import Prompts, get_prompts
from pyrodash.tokens import offload_token_id
from pyrodash.train import distributed as dist
from pyrodash.train.chat_logs import row_messages, turn_messages
from pyrodash.train.common import callbacks, quiet, save_checkpoint
from pyrodash.train.config import save_resolved
from pyrodash.train.curate import load_conversations, load_examples, read_jsonl
from pyrodash.train.models import FrozenLLM, load_local
from pyrodash.train.paths import curated_dir, llm_spec, require, resolve_world, stage_dir
from pyrodash.train.relay_rollouts import RelayRollouts
from pyrodash.train.reward import BaselineCache, CollaborativeReward
from pyrodash.train.rollouts import ExploreBranches, decode_rollouts, sampling_logprobs, unsupported_sampling


class CostAwareGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose in-process rollouts are decoded by PyroDash's decode loop (`pyrodash.train.rollouts`; with
    `explore`, an ExploreBranches, some of them without `<offload>`) and whose logs also carry the collaborative
    reward's statistics since the previous log. vLLM rollouts stay TRL's."""

    def __init__(self, *args, collab=None, explore: ExploreBranches | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.collab, self.explore = collab, explore
        self._rollout_backend = None
        bad = [] if self.use_vllm else unsupported_sampling(self.args)
        if bad:
            raise ValueError(
                f"stage3: {', '.join(bad)}: in-process rollouts sample with temperature and top_p only; unset these"
            )

    def _generate_single_turn(self, prompt_ids, images, *args, **kwargs):
        if self.use_vllm or self.use_transformers_continuous_batching or images is not None:
            return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)
        with self.rollout_backend() as backend:
            ids = self.sample_first_segments(backend, prompt_ids)
            return ids, self.first_segment_logprobs(backend, prompt_ids, ids)

    @contextlib.contextmanager
    def rollout_backend(self):
        """The policy as an `HFBackend` for rollouts, in the same contexts as TRL's own generation: ZeRO-3
        parameters gathered, FSDP's summoned, no gradients, eval mode (training mode restored after)."""
        import torch
        from trl.models.utils import unwrap_model_for_generation

        with (
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
            ) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            base = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA layers sit in it
            was_training = base.training
            if self._rollout_backend is None or self._rollout_backend.model is not base:
                self._rollout_backend = HFBackend(base, self.processing_class)  # (puts the model in eval mode)
            base.eval()
            try:
                yield self._rollout_backend
            finally:
                base.train(was_training)

    def sample_first_segments(self, backend, prompt_ids) -> list[list[int]]:
        """The policy's completions up to its first stop id (`<offload>` included), some with `<offload>` banned."""
        return decode_rollouts(
            backend,
            prompt_ids,
            self.temperature,
            self.top_p,
            self.max_completion_length,
            self.eos_token_ids,
            self.explore,
        )

    def first_segment_logprobs(self, backend, prompt_ids, ids) -> list[list[float]] | None:
        """The sampling log-probabilities of the first segments `ids` (`rollouts.sampling_logprobs`: NaN on the rows
        `explore` left alone) for TRL's off-policy sequence masking, or None where it is off (the recipe's
        `off_policy_mask_threshold`) or no row is explored: TRL then counts every token as the policy's sample."""
        if self.explore is None or self.off_policy_mask_threshold is None:
            return None
        return sampling_logprobs(backend.model, prompt_ids, ids, self.explore, self.temperature)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.collab is not None and self.model.training:
            logs.update(dist.pop_reward_stats(self.collab))  # every rank's rollouts (a collective under accelerate)
        super().log(logs, start_time)


def collaboration_engine(
    slm,
    llm,
    prompts: Prompts,
    prices,
    max_new_tokens: int,
    llm_max_tokens: int,
    failure: FailurePolicy | None = None,
    relay: RelayConfig | None = None,
) -> CollaborateEngine:
    """The Collaborate Engine of Stage 3 over the SLM backend and the frozen LLM (`FrozenLLM`). The default failure
    policy is the rollouts': the LLM's batch call policy, and a failed handoff is recorded (finish_reason "error"),
    never fatal and never finished by the SLM (the reward skips it). `relay`: the relay's settings (None: single
    handoff)."""
    pol = llm.policy
    failure = failure or dataclasses.replace(pol, on_error="raise")
    return CollaborateEngine(
        slm,
        llm.backend,
        prompts,
        prices,
        max_tokens=max_new_tokens,
        llm_max_tokens=llm_max_tokens,
        failure=failure,
        relay=relay,
    )


def collaborate(
    model,
    tokenizer,
    llm,
    questions: list,
    prompts: Prompts,
    prices,
    max_new_tokens: int,
    llm_max_tokens: int,
    batch_size: int = 64,
    relay: RelayConfig | None = None,
) -> list[Done]:
    """The engine on held-out questions (greedy SLM under P_s, one handoff per offloaded question, or the relay's
    `relay`), exactly as `pyrodash eval` and `pyrodash serve` run it (their default failure policy: an LLM that fails
    every attempt is a fallback)."""
    was_training = model.training
    slm = HFBackend(model, tokenizer)
    engine = collaboration_engine(
        slm, llm, prompts, prices, max_new_tokens, llm_max_tokens, failure=FailurePolicy(), relay=relay
    )
    dones = engine.batch(questions, batch_size=batch_size, concurrency=llm.concurrency, desc="collaborative eval")
    model.train(was_training)
    return dones


def evaluate_collaboration(
    model,
    tokenizer,
    llm,
    rows: list[dict],
    prompts: Prompts,
    prices,
    max_new_tokens: int,
    llm_max_tokens: int,
    batch_size: int = 64,
    relay: RelayConfig | None = None,
) -> dict:
    """`collaborate` on held-out rows, graded: accuracy, offload rate, LLM calls per example and mean dollar cost
    per example (and accuracy / offload rate by difficulty)."""
    dones = collaborate(
        model,
        tokenizer,
        llm,
        [row_messages(prompts, r) for r in rows],
        prompts,
        prices,
        max_new_tokens,
        llm_max_tokens,
        batch_size,
        relay,
    )
    ok = grade_batch([d.output for d in dones], [r["gold"] for r in rows])
    n = max(1, len(rows))
    off = [d.handoff is not None for d in dones]
    by = {d: [c for c, r in zip(ok, rows, strict=True) if r.get("difficulty") == d] for d in ("easy", "hard")}
    return {
        "n": len(rows),
        "accuracy": sum(ok) / n,
        "offload_rate": sum(off) / n,
        "llm_calls_per_example": sum(d.usage.llm_calls for d in dones) / n,
        "cost_usd_per_example": sum(d.cost_usd for d in dones) / n,
        "fallbacks": sum(d.fallback for d in dones),
        **{f"accuracy_{d}": (sum(v) / len(v) if v else None) for d, v in by.items()},
        "accuracy_turns": _rate([c for c, r in zip(ok, rows) if (r.get("meta") or {}).get("turn", 1) > 1]),
        "n_turns": sum(1 for r in rows if (r.get("meta") or {}).get("turn", 1) > 1),
        "offload_rate_hard": _rate([o for o, r in zip(off, rows) if r.get("difficulty") == "hard"]),
        "offload_rate_easy": _rate([o for o, r in zip(off, rows) if r.get("difficulty") == "easy"]),
    }


# stage3_stats.json when the held-out evaluation is not asked for (`run_stage3(heldout=False)`: the demo)
NO_HELDOUT = {"heldout": None, "heldout_skipped": "not asked for (the demo evaluates each policy on val and test)"}


def heldout_stats(cfg, model, tokenizer, llm, out_dir: str | Path, prompts: Prompts, prices) -> dict:
    """{"heldout": `evaluate_collaboration` of the trained policy on curation's held-out rows} (nothing without
    them)."""
    path = curated_dir(out_dir) / "heldout.jsonl"
    if not path.exists():
        return {}
    rows = read_jsonl(path)
    held = evaluate_collaboration(
        model, tokenizer, llm, rows, prompts, prices, cfg.max_completion_length, cfg.llm_max_new_tokens,
        relay=relay_config(cfg),
    )  # fmt: skip
    return {"heldout": held}


def _rate(xs: list[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def training_prompts(cfg, world) -> list:
    """Stage 3's training prompts: the single questions of `cfg.source` (`train_limit` of them) and conversation
    turns of `cfg.conversations`, as many as make them `conversation_share` of all prompts (follow-up turns first:
    a turn 1 is a single question); in a fixed order (TRL's sampler shuffles)."""
    singles = load_examples(
        cfg.source, world, cfg.source_split, cfg.question_field, cfg.answer_field, cfg.train_limit, cfg.train_offset
    )
    if not cfg.conversation_share:
        return singles
    n_turns = round(cfg.conversation_share / (1 - cfg.conversation_share) * len(singles))
    pool = load_conversations(cfg.conversations, world, range_max_turns=getattr(cfg, "range_max_turns", None))[0]
    pool = sorted(pool, key=lambda ex: ex.meta["turn"] < 2)  # stable: follow-ups, then openers
    return singles + pool[:n_turns]


def run_stage3(
    recipe,
    out_dir: str | Path,
    lam: float | None = None,
    stage2: str | Path | None = None,
    resume: bool = False,
    heldout: bool = True,
) -> Path:
    """Stage 3 of `recipe` at λ (`recipe.stage3_lambda(lam)`): reads DIR/stage2/, writes DIR/stage3-lambda<λ>/.
    `heldout`: evaluate the policy on curation's held-out set (`world:dev` on the world: recipe work) into
    stage3_stats.json; the demo, which evaluates every policy on val and test, passes False (the stats say so)."""
    import torch
    from transformers.trainer_utils import get_last_checkpoint

    dist.setup()
    lam = recipe.stage3_lambda(lam)
    dest = stage_dir(out_dir, "stage3", lam)
    cfg = recipe.stage_config("stage3", output_dir=dest / "trainer", lam=lam)
    src = Path(stage2) if stage2 else stage2_checkpoint(out_dir)
    prompts, prices = get_prompts(recipe.prompts), Prices.from_yaml(recipe.prices)
    examples, chats, llm, cache, computed = _baseline(recipe, cfg, out_dir)
    model, tok, tid, original_eos = load_policy(src, cfg)
    llm.calls = 0  # count only the handoffs of training from here on
    engine = collaboration_engine(
        HFBackend(model, tok), llm, prompts, prices, cfg.max_completion_length, cfg.llm_max_new_tokens
    )  # the policy's handoffs: the rollouts come from TRL
    reward = CollaborativeReward(
        engine, cache, cfg.lam, cfg.cost_penalty, cfg.slm_price, cfg.llm_batch_size, cfg.llm_concurrency
    )
    torch.manual_seed(cfg.seed)
    dataset = training_dataset(prompts, examples, chats)
    trainer = CostAwareGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=cfg.lora_config(),
        callbacks=callbacks(cfg, dest / "log.jsonl"),
        collab=reward,
        explore=exploration(cfg, tid),
        rollout_func=relay_rollouts(cfg, llm, prompts, prices, dataset),
    )
    quiet(trainer)
    last = get_last_checkpoint(str(cfg.output_dir)) if resume and Path(cfg.output_dir).exists() else None
    result = trainer.train(resume_from_checkpoint=last)
    by_rank = dist.reward_totals_by_rank(reward)  # each rank's rollouts made their own handoffs
    computed_by_rank = dist.gather_objects(computed)  # Cost_base: LLM calls by the main process only
    merged = dist.merged_model(trainer, src, dest / "trainer" / "final-adapter")
    if not dist.is_main():  # checkpoint, held-out evaluation (its LLM calls) and stats: the main process only
        dist.barrier()
        return dest
    merged.generation_config.eos_token_id = original_eos
    out = save_checkpoint(merged, tok, dest)
    stats = run_stats(cfg, result, examples, chats, by_rank, computed, computed_by_rank, last)
    stats.update(heldout_stats(cfg, merged, tok, llm, out_dir, prompts, prices) if heldout else NO_HELDOUT)
    (dest / "stage3_stats.json").write_text(json.dumps(stats, indent=2))
    save_resolved(out, recipe, cfg, {"stage2": str(src), "stats": stats})
    dist.barrier()
    return out


def stage2_checkpoint(out_dir: str | Path) -> Path:
    """DIR/stage2/, where Stage 3 starts (an error naming the command to run when it is missing)."""
    return require(
        stage_dir(out_dir, "stage2"),
        "the Stage 2 checkpoint",
        "run `pyrodash train stage2` with the same --output-dir first",
    )


def load_policy(src: Path, cfg) -> tuple:
    """The Stage 2 model to train, its tokenizer, its `<offload>` id and its own EOS ids (restored at save):
    `<offload>` joins the generation EOS ids (and vLLM's stop ids), so every rollout ends there."""
    model, tok = load_local(src, chat_template=cfg.chat_template)
    tid = offload_token_id(tok)
    if tid is None:
        raise ValueError(f"{src} has no <offload> token: Stage 3 starts from a Stage 2 checkpoint")
    original_eos = model.generation_config.eos_token_id
    eos = [original_eos] if isinstance(original_eos, int) else list(original_eos or [])
    model.generation_config.eos_token_id = sorted({*eos, tok.eos_token_id, tid})
    if cfg.use_vllm:  # vLLM samples outside transformers: pass <offload> as a stop token there too
        cfg.generation_kwargs = {**(cfg.generation_kwargs or {}), "stop_token_ids": [tid]}
    return model, tok, tid, original_eos


def training_dataset(prompts: Prompts, examples: list, chats: list):
    """TRL's dataset of the training prompts. `prompt`: the engine's SLM chat (P_s + history + question); `chat`: a
    turn's chat for the engine (JSON), "" for a single question."""
    import datasets

    return datasets.Dataset.from_list(
        [
            {
                "prompt": slm_chat(prompts, turn_messages(prompts, ex)),
                "question": ex.question,
                "gold": ex.gold,
                "chat": json.dumps(c) if isinstance(c, list) else "",
            }
            for ex, c in zip(examples, chats, strict=True)
        ]
    )


def exploration(cfg, offload_id: int) -> ExploreBranches | None:
    """The rollouts sampled with `<offload>` banned (`stage3.explore_no_handoff`) or pushed (`stage3.explore_handoff`,
    by `explore_handoff_bias`), or None when there are none."""
    if not (cfg.explore_no_handoff or cfg.explore_handoff):
        return None
    if cfg.use_vllm:
        raise ValueError(
            "stage3.explore_no_handoff / explore_handoff work with in-process rollouts only; set them to 0 with vLLM"
        )
    return ExploreBranches(
        offload_id, cfg.num_generations, cfg.explore_no_handoff, cfg.explore_handoff, cfg.explore_handoff_bias
    )


def relay_config(cfg) -> RelayConfig | None:
    """The relay of Stage 3's rollouts and held-out evaluation (`stage3.max_llm_calls` > 1), else None."""
    if cfg.max_llm_calls <= 1:
        return None
    return RelayConfig(max_llm_calls=cfg.max_llm_calls, step_max_tokens=cfg.relay_step_max_tokens)


def relay_rollouts(cfg, llm, prompts: Prompts, prices, dataset) -> RelayRollouts | None:
    """TRL's `rollout_func` for relay rollouts (`pyrodash.train.relay_rollouts`), or None (single handoff: TRL's
    own generation path, through `CostAwareGRPOTrainer._generate_single_turn`)."""
    relay = relay_config(cfg)
    if relay is None:
        return None

    def engine(slm, relay):
        return collaboration_engine(
            slm, llm, prompts, prices, cfg.max_completion_length, cfg.llm_max_new_tokens, relay=relay
        )

    queries = {json.dumps(r["prompt"]): json.loads(r["chat"]) if r["chat"] else r["question"] for r in dataset}
    return RelayRollouts(engine, queries, relay.max_llm_calls, relay.step_max_tokens)


def run_stats(cfg, result, examples: list, chats: list, by_rank: list, computed: int, computed_by_rank, last) -> dict:
    """DIR/stage3-lambda<λ>/stage3_stats.json (before the held-out evaluation): the training's counts, all ranks."""
    return {
        "lambda": cfg.lam,
        "cost_penalty": cfg.cost_penalty,
        "train_loss": result.training_loss,
        "steps": result.global_step,
        "prompts": len(examples),
        "conversation_turns": sum(1 for c in chats if isinstance(c, list)),
        "rollouts": sum(r["rollouts"] for r in by_rank),
        "llm_handoff_calls": sum(r["llm_calls"] for r in by_rank),
        "llm_failures": sum(r.get("llm_failures", 0) for r in by_rank),
        "cost_base_computed": computed,
        "cost_base_cached": len(examples) - computed,
        "resumed_from": last,
        "processes": len(by_rank),
        "llm_handoff_calls_by_rank": [r["llm_calls"] for r in by_rank],
        "rollouts_by_rank": [r["rollouts"] for r in by_rank],
        "cost_base_computed_by_rank": computed_by_rank,
    }


def _baseline(recipe, cfg, out_dir: str | Path) -> tuple[list, list, FrozenLLM, BaselineCache, int]:
    """Stage 3's training prompts, their chats, the frozen LLM and Cost_base for each (`eq:grpo-baseline`, cached in
    DIR/cost_base.json); the last item: how many Cost_base entries this call computed (LLM calls)."""
    prompts, prices = get_prompts(recipe.prompts), Prices.from_yaml(recipe.prices)
    with dist.main_first():  # one rank builds a missing world; the others then find it
        world = resolve_world(recipe)
    examples = training_prompts(cfg, world)
    if not examples:
        raise ValueError(f"stage3.source {cfg.source!r} gave no training prompts")
    chats = [turn_messages(prompts, ex) if ex.meta.get("turn") else ex.question for ex in examples]
    spec = llm_spec(recipe)
    llm = FrozenLLM.from_spec(spec, batch_size=cfg.llm_batch_size, concurrency=cfg.llm_concurrency)
    with dist.main_first():  # the main process computes Cost_base; the other ranks read its file (no LLM calls)
        cache = BaselineCache(
            Path(out_dir) / "cost_base.json",
            json.dumps(spec, sort_keys=True, default=str),
            prompts,
            prices,
            cfg.llm_max_new_tokens,
        )
        computed = cache.fill(llm, chats, [ex.gold for ex in examples])
    return examples, chats, llm, cache, computed


def fill_cost_base(recipe, out_dir: str | Path) -> int:
    """Cost_base of every Stage 3 training prompt into DIR/cost_base.json, where each λ's `run_stage3` finds it (the
    demo runs this once, beside Stage 1-2, instead of in every λ's run side by side); returns the LLM calls made."""
    cfg = recipe.stage_config("stage3", output_dir=Path(out_dir) / "stage3-cost-base")
    return _baseline(recipe, cfg, out_dir)[-1]


def run_sweep(recipe, out_dir: str | Path, lambdas: list[float], resume: bool = False) -> Path:
    """Stage 3 once per λ (same Stage 2 start, same cached Cost_base); summary in DIR/stage3-sweep.json."""
    summary = {"lambdas": lambdas, "runs": {}}
    rates = Path(out_dir) / "stage2" / "offload_rates.json"
    if rates.exists():
        summary["stage2"] = json.loads(rates.read_text())
    sft_acc = (summary.get("stage2") or {}).get("accuracy_without_ps")
    table = []
    for lam in lambdas:
        out = run_stage3(recipe, out_dir, lam=lam, resume=resume)
        stats = json.loads((out / "stage3_stats.json").read_text())
        summary["runs"][f"{lam:g}"] = stats
        held = stats.get("heldout") or {}
        table.append(
            {
                "lambda": lam,
                "accuracy": held.get("accuracy"),
                "offload_rate": held.get("offload_rate"),
                "llm_calls_per_example": held.get("llm_calls_per_example"),
                "cost_usd_per_example": held.get("cost_usd_per_example"),
                "train_llm_calls_per_rollout": stats["llm_handoff_calls"] / max(1, stats["rollouts"]),
                "beats_slm_sft": None if sft_acc is None or not held else held["accuracy"] > sft_acc,
            }
        )
    summary["table"] = table
    summary["slm_sft_accuracy"] = sft_acc
    path = Path(out_dir) / "stage3-sweep.json"
    if dist.is_main():
        path.write_text(json.dumps(summary, indent=2))
    dist.barrier()
    return path
