"""docs/your-models.md, run: every command of its blocks marked `<!-- runs in: tests/test_your_models.py -->`, in
page order, in a directory holding the page's YAML files (`my-recipe.yaml`, `my-eval.yaml`, `my-eval-val.yaml`,
`serve.yaml`: each ```yaml block under the name the text above it gives) and data files in the formats of
docs/reference/formats.md.

- `test_every_command_of_the_page_checks_its_config_and_plans` (fast): the commands that take `--dry-run` (curate,
  train, eval), as written, with `--dry-run` added: the hub id and the API URLs stay the page's; nothing is loaded.
- `test_the_page_runs_end_to_end_on_the_worlds_models` (slow: it builds the world when none is cached; then well
  under a minute on 2 cores, torch on one thread): every command for real. What stands in for the user's models and
  providers is swapped in the page's text (`stand_ins`): the built-in world's SLM for `Qwen/Qwen3.5-4B` with the
  world's prompts, and TEST DOUBLES of the OpenAI and DeepSeek APIs (tests/provider_doubles.py, serving the world's
  LLM on 127.0.0.1) for api.openai.com and api.deepseek.com, their key in OPENAI_API_KEY (the variable of a URL
  that is not a provider's host). The recipe's and eval config's sizes shrink (`TINY`: steps, token lengths, batch
  sizes, learning rates; curation does not show the world's LLM the gold); `pyrodash serve` gets a free `--port` and
  the page's `curl` goes there; `less` reads the file. The data: world questions and chats in the page's formats.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
import yaml
from doc_blocks import ROOT, blocks, blocks_run_by, commands

from pyrodash.cli import main

PAGE = ROOT / "docs" / "your-models.md"
DRY_RUN = ("curate", "train", "eval")  # the commands that take --dry-run
DATA = {  # the page's formats, one row each (the dry run reads them; the real run writes world data instead)
    "data/train.jsonl": '{"id": "t1", "question": "What is 2+3?", "gold": "5"}\n',
    "data/test.jsonl": '{"unique_id": "s1", "problem": "What is 4*4?", "answer": "16"}\n',
    "data/chats.jsonl": '{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4",'
    ' "gold": "4"}]}\n',
    "runs/mine/curated/val.jsonl": '{"id": "v1", "problem": "What is 6/3?", "answer": "2"}\n',  # curate writes it
}


def page_files() -> dict[str, str]:
    """file name -> text of each ```yaml block of the page, named by the last `my-*.yaml` or `serve.yaml` the lines
    above it give."""
    lines, out = PAGE.read_text().splitlines(), {}
    for b in blocks(PAGE):
        if b.lang == "yaml":
            above = "\n".join(lines[max(0, b.line - 6) : b.line - 1])
            names = re.findall(r"`((?:my-[\w-]+|serve)\.yaml)`", above)
            assert names, f"{b.where}: the text above a yaml block names its file (`my-....yaml`, `serve.yaml`)"
            out[names[-1]] = b.text
    return out


def page_steps() -> list[str]:
    """The lines of the marked blocks, in page order: the `pyrodash` commands and the `curl` and `less` lines."""
    return [
        c.replace("\\\n", " ")
        for b in blocks_run_by("tests/test_your_models.py")
        for c in commands(b.text, "")
        if c.strip()
    ]


def page_commands() -> list[list[str]]:
    return [shlex.split(s)[1:] for s in page_steps() if s.startswith("pyrodash ")]


def test_the_page_names_its_files_and_commands():
    assert set(page_files()) == {"my-recipe.yaml", "my-eval.yaml", "my-eval-val.yaml", "serve.yaml"}
    kinds = ["curate", *["train"] * 4, "eval", "eval", "select", "serve", "report", "report"]
    assert [c[0] for c in page_commands()] == kinds
    assert [s.split()[0] for s in page_steps() if not s.startswith("pyrodash ")] == ["curl", "less"]


def _write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    _write(tmp_path, {**page_files(), **DATA})
    for lam in ("0.05", "0.6", "2"):  # what `train stage3 --lambdas 0.05,0.6,2` writes (stand-ins: nothing loads them)
        (tmp_path / "runs" / "mine" / f"stage3-lambda{lam}").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_command_of_the_page_checks_its_config_and_plans(workdir, capsys):
    for argv in (c for c in page_commands() if c[0] in DRY_RUN):
        capsys.readouterr()
        assert main([*argv, "--dry-run"]) == 0, argv
        out = capsys.readouterr().out
        llm = argv[argv.index("--llm") + 1] if "--llm" in argv else None
        if llm and argv[0] != "eval":
            assert f"LLM (frozen): {llm}" in out, (argv, out)
        if argv[0] == "curate":
            assert "val_share 0.2 carved into curated/val.jsonl" in out, out
        if argv[0] == "eval":
            assert "math500: 1 examples" in out and (llm is None or f"llm: {llm}" in out), (argv, out)


def test_every_paper_recipe_has_its_hardware_and_time():
    """Each configs/paper/ recipe is named in the page's hardware section, with GPUs, memory and estimated hours."""
    text = PAGE.read_text()
    section = text[text.index("## Hardware and time") :]
    recipes = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs" / "paper").glob("*.yaml"))
    assert recipes and all(f"`{r}`" in section for r in recipes), recipes
    assert all(w in section for w in ("GPUs", "memory per GPU", "GPU-hours", "On one GPU")), section[:300]


# ---- the real run ------------------------------------------------------------------------------------------------

# one key for both doubles: on 127.0.0.1 a URL's key is read from OPENAI_API_KEY (`default_key_env` picks
# DEEPSEEK_API_KEY by the host api.deepseek.com, checked below)
OPENAI_KEY = DEEPSEEK_KEY = "sk-double-0123456789abcdef"
TRAIN = {"max_steps": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 1024,
         "bf16": False, "gradient_checkpointing": False, "learning_rate": 1.0e-4, "logging_steps": 1}  # fmt: skip
N_TEST = 3
# fmt: off
TINY = {  # the sizes of the page's recipe and eval configs, shrunk; every other key stays the page's
    "my-recipe.yaml": {
        # the world's LLM reads no English: it solves a hard question instead of rewriting towards the gold
        "curate": {"limit": None, "slm_max_new_tokens": 300, "llm_max_new_tokens": 300, "llm_concurrency": 4,
                   "heldout_limit": 2, "reconstruct_with_gold": False},
        "stage1": TRAIN,
        "stage2": {**TRAIN, "measure_limit": 2},
        "stage3": {"train_offset": 0, "train_limit": 2, "max_steps": 1, "num_generations": 2,
                   "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "max_completion_length": 300,
                   "llm_max_new_tokens": 300, "learning_rate": 1.0e-5, "bf16": False,
                   "gradient_checkpointing": False, "logging_steps": 1, "use_vllm": False},
    },
    "my-eval.yaml": {"max_tokens": 300},
    "my-eval-val.yaml": {"max_tokens": 300},
}
# fmt: on


def stand_ins(world, openai_url: str, deepseek_url: str, port: int) -> dict[str, str]:
    """What the page names -> what runs here: the world's SLM and prompts, the provider doubles, the server's port."""
    return {"Qwen/Qwen3.5-4B": str(world / "slm"), "qwen-math-v1": "world-v1", "https://api.openai.com/v1":
            openai_url, "https://api.deepseek.com/beta": deepseek_url,
            "localhost:8000": f"127.0.0.1:{port}"}  # fmt: skip


def _swapped(text: str, subs: dict[str, str]) -> str:
    for a, b in subs.items():
        text = text.replace(a, b)
    return text


def _merged(base: dict, over: dict) -> dict:
    return {**base, **{k: _merged(base.get(k) or {}, v) if isinstance(v, dict) else v for k, v in over.items()}}


def world_data(world) -> dict[str, str]:
    """The user's data in the page's formats, from the world: 8 training questions, 3 two-turn chats (its solutions
    as the answers), N_TEST test problems."""
    rows = [json.loads(x) for x in (world / "data" / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (world / "data" / "tier1.jsonl").read_text().splitlines()[:N_TEST]]
    chats = [[m for r in rows[8 + 2 * c : 10 + 2 * c] for m in ({"role": "user", "content": r["question"]},
              {"role": "assistant", "content": r["meta"]["solution"]})] for c in range(3)]  # fmt: skip
    line = lambda d: json.dumps(d) + "\n"  # noqa: E731
    return {
        "data/train.jsonl": "".join(line({"question": r["question"], "gold": r["gold"]}) for r in rows[:8]),
        "data/chats.jsonl": "".join(line({"messages": m}) for m in chats),
        "data/test.jsonl": "".join(
            line({"unique_id": r["id"], "problem": r["question"], "answer": r["gold"]}) for r in test
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def doubles():
    """TEST DOUBLES of the OpenAI and DeepSeek APIs on 127.0.0.1, the world's LLM behind both: (world, urls)."""
    from provider_doubles import deepseek_double, openai_double

    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.server.model_server import serve_in_thread
    from pyrodash.world.build import build_world

    world = build_world(quick=True, seed=0, verbose=False)
    llm = HFBackend(str(world / "llm"), name="world-llm")
    with (
        serve_in_thread(openai_double(llm, model="gpt-5-mini", key=OPENAI_KEY)) as openai_url,
        serve_in_thread(deepseek_double(llm, model="deepseek-chat", key=DEEPSEEK_KEY)) as deepseek_url,
    ):
        yield world, openai_url, deepseek_url


def _serve(argv: list[str], port: int, cwd, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pyrodash.cli", *argv, "--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def one_thread(monkeypatch):
    """torch on one thread, in this process and the server's, as each of the demo's jobs runs: the world's tiny
    models spend a second thread on synchronisation rather than arithmetic, most of all on shared cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_the_page_runs_end_to_end_on_the_worlds_models(one_thread, doubles, tmp_path, monkeypatch, capsys):
    import httpx
    from servers import free_port, stop, wait_healthy

    from pyrodash.backends.http.endpoint import default_key_env

    assert default_key_env("https://api.deepseek.com/beta", "auto") == "DEEPSEEK_API_KEY"  # the page's key variable
    world, openai_url, deepseek_url = doubles
    t0, port = time.perf_counter(), free_port()
    subs = stand_ins(world, openai_url, deepseek_url, port)
    files = {n: _swapped(t, subs) for n, t in page_files().items()}
    for name, over in TINY.items():
        files[name] = yaml.safe_dump(_merged(yaml.safe_load(files[name]), over), sort_keys=False)
    _write(tmp_path, {**files, **world_data(world)})
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # `--prices configs/prices/cached.yaml`, as in a checkout
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("DEEPSEEK_API_KEY", DEEPSEEK_KEY)
    seen: dict[str, str] = {}
    for step in (_swapped(s, subs) for s in page_steps()):
        argv = shlex.split(step)
        with capsys.disabled():
            print(f"{time.perf_counter() - t0:6.1f}s  {step}", flush=True)
        capsys.readouterr()
        if argv[0] == "pyrodash" and argv[1] == "serve":
            env = {**os.environ, "PYRODASH_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
            server = _serve(argv[1:], port, tmp_path, env)
            wait_healthy(f"http://127.0.0.1:{port}", server, "pyrodash serve", timeout=300)
            continue
        if argv[0] == "curl":
            seen["budget"] = httpx.get("http://" + argv[-1], timeout=30).json()
            continue
        if argv[0] == "less":
            seen["report"] = (tmp_path / argv[1]).read_text()
            continue
        assert main(argv[1:]) == 0, step
        seen[" ".join(argv[1:3])] = capsys.readouterr().out
    stop(server)
    check_the_run(tmp_path, seen)


def check_the_run(root, seen: dict[str, str]) -> None:
    """What each step of the page left, as the page says it."""
    run = root / "runs" / "mine"
    stats = json.loads((run / "curated" / "stats.json").read_text())
    val = [json.loads(x) for x in (run / "curated" / "val.jsonl").read_text().splitlines()]
    assert stats["val"]["carved"] and stats["val"]["val"] == len(val) > 0 and stats["examples"] == stats["val"]["train"]
    assert f"val: {len(val)} of" in seen["curate --config"] and "kept out of training" in seen["curate --config"]
    assert stats["hard_kept"] > 0 and stats["corpus_b_hard"] > 0 and stats["llm_calls"] > 0
    for stage in ("stage1", "stage2", "stage3-lambda0.05", "stage3-lambda0.6", "stage3-lambda2"):
        assert (run / stage / "config.json").is_file(), stage
    # one output folder per LLM: the DeepSeek run leaves the OpenAI-trained λ 0.6 alone and starts from its Stage 2
    openai_run = json.dumps(json.loads((run / "stage3-lambda0.6" / "config.resolved.json").read_text()))
    deepseek_run = json.loads(
        (root / "runs" / "mine-deepseek" / "stage3-lambda0.6" / "config.resolved.json").read_text()
    )
    assert "gpt-5-mini" in openai_run and "deepseek-chat" not in openai_run
    assert "deepseek-chat" in json.dumps(deepseek_run) and "gpt-5-mini" not in json.dumps(deepseek_run)
    assert deepseek_run["stage2"] == "runs/mine/stage2", deepseek_run["stage2"]
    val_run, test_run = run / "eval" / "val", run / "eval"
    for r, n in ((val_run, len(val)), (test_run, N_TEST)):
        lines = (r / "records" / "pyrodash@0.6.jsonl").read_text().splitlines()
        assert len(lines) == n, (r, n)
    serve = yaml.safe_load((root / "serve.yaml").read_text())
    assert serve["operating_points"]["pyrodash"] and serve["budgets"]["default"]["usd_per_hour"] == 2.0
    assert serve["limits"] == {"max_tokens": 8192, "default_max_tokens": 4096}  # answers a reasoning model's length
    assert serve["slm"].startswith("runs/mine/stage3-lambda") and "picked" in seen["select runs/mine/eval"]
    # the served pick is the policy the page says: trained against the LLM it is served with (gpt-5-mini's double)
    served = json.dumps(json.loads((root / serve["slm"] / "config.resolved.json").read_text()))
    assert "gpt-5-mini" in served and "deepseek-chat" not in served and "gpt-5-mini" in json.dumps(serve["llm"])
    budget = seen["budget"]
    assert budget and "default" in json.dumps(budget), budget
    assert "## Picked on val" in seen["report"] and serve_point_named(seen["report"], serve)


def serve_point_named(report: str, serve: dict) -> bool:
    """The report's picked point is the one serve.yaml serves (its checkpoint's λ)."""
    lam = serve["slm"].rsplit("lambda", 1)[1]
    picked = report[report.index("## Picked on val") :]
    return f"pyrodash@{lam}" in picked
