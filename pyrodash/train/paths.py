"""Where a recipe's inputs and each stage's outputs live.

    DIR/curated/  DIR/stage1/  DIR/stage2/  DIR/stage3-lambda<λ>/      (stage N reads stage N-1 from DIR)

A world recipe names the world directory (or quick/full + seed: the world's cache directory). Training only resolves
it: a missing world is a one-line error naming `pyrodash world build`; the commands (`pyrodash curate`, `pyrodash
train`) build it first (`pyrodash.world.build.build_named_world`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyrodash.train.config import Recipe


def curated_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "curated"


def stage_dir(out_dir: str | Path, stage: str, lam: float | None = None) -> Path:
    if stage == "stage3":
        if lam is None:
            raise ValueError("stage3 needs lambda to name its directory")
        return Path(out_dir) / f"stage3-lambda{lam:g}"
    return Path(out_dir) / stage


def world_build_command(recipe: Recipe) -> str:
    """The `pyrodash world build` command line that builds the recipe's world where the recipe looks for it."""
    w = recipe.world or {}
    flags = " --quick" if w.get("quick") else ""
    flags += f" --seed {int(w.get('seed', 0))}" if w.get("seed") else ""
    return f"pyrodash world build{flags}" + (f" --out {w['dir']}" if w.get("dir") else "")


def resolve_world(recipe: Recipe) -> Path | None:
    """The recipe's built world directory (None for a recipe without `world:`); never builds one."""
    wdir = recipe.world_dir()
    if wdir is None:
        return None
    if not (wdir / "world.json").exists():
        raise ValueError(
            f"the recipe's world is not built ({wdir} has no world.json); build it with `{world_build_command(recipe)}`"
        )
    return wdir


def slm_spec(recipe: Recipe) -> str:
    return _model_spec(recipe, "slm")


def llm_spec(recipe: Recipe) -> Any:
    return _model_spec(recipe, "llm")


def _model_spec(recipe: Recipe, role: str) -> Any:
    """The recipe's own `slm`/`llm` backend spec, else that model of the recipe's (built) world."""
    if getattr(recipe, role):
        return getattr(recipe, role)
    wdir = resolve_world(recipe)
    if wdir is None:
        raise ValueError(f"the recipe names no `{role}` and no `world`")
    return str(wdir / role)


def require(path: Path, what: str, hint: str) -> Path:
    if not path.exists():
        raise ValueError(f"{what} not found at {path}; {hint}")
    return path
