"""Stage 2 — offloading-oriented SFT (behavioural cold start), and the offload rates it produces.

    pyrodash train stage2 --config configs/world/quick.yaml --output-dir runs/quick

TRL's SFTTrainer on Corpus A u Corpus B (`eq:sft-loss`), the loss on the assistant's completion only (the template's
`{% generation %}` markers, or completion-only loss without them: `pyrodash.train.chat_template`), embeddings
frozen, LoRA on q/k/v/o; the adapters are merged into the saved checkpoint. Relay rows (`curate.relay`) go in
pre-tokenized, the loss masked on the LLM's steps (`pyrodash.train.relay_rows`).

Then the measurement the paper's claim rests on, on the held-out set curation labelled easy/hard with the base SLM:
the rate at which the model emits `<offload>` (greedy; `<offload>` is a stop id) on hard and on easy problems under
P_s, and without P_s (where it should never appear). Written to DIR/stage2/offload_rates.json.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.grading import grade_batch
from pyrodash.prompts import Prompts, get_prompts
from pyrodash.tokens import offload_token_id
from pyrodash.train import distributed as dist
from pyrodash.train.chat_logs import row_messages
from pyrodash.train.chat_template import loss_mask_config
from pyrodash.train.common import callbacks, messages_dataset, quiet, save_checkpoint
from pyrodash.train.config import save_resolved
from pyrodash.train.curate import read_jsonl
from pyrodash.train.length_chunks import LengthChunkedSFTTrainer
from pyrodash.train.models import load_local
from pyrodash.train.paths import curated_dir, require, stage_dir
from pyrodash.train.relay_rows import has_llm_spans, relay_dataset


def measure_offload_rates(
    model,
    tokenizer,
    rows: list[dict],
    prompts: Prompts,
    max_new_tokens: int,
    batch_size: int = 64,
    desc: str | None = "offload rates",
) -> dict:
    """`<offload>` rates with and without P_s on `rows` (dicts with question, gold, difficulty easy|hard; a
    conversation turn's meta.history first), and the accuracy of the answers completed without P_s (the SLM+SFT
    baseline)."""
    if offload_token_id(tokenizer) is None:
        raise ValueError("the model has no <offload> token: measure a Stage 1/2/3 checkpoint")
    was_training = model.training
    backend = HFBackend(model, tokenizer)
    result: dict = {"n": len(rows), "n_hard": sum(r["difficulty"] == "hard" for r in rows)}
    result["n_easy"] = result["n"] - result["n_hard"]
    for cond, with_ps in (("with_ps", True), ("without_ps", False)):
        # the engine's SLM step (Lines 1-5, greedy, `<offload>` a stop id), with or without P_s as system message
        engine = CollaborateEngine(
            backend,
            backend,
            prompts if with_ps else replace(prompts, offload_system=""),
            Prices(0, 0, 0, 0),
            max_tokens=max_new_tokens,
        )
        dones = engine.batch(
            [row_messages(prompts, r) for r in rows],
            batch_size=batch_size,
            stop_at_handoff=True,
            desc=f"{desc} ({cond})" if desc else None,
        )
        off = [d.handoff is not None for d in dones]
        for diff in ("hard", "easy"):
            sel = [o for o, r in zip(off, rows, strict=True) if r["difficulty"] == diff]
            result[f"{diff}_{cond}"] = sum(sel) / len(sel) if sel else None
        result[f"all_{cond}"] = sum(off) / len(off) if off else None
        if not with_ps:
            ok = grade_batch([d.output for d in dones], [r["gold"] for r in rows])
            result["accuracy_without_ps"] = sum(ok) / len(ok) if ok else None
        else:
            pos = [d.handoff for d in dones if d.handoff is not None]
            result["mean_handoff_position_with_ps"] = sum(pos) / len(pos) if pos else None
    model.train(was_training)
    return result


def train_stage2(
    stage1_path: str | Path, rows: list[dict], cfg, out_dir: str | Path, log_path: str | Path, thread_grant=None
):
    """SFT with LoRA on A u B `rows`; merge and save to `out_dir`. Returns (checkpoint dir, merged model, tokenizer,
    train stats). `thread_grant`: a callable giving the torch threads granted now (`common.GrantedThreads`)."""
    model, tok = load_local(stage1_path, chat_template=cfg.chat_template)
    cfg = loss_mask_config(cfg, rows, tok)
    rows = list(rows)
    random.Random(cfg.seed).shuffle(rows)
    if has_llm_spans(rows):  # relay rows (curate.relay): pre-tokenized, the loss masked on the LLM's steps
        dataset, cfg = relay_dataset(rows, tok, cfg)
    else:
        dataset = messages_dataset(rows)
    trainer = LengthChunkedSFTTrainer(
        model=model,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=cfg.lora_config(),
        callbacks=callbacks(cfg, log_path, thread_grant),
    )
    quiet(trainer)
    result = trainer.train()
    merged = dist.merged_model(trainer, stage1_path, Path(out_dir) / "trainer" / "final-adapter")
    out = save_checkpoint(merged, tok, out_dir) if dist.is_main() else Path(out_dir)  # the main process writes
    return out, merged, tok, {"train_loss": result.training_loss, "steps": result.global_step, "rows": len(rows)}


def run_stage2(recipe, out_dir: str | Path, stage1: str | Path | None = None, thread_grant=None) -> Path:
    """Stage 2 of `recipe`: reads DIR/stage1/ and DIR/curated/, writes DIR/stage2/ (+ offload_rates.json).
    `thread_grant`: what the demo's scheduler passes an elastic step (`common.GrantedThreads`)."""
    dist.setup()
    cur = curated_dir(out_dir)
    hint = "run `pyrodash curate` and `pyrodash train stage1` with the same --output-dir first"
    rows = read_jsonl(require(cur / "corpus_a.jsonl", "Corpus A", hint)) + read_jsonl(cur / "corpus_b.jsonl")
    src = Path(stage1) if stage1 else require(stage_dir(out_dir, "stage1"), "the Stage 1 checkpoint", hint)
    dest = stage_dir(out_dir, "stage2")
    cfg = recipe.stage_config("stage2", output_dir=dest / "trainer")
    out, model, tok, stats = train_stage2(src, rows, cfg, dest, dest / "log.jsonl", thread_grant)
    if not dist.is_main():  # the measurement and the files: the main process only
        dist.barrier()
        return out
    heldout = read_jsonl(cur / "heldout.jsonl") if (cur / "heldout.jsonl").exists() else []
    if cfg.measure_limit:
        heldout = heldout[: cfg.measure_limit]
    rates = None
    if heldout:
        rates = measure_offload_rates(model, tok, heldout, get_prompts(recipe.prompts), cfg.measure_max_new_tokens)
        (dest / "offload_rates.json").write_text(json.dumps(rates, indent=2))
    save_resolved(out, recipe, cfg, {"stage1": str(src), "stats": stats, "offload_rates": rates})
    dist.barrier()
    return out
