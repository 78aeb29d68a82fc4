"""The command line is what the docs say it is.

- `--llm URL#model` works in `curate`, `train` and `eval` as in `serve` and `generate`: it replaces the LLM of the
  recipe or eval config (`pyrodash.backends.http.endpoint.llm_from_flags`), and `--llm-mode` applies to it;
- every `--flag` the README and docs/ quote after `pyrodash <command>` (in shell blocks and inline code) is in that
  command's `--help`;
- every `configs/...yaml` they name exists, every eval config they show loads, and every `curate.X` / `stageN.X` /
  `limits.X` / `failure.X` key they name is a field of its schema.
"""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT, doc_files

from pyrodash.cli import COMMANDS, build_parser, main

URL = "https://api.openai.com/v1#gpt-5-mini"


@pytest.mark.parametrize("command", [["curate"], ["train", "stage3"]])
def test_llm_replaces_the_recipes_llm(command, tmp_path, capsys):
    args = [*command, "--config", "configs/world/quick.yaml", "--output-dir", str(tmp_path), "--dry-run"]
    assert main([*args, "--llm", URL]) == 0
    assert f"LLM (frozen): {URL}" in capsys.readouterr().out
    assert main(args) == 0
    assert re.search(r"LLM \(frozen\): \S+/llm\n", capsys.readouterr().out)


def test_llm_mode_sets_the_mode_of_the_llm_given_on_the_command_line(tmp_path, capsys):
    args = ["curate", "--config", "configs/world/quick.yaml", "--output-dir", str(tmp_path), "--dry-run"]
    assert main([*args, "--llm", URL, "--llm-mode", "instruct"]) == 0
    assert "'model': 'gpt-5-mini', 'mode': 'instruct'" in capsys.readouterr().out
    assert main([*args, "--llm-mode", "instruct"]) == 2  # the world's LLM runs in process: no mode to set
    assert "is a local model" in capsys.readouterr().err


def test_eval_llm_replaces_the_configs_llm(tmp_path, capsys):
    (tmp_path / "val.jsonl").write_text('{"id": "q1", "problem": "What is 2+3?", "answer": "5"}\n')
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        f"run_dir: {tmp_path / 'run'}\nbenchmarks: [math500]\nbenchmark_paths: {{math500: {tmp_path / 'val.jsonl'}}}\n"
        "methods: [llm]\nmodels: {slm: 'http://127.0.0.1:9/v1#slm', llm: 'http://127.0.0.1:9/v1#llm'}\n"
    )
    assert main(["eval", "--config", str(cfg), "--llm", URL, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"llm: {URL}" in out and "math500: 1 examples" in out


COMMAND = re.compile(r"(?<![\w/.-])(?<!import )(?<!from )pyrodash ([a-z][\w-]*)((?:[^`|&;#\n]|\\\n)*)")


def quoted_commands() -> list[tuple[str, str, str]]:
    """(where, command, its flags text) of every `pyrodash <command> ...` the docs quote."""
    out = []
    for path in doc_files():
        for n, line in enumerate(path.read_text().replace("\\\n", " ").splitlines(), 1):
            for m in COMMAND.finditer(line):
                out.append((f"{path.relative_to(ROOT)}:{n}", m.group(1), m.group(2)))
    return out


def options(command: str, words: list[str]) -> set[str]:
    """The option strings of `pyrodash command` (and of its sub-command when the next word names one)."""
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    nested = [a for a in sub._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    if nested and words and words[0] in nested[0].choices:
        sub = nested[0].choices[words[0]]
    return {o for a in sub._actions for o in a.option_strings}


def test_the_docs_quote_commands():
    assert len(quoted_commands()) > 50


def test_every_flag_the_docs_quote_is_in_that_commands_help():
    bad = []
    for where, command, rest in quoted_commands():
        if command not in COMMANDS:
            bad.append(f"{where}: pyrodash {command}: no such command")
            continue
        flags = {f.split("=")[0] for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)}
        missing = sorted(flags - options(command, rest.split()))
        if missing:
            bad.append(f"{where}: pyrodash {command} has no {', '.join(missing)}")
    assert not bad, "\n".join(bad)


def test_every_config_file_the_docs_name_exists():
    named = {n for p in doc_files() for n in re.findall(r"\b(configs/[\w./-]+\.ya?ml)\b", p.read_text())}
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert named and not missing, missing


def test_every_eval_config_the_docs_show_has_only_known_keys():
    """A ```yaml block with a `run_dir:` is an eval config: it must build an EvalConfig (keys, types)."""
    import yaml
    from doc_blocks import blocks

    from pyrodash.eval.harness import EvalConfig

    shown = [b for p in doc_files() for b in blocks(p) if b.lang == "yaml" and re.search(r"^run_dir:", b.text, re.M)]
    assert shown
    for b in shown:
        EvalConfig(**yaml.safe_load(b.text))


def test_every_config_key_the_docs_name_is_a_field():
    """`curate.X`, `stageN.X` (PyroDash's fields and TRL's), `limits.X` and `failure.X` named in the docs exist."""
    from dataclasses import fields

    from pyrodash.backends.retry import FailurePolicy
    from pyrodash.server.config import Limits
    from pyrodash.train.config import CurateConfig, Stage1Config, Stage2Config, Stage3Config

    schemas = {"curate": CurateConfig, "stage1": Stage1Config, "stage2": Stage2Config, "stage3": Stage3Config}
    schemas |= {"limits": Limits, "failure": FailurePolicy}
    named = {
        (m.group(1), m.group(2), p.name)
        for p in doc_files()
        for m in re.finditer(r"\b(curate|stage[123]|limits|failure)\.([a-z_]+)\b(?!\.)", p.read_text())
        if m.group(2) not in ("py", "log")  # curate.py, stage3.py: modules; curate.log: a file
    }
    missing = sorted(f"{page}: {s}.{k}" for s, k, page in named if k not in {f.name for f in fields(schemas[s])})
    assert len(named) > 10 and not missing, missing
