"""`--dry-run`: the plan of curation and the stages for a recipe, from the validated config alone (no model is
loaded, no world built, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pyrodash.train.config import Recipe
from pyrodash.train.paths import curated_dir, stage_dir

TRAIN_KEYS = (
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "lora_r",
    "lora_alpha",
    "lora_target_modules",
    "bf16",
)
STAGE_KEYS = {
    "stage1": ("sigma", "assistant_only_loss", "weight_decay"),
    "stage2": ("assistant_only_loss", "measure_max_new_tokens"),
    "stage3": (
        "lam",
        "cost_penalty",
        "num_generations",
        "max_completion_length",
        "loss_type",
        "beta",
        "temperature",
        "use_vllm",
        "vllm_mode",
        "source",
        "train_limit",
        "llm_max_new_tokens",
    ),
}


def plan(recipe: Recipe, out_dir: str | Path, stages: list[str], lambdas: list[float] | None = None) -> list[dict]:
    """One dict per step: what it reads, writes and with which settings."""
    world = recipe.world_dir()
    built = world is not None and (world / "world.json").exists()
    slm = recipe.slm or (f"{world}/slm" if world else None)
    llm = recipe.llm or (f"{world}/llm" if world else None)
    steps = []
    if world is not None:
        steps.append(
            {
                "step": "world",
                "dir": str(world),
                "action": "reuse" if built else "build (cached)",
                "settings": dict(recipe.world or {}),
            }
        )
    for stage in stages:
        if stage == "curate":
            c = recipe.curate
            steps.append(
                {
                    "step": "curate",
                    "reads": _curate_reads(c),
                    "writes": str(curated_dir(out_dir)),
                    "settings": {
                        "slm": slm,
                        "llm": llm,
                        "offload_count": f"{c.offload_min}-{c.offload_max}",
                        "placement": c.placement,
                        "step_sep": repr(c.step_sep),
                        "limit": c.limit,
                        "reconstruct_with_gold": c.reconstruct_with_gold,
                    },
                }
            )
            continue
        prev = {
            "stage1": f"{slm} + {curated_dir(out_dir)}/corpus_b.jsonl",
            "stage2": f"{stage_dir(out_dir, 'stage1')} + {curated_dir(out_dir)}/corpus_{{a,b}}.jsonl",
            "stage3": f"{stage_dir(out_dir, 'stage2')} + LLM {llm}",
        }[stage]
        lams = (lambdas or [recipe.stage3_lambda()]) if stage == "stage3" else [None]
        for lam in lams:
            dest = stage_dir(out_dir, stage, lam)
            cfg = recipe.stage_config(
                stage, output_dir=dest / "trainer", validate_only=True, **({"lam": lam} if lam is not None else {})
            )
            settings = {k: getattr(cfg, k) for k in TRAIN_KEYS + STAGE_KEYS[stage] if hasattr(cfg, k)}
            if stage == "stage3":
                settings["bf16"] = recipe.stage3.get("bf16", settings.get("bf16"))
            steps.append(
                {
                    "step": stage if lam is None else f"stage3 λ={lam:g}",
                    "reads": prev,
                    "writes": str(dest),
                    "settings": settings,
                }
            )
    return steps


def print_plan(recipe: Recipe, out_dir: str | Path, stages: list[str], lambdas: list[float] | None = None) -> None:
    steps = plan(recipe, out_dir, stages, lambdas)
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]plan[/]: {recipe.name} ({recipe.path}); prompts {recipe.prompts}, prices {recipe.prices}")
    world = recipe.world_dir()
    console.print(f"SLM (trained): {recipe.slm or f'{world}/slm'}; LLM (frozen): {recipe.llm or f'{world}/llm'}")
    for s in steps:
        src = s.get("reads", s.get("action", ""))
        console.print(f"[bold cyan]{s['step']}[/]: {src} -> {s.get('writes', s.get('dir', ''))}")
        for k, v in s.get("settings", {}).items():
            console.print(f"    {k} = {v}")
    console.print("config OK (dry run: nothing loaded)")


def _curate_reads(c) -> str:
    """What curation reads: the source and the held-out source, or the val it carves from the data."""
    if not c.carves_val():
        return f"{c.source} (+ held-out {c.heldout_source})"
    data = f"{c.source or ''} {c.conversations or ''}".strip()
    return f"{data} (val_share {c.val_share:g} carved into curated/val.jsonl, seed {c.val_seed})"
