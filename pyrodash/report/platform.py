"""The platform a run's numbers were made on: torch, CPU capability, CPU, threads (`RUN_DIR/platform.json`).

`pyrodash demo` records it as it starts (`record_platform`); every report names it (report.md's Platform line,
summary.json's `platform`), or, for a run that recorded none (`pyrodash eval`), the machine that writes the report
(`source: "report"`). Across CPU kinds float sums, hence a few answers, can differ; the verdicts should not
(docs/results.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pyrodash.world.shipped import platform

PLATFORM_FILE = "platform.json"


def current_platform(**extra) -> dict:
    """This process's `shipped.platform()` (torch, CPU capability, CPU) and torch threads, with `extra` fields; where
    `ATEN_CPU_CAPABILITY` chose the kernels (e.g. AVX2 ones on an AVX-512 CPU), `kernels_set_by` says so."""
    import torch

    chosen = {"kernels_set_by": "ATEN_CPU_CAPABILITY"} if os.environ.get("ATEN_CPU_CAPABILITY") else {}
    return {**platform(), "threads": torch.get_num_threads(), **chosen, **extra}


def record_platform(run_dir: str | Path, **extra) -> dict:
    """Write this machine's platform (`current_platform(**extra)`) as the run's; returns it."""
    info = current_platform(**extra)
    (Path(run_dir) / PLATFORM_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def run_platform(run_dir: str | Path) -> dict:
    """The run's recorded platform (`source: "run"`), else this machine's (`source: "report"`)."""
    try:
        return {**json.loads((Path(run_dir) / PLATFORM_FILE).read_text()), "source": "run"}
    except (OSError, ValueError):
        return current_platform(source="report")


def platform_line(info: dict) -> str:
    """report.md's one line on the platform."""
    workers = f", {info['workers']} worker processes" if info.get("workers") else ""
    where = "recorded by the run" if info.get("source") == "run" else "the run recorded none: the report's machine"
    chosen = f" (set by {info['kernels_set_by']})" if info.get("kernels_set_by") else ""
    return (
        f"Platform: torch {info.get('torch')}, CPU capability {info.get('cpu_capability')}{chosen}, {info.get('cpu')}, "
        f"{info.get('threads')} torch threads{workers} ({where}). On another CPU kind a few answers may differ (float "
        "sums); the verdicts should not."
    )
