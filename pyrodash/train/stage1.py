"""Stage 1 — control-token embedding learning.

    pyrodash train stage1 --config configs/world/quick.yaml --output-dir runs/quick

Add `<offload>` to the base SLM (`pyrodash.tokens.add_offload_token`, sigma 0.1), train its embedding rows (and
transient LoRA adapters) on Corpus B with TRL's SFTTrainer, then save the base afresh plus the trained rows only:
every other parameter is bit-identical to the base (checked before saving).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pyrodash.tokens import add_offload_token
from pyrodash.train import distributed as dist
from pyrodash.train.chat_template import loss_mask_config
from pyrodash.train.common import callbacks, messages_dataset, quiet, save_checkpoint
from pyrodash.train.config import save_resolved
from pyrodash.train.curate import read_jsonl
from pyrodash.train.length_chunks import LengthChunkedSFTTrainer
from pyrodash.train.models import load_local
from pyrodash.train.paths import curated_dir, require, slm_spec, stage_dir


def offload_rows(model, tid: int) -> dict[str, torch.Tensor]:
    """The `<offload>` row of the input embedding and, when untied, of the LM head."""
    emb = model.get_input_embeddings().weight
    rows = {"input": emb[tid].detach().clone()}
    out = model.get_output_embeddings()
    if out is not None and out.weight.data_ptr() != emb.data_ptr():
        rows["output"] = out.weight[tid].detach().clone()
    return rows


def mask_rows_to(param: torch.nn.Parameter, tid: int) -> None:
    """Make `param` trainable but let only row `tid` receive gradient (weight decay must be 0, or AdamW moves the
    other rows). Not PEFT's `trainable_token_indices`: TRL's fused LM head multiplies by `lm_head.weight` directly,
    so the wrapper's delta for the output row would never be used or trained."""
    mask = torch.zeros(param.shape[0], 1, dtype=param.dtype, device=param.device)
    mask[tid] = 1
    param.requires_grad_(True)
    param.register_hook(lambda g: g * mask)


def row_param_names(model) -> set[str]:
    """State-dict names of the input embedding and LM head weights (the tensors that hold `<offload>` rows)."""
    ptrs = {model.get_input_embeddings().weight.data_ptr()}
    if model.get_output_embeddings() is not None:
        ptrs.add(model.get_output_embeddings().weight.data_ptr())
    return {n for n, t in model.state_dict().items() if t.data_ptr() in ptrs}


def changed_params(base_sd: dict[str, torch.Tensor], model, tid: int) -> list[str]:
    """Names of `model`'s parameters that differ from `base_sd` anywhere but the `<offload>` row `tid` of the
    embedding / LM head (compared on the base's rows when the vocabulary grew). Empty = Stage 1's invariant holds."""
    rows = row_param_names(model)
    new_sd = model.state_dict()
    bad = sorted(set(base_sd) ^ set(new_sd))
    for name in set(base_sd) & set(new_sd):
        old, new = base_sd[name], new_sd[name]
        if name in rows:
            n = old.shape[0]
            if new.shape[1:] != old.shape[1:] or new.shape[0] < n:
                bad.append(name)
                continue
            keep = torch.ones(n, dtype=torch.bool)
            if tid < n:
                keep[tid] = False
            old, new = old[keep], new[:n][keep]
        if old.shape != new.shape or not torch.equal(old, new):
            bad.append(name)
    return sorted(bad)


def _row_weights(model) -> dict[str, torch.Tensor]:
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    if out is None or out.weight.data_ptr() == emb.data_ptr():
        return {"input": emb}
    return {"input": emb, "output": out.weight}


def _rows_trainable_only(model, cfg, tid: int):
    """(the model with transient LoRA adapters, its base) where the embedding gradients reach row `tid` only."""
    model.requires_grad_(False)
    from peft import get_peft_model
    from transformers import set_seed

    # PEFT draws the adapters' initial weights from the global RNG, which the trainer only seeds after this: seeded
    # here, Stage 1 gives the same rows whatever ran earlier in the process (a world build, curation). Unseeded, a
    # demo that built its world and one that found it cached trained different rows from the same data.
    set_seed(cfg.seed)
    peft_model = get_peft_model(model, cfg.lora_config())
    base = peft_model.get_base_model()
    mask_rows_to(base.get_input_embeddings().weight, tid)
    out_emb = base.get_output_embeddings()
    if out_emb is not None and out_emb.weight.data_ptr() != base.get_input_embeddings().weight.data_ptr():
        mask_rows_to(out_emb.weight, tid)
    return peft_model, base


