"""World pretraining schedule: the two models one after the other vs side by side (the build's default).

    .venv/bin/python benchmarks/world_build_schedule.py [--preset quick] [--scale 0.25]

Runs `pyrodash.world.build.train_models` twice on the preset's config with every step count (both models' steps and
`llm_beside_slm_steps`) scaled by `--scale`: once one model after the other on all the build's threads, once side by
side (the SLM in a second process on 1 thread, the LLM on the other threads until its `llm_beside_slm_steps`-th step,
then on all). Needs 2+ cores. The last line is machine-readable:
`sequential_s=<a> side_by_side_s=<b> speedup=<a/b> threads=<n> scale=<s>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from rich.progress import Progress  # noqa: E402

from pyrodash.world.build import build_threads, train_models  # noqa: E402
from pyrodash.world.config import WorldConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--scale", type=float, default=0.25, help="fraction of the preset's pretraining steps")
    args = ap.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars between ours
    n = build_threads()
    if n < 2:
        sys.exit("side by side needs 2+ cores; this machine has 1")
    base = WorldConfig.from_preset(args.preset)
    steps = lambda k: max(1, round(k * args.scale))  # noqa: E731
    cfg = replace(
        base,
        slm=replace(base.slm, train_steps=steps(base.slm.train_steps)),
        llm=replace(base.llm, train_steps=steps(base.llm.train_steps)),
        llm_beside_slm_steps=steps(base.llm_beside_slm_steps),
    )
    torch.set_num_threads(n)
    seconds = {}
    for name, side in (("sequential", False), ("side_by_side", True)):
        with tempfile.TemporaryDirectory() as d, Progress() as progress:
            t = time.perf_counter()
            train_models(Path(d), cfg, 0, progress, side_by_side=side)
            seconds[name] = time.perf_counter() - t
        print(f"{name}: {seconds[name]:.1f} s (SLM {cfg.slm.train_steps} + LLM {cfg.llm.train_steps} steps)")
    print(
        f"sequential_s={seconds['sequential']:.1f} side_by_side_s={seconds['side_by_side']:.1f} "
        f"speedup={seconds['sequential'] / seconds['side_by_side']:.2f} threads={n} scale={args.scale}"
    )


if __name__ == "__main__":
    main()
