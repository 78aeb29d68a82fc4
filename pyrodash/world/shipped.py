"""The base models that ship with PyroDash: the world's two pretrained models of seed 0, in `checkpoints/seed0/`.

    python scripts/ship_world.py           # build seed 0's world from scratch and ship its models

A build finds them as it finds a cached world with the same models (`build.find_models`) and copies them, saying so
(world.json `models_from`, `models_shipped`), with their measurements where they were made on the same platform and
threads (`measured_on`); `--from-scratch` trains them instead (~195 s of the quick demo on 2 cores).
`tests/test_world.py` checks they are current and, on the platform that trained them (`platform()`), that a
from-scratch build reproduces them byte for byte.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "checkpoints"


def is_shipped(world_dir: str | Path) -> bool:
    """Whether `world_dir` is one of the base-model directories that ship with PyroDash."""
    return Path(world_dir).resolve().parent == SHIPPED


def models_source(info: dict) -> str:
    """Where a built world's models come from, in words, from its world.json (`models_from`, `models_shipped`, the
    pretraining timings, which a copy carries over from where it was trained, and `measurements_from`). Every place
    that tells a user (the build, `pyrodash world info`, the demo, the report) says it this way."""
    wall = (info.get("timings") or {}).get("pretrain_wall", "?")
    measured = "; their measurements copied too (same platform)" if info.get("measurements_from") else ""
    if info.get("models_shipped"):
        return (
            f"the base models that ship with PyroDash, copied from {info['models_from']} (what a from-scratch "
            f"build of seed {info.get('seed')} trains: {wall} s of pretraining there){measured}"
        )
    if info.get("models_from"):
        return f"copied from the world at {info['models_from']} (pretrained there in {wall} s){measured}"
    return f"pretrained by its build ({wall} s)"


def platform() -> dict:
    """What bitwise reproducibility of a build depends on besides the seed and the thread count: the torch build, the
    kernels it dispatches to, and the CPU (its math libraries pick code paths by vendor and model)."""
    import platform as host

    import torch

    cpu = host.processor()
    info = Path("/proc/cpuinfo")
    if info.is_file():  # Linux: platform.processor() is often empty there
        fields = {
            k.strip(): v.strip()
            for k, v in (line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        }
        cpu = " ".join(fields.get(k, "") for k in ("vendor_id", "model name")).strip() or cpu
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": cpu}


def measured_on(info: dict) -> dict | None:
    """The platform (`platform()`) and torch threads a built world's measurements were made on, from its world.json:
    `measured_on`, or for base models shipped before builds recorded it, `shipped_from`'s platform with the build's
    threads; None when the world does not say."""
    if info.get("measured_on"):
        return info["measured_on"]
    shipped = (info.get("shipped_from") or {}).get("platform")
    return {**shipped, "threads": info.get("threads")} if shipped else None


def ship(world_dir: str | Path) -> Path:
    """Copy a from-scratch build's models and world.json (with `platform()`) to `SHIPPED/seed<N>`; its path."""
    world_dir = Path(world_dir)
    info = json.loads((world_dir / "world.json").read_text())
    if info.get("models_from"):
        raise ValueError(
            f"{world_dir}: its models were copied from {info['models_from']}; ship a world built with "
            "`pyrodash world build --from-scratch`"
        )
    dest = SHIPPED / f"seed{info['seed']}"
    shutil.rmtree(dest, ignore_errors=True)
    for m in ("slm", "llm"):
        shutil.copytree(world_dir / m, dest / m)
    (dest / "world.json").write_text(json.dumps({**info, "shipped_from": {"platform": platform()}}, indent=1) + "\n")
    return dest
