"""The CLI: every command listed with help, lazy imports, and each command taking back the resolved config it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from pyrodash.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_every_existing_command(capsys):
    parser = build_parser()
    listed = set(parser._subparsers._group_actions[0].choices)  # the subcommands argparse knows
    assert "cost" in listed
    assert listed <= set(COMMANDS)
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in listed:
        assert name in out


def test_every_subcommand_has_help_and_no_placeholder(capsys):
    """In this process (one interpreter for all: a subprocess each cost ~2 s of imports)."""
    for name in build_parser()._subparsers._group_actions[0].choices:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        out = capsys.readouterr()
        assert exit_.value.code == 0, out.err
        assert f"usage: pyrodash {name}" in out.out and "not implemented" not in (out.out + out.err).lower()


def test_unknown_command_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "pyrodash.cli", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_only_the_command_run_is_imported():
    """Command modules import what they need at their top; the CLI imports just the one being run, so `pyrodash cost`
    (or `pyrodash --help`) never pays for TRL or torch."""
    code = (
        "import sys\nfrom pyrodash.cli import main\nmain(['cost', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('pyrodash.commands.')), 'trl' in sys.modules, "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['pyrodash.commands.cost'] False False"


def _gsm8k_file(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"s\n#### {i}"} for i in range(3)]
    f = tmp_path / "gsm.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_eval_takes_back_its_resolved_config(tmp_path, capsys):
    """`pyrodash eval --config RUN/config.resolved.json` is accepted: the same config comes back (the sheet's name
    while it resolves to the run's prices, else those numbers), the dry run checks it against the run's records, and
    a second run resolves to the same file."""
    from pyrodash.eval.harness import EvalConfig, evaluate

    run = tmp_path / "run"
    cfg = EvalConfig(run_dir=str(run), benchmarks=["gsm8k"], benchmark_paths={"gsm8k": str(_gsm8k_file(tmp_path))})
    evaluate(cfg, methods={}, quiet=True)
    resolved = run / "config.resolved.json"
    first = resolved.read_text()
    assert json.loads(first)["prices_sheet"] == "paper" and isinstance(json.loads(first)["prices"], dict)
    again = EvalConfig.from_yaml(resolved)
    assert asdict(again) == asdict(cfg)
    assert main(["eval", "--config", str(resolved), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k: 3 examples" in out and "config OK" in out
    evaluate(again, methods={}, quiet=True)
    assert resolved.read_text() == first
    edited = json.loads(first)
    edited["prices"]["llm_out"] = 99.0  # numbers that are no longer the sheet's: the run's numbers win
    resolved.write_text(json.dumps(edited))
    assert EvalConfig.from_yaml(resolved).price_sheet().llm_out == 99.0


def test_eval_prices_sheet_without_resolved_prices_is_a_clear_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run_dir: {tmp_path / 'r'}\nbenchmarks: [gsm8k]\nprices_sheet: paper\n")
    assert main(["eval", "--config", str(cfg), "--dry-run"]) != 0
    err = capsys.readouterr().err
    assert "prices_sheet" in err and "Traceback" not in err


@pytest.mark.parametrize(("command", "stage"), [("train", "stage1"), ("train", "stage3"), ("curate", None)])
def test_train_and_curate_take_back_a_checkpoints_resolved_config(tmp_path, command, stage):
    from pyrodash.train.config import load_recipe, save_resolved

    recipe = load_recipe(ROOT / "configs" / "world" / "quick.yaml")
    path = save_resolved(tmp_path / "ckpt", recipe, None, {"stats": {"examples": 1}})
    assert load_recipe(path).to_dict() == recipe.to_dict()
    args = [command, *([stage] if stage else []), "--config", str(path), "--output-dir", str(tmp_path / "o")]
    assert main([*args, "--dry-run"]) == 0


def test_a_failed_step_is_one_line_that_says_the_finished_ones_are_kept(monkeypatch, capsys):
    """A step that fails in the demo's scheduler (an injected fault: the command's `run` raises what `run_jobs` raises)
    is one line naming the step and its log, exit code 1, no traceback; it says a rerun resumes."""
    import pyrodash.commands.demo as demo
    from pyrodash.jobs.scheduler import StepFailed

    def failing(args):
        raise StepFailed("a step failed: stage2: ValueError: boom (log: runs/x/jobs/stage2.log)")

    monkeypatch.setattr(demo, "run", failing)
    monkeypatch.delenv("PYRODASH_DEBUG", raising=False)
    assert main(["demo", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "stage2: ValueError: boom (log: runs/x/jobs/stage2.log)" in err and "run it again to resume" in err
