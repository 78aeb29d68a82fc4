"""docs/your-models.md as written: every command of its blocks marked `<!-- runs in: tests/test_your_models.py -->`
runs through the CLI (in process) with `--dry-run` added, in page order, in a directory holding the page's YAML
files (`my-recipe.yaml`, `my-eval.yaml`, `my-eval-val.yaml`: each ```yaml block under the name the text above it
gives) and data files in the formats of docs/reference/formats.md. A dry run checks the config (keys, model specs,
data files) and prints the plan; it downloads no model and calls no provider, so the hub id and the API URLs stay as
the page writes them. The checkpoints the training steps would write are empty stand-in directories (a dry run loads
none); the page says which other tests run the same steps for real.
"""

from __future__ import annotations

import re
import shlex

import pytest
from doc_blocks import ROOT, blocks, blocks_run_by, commands

from pyrodash.cli import main

PAGE = ROOT / "docs" / "your-models.md"
DATA = {
    "data/train.jsonl": '{"id": "t1", "question": "What is 2+3?", "gold": "5"}\n',
    "data/val.jsonl": '{"unique_id": "v1", "problem": "What is 6/3?", "answer": "2"}\n',
    "data/test.jsonl": '{"unique_id": "s1", "problem": "What is 4*4?", "answer": "16"}\n',
    "data/chats.jsonl": '{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4",'
    ' "gold": "4"}]}\n',
}


def page_files() -> dict[str, str]:
    """file name -> text of each ```yaml block of the page, named by the last `my-*.yaml` the lines above it give."""
    lines, out = PAGE.read_text().splitlines(), {}
    for b in blocks(PAGE):
        if b.lang == "yaml":
            above = "\n".join(lines[max(0, b.line - 6) : b.line - 1])
            names = re.findall(r"`(my-[\w-]+\.yaml)`", above)
            assert names, f"{b.where}: the text above a yaml block names its file (`my-....yaml`)"
            out[names[-1]] = b.text
    return out


def page_commands() -> list[list[str]]:
    return [
        shlex.split(c.replace("\\\n", " "))[1:]
        for b in blocks_run_by("tests/test_your_models.py")
        for c in commands(b.text, "pyrodash ")
    ]


def test_the_page_names_its_files_and_commands():
    assert set(page_files()) == {"my-recipe.yaml", "my-eval.yaml", "my-eval-val.yaml"}
    assert [c[0] for c in page_commands()] == ["curate", "train", "train", "train", "train", "eval", "eval"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name, text in {**page_files(), **DATA}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for lam in ("0.05", "0.6", "2"):  # what `train stage3 --lambdas 0.05,0.6,2` writes (stand-ins: nothing loads them)
        (tmp_path / "runs" / "mine" / f"stage3-lambda{lam}").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_command_of_the_page_checks_its_config_and_plans(workdir, capsys):
    for argv in page_commands():
        capsys.readouterr()
        assert main([*argv, "--dry-run"]) == 0, argv
        out = capsys.readouterr().out
        llm = argv[argv.index("--llm") + 1] if "--llm" in argv else None
        if llm and argv[0] != "eval":
            assert f"LLM (frozen): {llm}" in out, (argv, out)
        if argv[0] == "eval":
            assert "math500: 1 examples" in out and (llm is None or f"llm: {llm}" in out), (argv, out)


def test_every_paper_recipe_has_its_hardware_and_time():
    """Each configs/paper/ recipe is named in the page's hardware section, with GPUs, memory and estimated hours."""
    text = PAGE.read_text()
    section = text[text.index("## Hardware and time") :]
    recipes = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs" / "paper").glob("*.yaml"))
    assert recipes and all(f"`{r}`" in section for r in recipes), recipes
    assert all(w in section for w in ("GPUs", "memory per GPU", "GPU-hours", "On one GPU")), section[:300]
