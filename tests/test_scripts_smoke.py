"""Smoke runs of every script in benchmarks/ and scripts/ and every one the docs name, on tiny settings.

    .venv/bin/pytest -q tests/test_scripts_smoke.py
    PYRODASH_DEMO_RUN=/path/to/demo .venv/bin/pytest -q tests/test_scripts_smoke.py   # a finished quick demo

A script must exit 0 and print its documented last line with every key; the numbers are not checked. Scripts that
read a demo run share the session's `quick_demo` (tests/conftest.py) unless PYRODASH_DEMO_RUN names one; those that
write into a run work on a copy. Three only parse here: `benchmarks/gateway_many_cores.sh` (>= 16 cores, wheels in
.whl/), `scripts/ship_world.py` (pretrains a world from scratch, ~3 minutes, as tests/test_world.py does, and writes
into the package) and `docs/playground_screenshot.py` (headless Chromium; skipped without chromedriver).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_script(script: str, *args, timeout: float = 300, env: dict | None = None) -> str:
    """`script`'s stdout; fails with its output's tail unless it exits 0."""
    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def last_line(text: str, keys: str) -> dict[str, str]:
    """The last line's `key=value` pairs, which must be exactly `keys` (space-separated) in order."""
    line = [x for x in text.splitlines() if x.strip()][-1]
    pairs = dict(kv.split("=", 1) for kv in line.split())
    assert list(pairs) == keys.split(), line
    return pairs


# --- scripts with their own test doubles or tiny models -------------------------------------------------------------

# tests/data/scripts_smoke.txt: one script a line, "SCRIPT ARGS... | KEYS OF ITS LAST LINE"
SCRIPTED = {
    line.split()[0]: (line.split("|")[0].split()[1:], line.split("|")[1].strip())
    for line in (ROOT / "tests" / "data" / "scripts_smoke.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


@pytest.mark.parametrize("script", list(SCRIPTED))
def test_scripted_benchmark_runs_small(script):
    args, keys = SCRIPTED[script]
    pairs = last_line(run_script(script, *args), keys)
    assert pairs.get("errors", "0") == "0"


def test_decode_loop_runs_small_and_writes_the_same_tokens(quick_world):
    """The script reads the cached quick world (`quick_world`: not built beside the background demo building it)."""
    out = run_script("benchmarks/decode_loop.py", "--batch", 2, "--runs", 1, "--max-tokens", 8)
    pairs = last_line(out, "ours_s forward_s generate_s speedup lean_speedup same_tokens")
    assert pairs["same_tokens"] == "True"


def test_world_build_schedule_runs_small():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("side by side needs 2+ cores (the script says so and exits)")
    out = run_script("benchmarks/world_build_schedule.py", "--scale", 0.001)
    last_line(out, "sequential_s side_by_side_s speedup threads scale")


def test_omp_wait_runs_small_and_computes_the_same_under_both_policies():
    """The wait policy decides who waits how, never what is computed: the same final loss either way. One thread per
    process: on two, the default policy's side-by-side run spins against the rest of the suite (70 s in one run)."""
    out = run_script("benchmarks/omp_wait.py", "--steps", 1, "--threads", 1)
    pairs = last_line(
        out,
        "side_by_side_s_default side_by_side_s_passive cpu_s_default cpu_s_passive passive_speedup alone_s_default "
        "alone_s_passive same_loss",
    )
    assert pairs["same_loss"] == "1", out


def test_suite_profile_reads_what_a_suite_run_writes(tmp_path):
    """A short suite run with PYRODASH_SUITE_PROFILE writes every test's wall and CPU-seconds (tests/conftest.py);
    the script adds them up by module."""
    out = tmp_path / "suite.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_tokens.py"]
    run = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYRODASH_SUITE_PROFILE": str(out)}
    )
    assert run.returncode == 0, run.stdout[-2000:]
    profile = json.loads(out.read_text())
    assert profile["tests"] and all(t["test"].startswith("tests/test_tokens.py::") for t in profile["tests"])
    assert all(t["cpu_s"] >= 0 and t["wall_s"] >= 0 for t in profile["tests"]) and profile["builds"] == {}
    pairs = last_line(run_script("benchmarks/suite_profile.py", out), "cpu_s builds_cpu_s tests_cpu_s wall_s floor_s")
    assert float(pairs["builds_cpu_s"]) == 0 and float(pairs["cpu_s"]) == float(pairs["tests_cpu_s"]) > 0


