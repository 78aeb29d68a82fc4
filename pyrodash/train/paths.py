"""Where a recipe's inputs and each stage's outputs live.

    DIR/curated/  DIR/stage1/  DIR/stage2/  DIR/stage3-lambda<λ>/      (stage N reads stage N-1 from DIR)

A world recipe names the world directory (or quick/full + seed); it is built (cached) when missing.
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


def resolve_world(recipe: Recipe, build: bool = True) -> Path | None:
    """The recipe's world directory, built (cached) when it is missing and `build` is set."""
    wdir = recipe.world_dir()
    if wdir is None:
        return None
    if not build:
        return wdir
    from pyrodash.world.build import build_world

    w = recipe.world or {}
    if (wdir / "world.json").exists() and w.get("dir"):
        return wdir  # a named, built world is used as it is (whatever preset built it)
    return build_world(wdir, quick=bool(w.get("quick", False)), seed=int(w.get("seed", 0)))


def slm_spec(recipe: Recipe, build: bool = True) -> str:
    return _model_spec(recipe, "slm", build)


def llm_spec(recipe: Recipe, build: bool = True) -> Any:
    return _model_spec(recipe, "llm", build)


def _model_spec(recipe: Recipe, role: str, build: bool) -> Any:
    """The recipe's own `slm`/`llm` backend spec, else that model of the recipe's world (built if missing)."""
    if getattr(recipe, role):
        return getattr(recipe, role)
    wdir = resolve_world(recipe, build=build)
    if wdir is None:
        raise ValueError(f"the recipe names no `{role}` and no `world`")
    return str(wdir / role)


def require(path: Path, what: str, hint: str) -> Path:
    if not path.exists():
        raise ValueError(f"{what} not found at {path}; {hint}")
    return path
