"""The console stays readable: library log records and warnings go to a log file (the demo's DIR/demo.log; `curate`,
`train` and `eval`'s DIR/<command>.log), not to the terminal."""

from __future__ import annotations

import logging
import warnings


def test_library_noise_goes_to_the_log_file(tmp_path, capsys):
    from pyrodash.jobs.library_log import library_log

    log = tmp_path / "demo.log"
    with library_log(log):
        warnings.warn("`foo` is deprecated", FutureWarning, stacklevel=1)
        logging.getLogger("transformers.trainer").warning("{'loss': 1.23, 'grad_norm': 0.5}")
        logging.getLogger("trl").info("ignored below WARNING by default")
    out = capsys.readouterr()
    text = log.read_text()
    assert "FutureWarning" in text and "`foo` is deprecated" in text and "'loss': 1.23" in text
    assert "deprecated" not in out.out + out.err and "loss" not in out.out + out.err
    # restored afterwards: warnings reach the console again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["after"]


def test_the_log_file_and_its_directory_appear_with_the_first_record(tmp_path):
    """A command that stops before any library speaks (a config error) leaves no directory behind."""
    from pyrodash.jobs.library_log import library_log

    log = tmp_path / "run" / "eval.log"
    with library_log(log, lazy=True):
        pass
    assert not (tmp_path / "run").exists()
    with library_log(log, lazy=True):
        warnings.warn("noise", FutureWarning, stacklevel=1)
    assert "noise" in log.read_text()


def test_cli_commands_send_library_noise_to_their_log(tmp_path, monkeypatch):
    """`pyrodash eval` runs the evaluation inside `library_log(<run dir>/eval.log)` (so do `curate` and `train`)."""
    from pyrodash.cli import main
    from pyrodash.commands import eval as eval_cmd

    def noisy(cfg):  # stands in for an evaluation whose libraries warn, then stops the command
        warnings.warn("a library's deprecation", FutureWarning, stacklevel=1)
        raise ValueError("stopped here")

    monkeypatch.setattr(eval_cmd, "evaluate", noisy)
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        '{"run_dir": "%s", "benchmarks": ["aime24"], "methods": ["slm"], "models": {"slm": "x"}}' % (tmp_path / "run")
    )
    assert main(["eval", "--config", str(cfg)]) == 2
    assert "a library's deprecation" in (tmp_path / "run" / "eval.log").read_text()