def test_world_economics_runs_on_the_quick_preset():
    out = run_script("scripts/world_economics.py", "--preset", "quick")
    assert re.search(r"^ALL .*oracle_cost/LLM-only=\S+$", out, re.M), out
    assert "pretraining example: mean" in out.splitlines()[-1]


def test_world_economics_runs_on_the_tool_task():
    out = run_script("scripts/world_economics.py", "--preset", "quick", "--task", "tools")
    rows = [line.split() for line in out.splitlines() if re.match(r"^t[123] ", line)]
    assert len(rows) == 3 and all(0 < float(r[4]) < 1 for r in rows), out  # the oracle is cheaper than the LLM alone


def test_many_cores_script_parses_and_names_real_flags():
    """Runs only on a machine with >= 16 cores and the wheels in .whl/: here its syntax, and every flag it passes
    to a benchmark is one that benchmark takes."""
    sh = ROOT / "benchmarks" / "gateway_many_cores.sh"
    assert subprocess.run(["bash", "-n", str(sh)], capture_output=True).returncode == 0
    text = sh.read_text()
    for script in ("gateway_overhead.py", "engine_overhead.py"):
        lines = [x for x in text.splitlines() if f"benchmarks/{script}" in x and not x.lstrip().startswith("#")]
        flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", " ".join(lines)))
        assert flags, script
        helptext = run_script(f"benchmarks/{script}", "--help")
        assert {f for f in flags if f not in helptext} == set(), script


def test_render_docs_checks_the_tree_and_names_its_pages():
    last_line(run_script("scripts/render_docs.py", "--check"), "checked stale")
    assert "docs/reference/cli.md" in run_script("scripts/doc_reference.py").split()


def test_ship_world_parses():
    """Pretrains a world from scratch (~3 minutes) and writes into pyrodash/world/checkpoints: --help only."""
    assert "--seed" in run_script("scripts/ship_world.py", "--help")


def test_playground_screenshot_parses():
    """docs/playground_screenshot.py drives headless Chromium (/usr/bin/chromedriver) against a running server:
    its --help here; the screenshots need that browser."""
    if shutil.which("chromedriver") is None and not Path("/usr/bin/chromedriver").exists():
        pytest.skip("no chromedriver: docs/playground_screenshot.py needs headless Chromium")
    assert "--compare-out" in run_script("docs/playground_screenshot.py", "--help")


# --- scripts that read a finished quick demo ------------------------------------------------------------------------


@pytest.fixture(scope="session")  # (a path: any worker's tests read it, not one module's)
def demo_run(request) -> Path:
    given = os.environ.get("PYRODASH_DEMO_RUN")
    return Path(given) if given else request.getfixturevalue("quick_demo")


def _resolved(run: Path) -> dict:
    return json.loads((run / "config.resolved.json").read_text())


def test_turn_tables_reads_the_demo(demo_run):
    out = run_script("scripts/turn_tables.py", demo_run)
    assert f"## {demo_run}" in out and "check, single questions" in out


def test_request_breakdown_on_the_demos_models(demo_run):
    cfg = _resolved(demo_run)
    slm = next(iter(cfg["models"]["pyrodash"].values()))
    args = ["--slm", slm, "--llm", cfg["models"]["llm"], "--world", cfg["world_dir"], "--n", 2, "--max-tokens", 16]
    keys = "n handoff_rate slm_ms_p50 handoff_ms_p50 llm_ms_p50 slm_ms_per_token llm_ms_per_token slm_in_mean"
    keys += " slm_tokens_mean llm_in_mean llm_out_mean total_ms_p50"
    pairs = last_line(run_script("benchmarks/request_breakdown.py", *args, env={"OMP_NUM_THREADS": "1"}), keys)
    assert pairs["n"] == "2"