def _save_rows_only(base_path, cfg, tid: int, trained: dict[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Discard the adapters: save the base afresh + the trained `<offload>` rows only (checked: no other parameter
    changes). Returns the checkpoint dir."""
    fresh, fresh_tok = load_local(base_path, chat_template=cfg.chat_template)
    base_sd = {k: v.detach().clone() for k, v in fresh.state_dict().items()}
    tid2 = add_offload_token(fresh, fresh_tok, sigma=cfg.sigma, seed=cfg.init_seed)
    assert tid2 == tid
    with torch.no_grad():
        fresh.get_input_embeddings().weight[tid] = trained["input"]
        if "output" in trained:
            fresh.get_output_embeddings().weight[tid] = trained["output"]
    bad = changed_params(base_sd, fresh, tid)
    assert not bad, f"Stage 1 would change parameters other than the <offload> rows: {bad}"
    return save_checkpoint(fresh, fresh_tok, out_dir)


def train_stage1(base_path: str | Path, rows: list[dict], cfg, out_dir: str | Path, log_path: str | Path):
    """Train the `<offload>` rows on Corpus B `rows`; save the base + rows checkpoint to `out_dir`.
    Returns (checkpoint dir, stats dict); under `accelerate launch` the other ranks get (dir, None)."""
    if cfg.weight_decay != 0:
        raise ValueError(
            f"stage1.weight_decay={cfg.weight_decay}: must be 0, or AdamW would move the frozen "
            "embedding rows during training"
        )
    model, tok = load_local(base_path, chat_template=cfg.chat_template)
    cfg = loss_mask_config(cfg, rows, tok)
    tid = add_offload_token(model, tok, sigma=cfg.sigma, seed=cfg.init_seed)
    init = offload_rows(model, tid)
    peft_model, base = _rows_trainable_only(model, cfg, tid)
    before = {k: w.detach().clone() for k, w in _row_weights(base).items()}
    trainer = LengthChunkedSFTTrainer(
        model=peft_model,
        args=cfg,
        train_dataset=messages_dataset(rows),
        processing_class=tok,
        callbacks=callbacks(cfg, log_path),
    )
    quiet(trainer)
    if dist.uses_zero3(trainer):
        raise ValueError(
            "Stage 1 trains two embedding rows: run it with DDP or ZeRO-2, not ZeRO-3 (the rows would be "
            "sharded across ranks)"
        )
    result = trainer.train()
    if not dist.is_main():  # the checkpoint and its stats: the main process only
        return Path(out_dir), None
    trained = offload_rows(base, tid)
    others = torch.ones(next(iter(before.values())).shape[0], dtype=torch.bool)
    others[tid] = False
    drift = max(float((w.detach() - before[k])[others].abs().max()) for k, w in _row_weights(base).items())
    out = _save_rows_only(base_path, cfg, tid, trained, out_dir)
    stats = {
        "offload_token_id": tid,
        "train_loss": result.training_loss,
        "steps": result.global_step,
        "rows": {
            k: {
                "init_norm": float(init[k].norm()),
                "trained_norm": float(trained[k].norm()),
                "moved": float((trained[k] - init[k]).norm()),
            }
            for k in trained
        },
        "tied_embeddings": "output" not in trained,
        "other_rows_max_change_in_training": drift,
    }
    (Path(out) / "stage1_stats.json").write_text(json.dumps(stats, indent=2))
    return out, stats


def run_stage1(recipe, out_dir: str | Path, base: str | Path | None = None) -> Path:
    """Stage 1 of `recipe`: reads DIR/curated/corpus_b.jsonl, writes DIR/stage1/. Returns the checkpoint dir."""
    dist.setup()
    corpus_b = require(
        curated_dir(out_dir) / "corpus_b.jsonl", "Corpus B", "run `pyrodash curate --config CFG --output-dir DIR` first"
    )
    dest = stage_dir(out_dir, "stage1")
    cfg = recipe.stage_config("stage1", output_dir=dest / "trainer")
    with dist.main_first():  # one rank builds a missing world; the others then find it
        base_path = base or slm_spec(recipe)
    out, stats = train_stage1(base_path, read_jsonl(corpus_b), cfg, dest, dest / "log.jsonl")
    if dist.is_main():
        save_resolved(out, recipe, cfg, {"base": str(base_path), "stats": stats})
    dist.barrier()
    return out