def test_cost_penalty_ablation_small(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("ablation-direct", "cost_penalty.json"))
    out = run_script("benchmarks/cost_penalty_ablation.py", "--run", run, "--points", 1, "--limit", 2, "--max-steps", 1)
    assert out.splitlines()[-1].startswith("matched: normalized λ")
    saved = json.loads((run / "cost_penalty.json").read_text())
    assert len(saved["normalized"]) == 1 and saved["direct"] and saved["matched"]


def test_phase_times_quick_against_this_checkout(demo_run):
    out = run_script(
        "benchmarks/phase_times.py", "--base", ROOT, "--run", demo_run, "--repeats", 1, "--quick", timeout=600
    )
    tail = out.splitlines()[-2:]
    assert [x.split(":")[0] for x in tail] == ["evaluation", "stage3"], out
    assert all(re.search(r"this=\S+s base=\S+s ratio=\S+$", x) for x in tail), tail


def test_demo_profile_reads_the_demo(demo_run):
    """Every step of the demo's graph is a row; Stage 2 and the world are on the critical path, which is no longer
    than every step's seconds added up."""
    out = run_script("benchmarks/demo_profile.py", demo_run)
    pairs = last_line(out, "steps critical_s critical_steps sum_s wall_s")
    steps = json.loads((demo_run / "jobs" / "steps.json").read_text())["steps"]
    assert int(pairs["steps"]) == len(steps) > 0
    rows = {x.split("  ")[0].strip(): x for x in out.splitlines()[1:-1]}
    assert {s["name"] for s in steps} <= set(rows)
    assert 0 < float(pairs["critical_s"]) <= float(pairs["sum_s"])


def test_budget_pacer_on_a_short_profile(demo_run):
    args = ["--run", demo_run, "--profile", "1", "--hour-s", 4, "--burst", "", "--base-rps", 1]
    out = run_script("benchmarks/budget_pacer.py", *args, timeout=400)
    last_line(out, "window_err_p90 total_err cap_exceeded acc static_acc_same_spend")


def test_the_demos_resolved_configs_are_accepted_back(demo_run):
    """`pyrodash eval|train|curate --config` take the resolved configs the demo wrote (checked, nothing run)."""
    from pyrodash.cli import main

    assert main(["eval", "--config", str(demo_run / "config.resolved.json"), "--dry-run"]) == 0
    out = str(demo_run / "rerun")
    stage3 = sorted(demo_run.glob("stage3-lambda*"))[0]
    for args in (
        ["curate", "--config", str(demo_run / "curated" / "config.resolved.json")],
        ["train", "stage1", "--config", str(demo_run / "stage1" / "config.resolved.json")],
        ["train", "stage2", "--config", str(demo_run / "stage2" / "config.resolved.json")],
        ["train", "stage3", "--config", str(stage3 / "config.resolved.json")],
    ):
        assert main([*args, "--output-dir", out, "--dry-run"]) == 0, args


# --- every script has its smoke test --------------------------------------------------------------------------------

COVERED = {
    *SCRIPTED,
    "benchmarks/decode_loop.py",
    "benchmarks/world_build_schedule.py",
    "benchmarks/gateway_many_cores.sh",
    "benchmarks/request_breakdown.py",
    "benchmarks/cost_penalty_ablation.py",
    "benchmarks/phase_times.py",
    "benchmarks/budget_pacer.py",
    "benchmarks/demo_profile.py",
    "benchmarks/omp_wait.py",
    "benchmarks/suite_profile.py",
    "scripts/world_economics.py",
    "scripts/ship_world.py",
    "scripts/turn_tables.py",
    "scripts/render_docs.py",
    "scripts/doc_reference.py",
    "docs/playground_screenshot.py",
}


def test_every_script_has_a_smoke_test():
    scripts = {str(p.relative_to(ROOT)) for d in ("benchmarks", "scripts") for p in (ROOT / d).glob("*.[ps][yh]")}
    named = set(re.findall(r"\b((?:benchmarks|scripts|docs)/\w+\.(?:py|sh))\b", _docs_text()))
    assert scripts | named == COVERED


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
