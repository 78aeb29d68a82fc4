"""Every `pyrodash generate` example of the docs' blocks marked `<!-- runs in: tests/test_readme_endpoints.py -->`
(README.md's tour and docs/providers.md, tests/doc_blocks.py), run as written (through the CLI, in process) with the
provider's URL swapped for a server on 127.0.0.1 that stands in for it:
vLLM -> `pyrodash serve-model` (vLLM's request extras, a real model); OpenAI, DeepSeek, Anthropic -> the provider TEST
DOUBLES of tests/provider_doubles.py; LiteLLM -> a real LiteLLM proxy (its own venv, .venv-litellm, or $LITELLM_BIN)
in front of `pyrodash serve-model`; transformers serve -> the real `transformers serve` of the installed transformers.
The SLM is a tiny model; the bias gives a mid-trace handoff. Each example must hand off once, bill LLM tokens and
not fall back."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from doc_blocks import blocks_run_by, commands
from provider_doubles import anthropic_double, deepseek_double, openai_double
from servers import free_port
from tiny_models import CLEAN_LLM_SEEDS, HANDOFF_SLM_SEED, mid_trace_bias, tiny_model_dir

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.prompts import get_prompts
from pyrodash.server.model_server import build_model_app, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-readme-double-0123456789abcdef"


def readme_examples() -> dict[str, list[list[str]]]:
    """{--llm value: [argv, ...]} of every `pyrodash generate` command in the blocks marked for this test."""
    out: dict[str, list[list[str]]] = {}
    for block in blocks_run_by("tests/test_readme_endpoints.py"):
        for cmd in commands(block.text, "pyrodash generate"):
            argv = shlex.split(cmd.replace("\\\n", " "))[1:]
            out.setdefault(argv[argv.index("--llm") + 1], []).append(argv)
    return out


EXAMPLES = readme_examples()


def _by_host(part: str) -> str:
    hits = [k for k in EXAMPLES if part in k]
    assert len(hits) == 1, f"the marked docs blocks have no single --llm with {part!r}: {list(EXAMPLES)}"
    return hits[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    slm_dir = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=HANDOFF_SLM_SEED)
    llm_dir = tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=CLEAN_LLM_SEEDS[1], offload=False)
    slm = HFBackend(slm_dir)
    return slm_dir, llm_dir, HFBackend(llm_dir), mid_trace_bias(slm, get_prompts("world-v1"), "Start 47: +3, f.")


def run_example(readme_llm: str, local_llm: str, tiny, capsys) -> dict:
    """Every docs example with this --llm value, against `local_llm`; the last one's JSON answer."""
    return [_run_one(argv, local_llm, tiny, capsys) for argv in EXAMPLES[readme_llm]][-1]


def _run_one(example: list[str], local_llm: str, tiny, capsys) -> dict:
    from pyrodash.cli import main

    argv = list(example)
    argv[argv.index("--llm") + 1] = local_llm
    argv[argv.index("--slm") + 1] = str(tiny[0])
    argv[1:1] = ["--json", "--max-tokens", "24", "--offload-bias", str(tiny[3])]
    capsys.readouterr()
    assert main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the answer's Record
    assert done["handoff"] is not None and done["llm_calls"] == 1, done
    assert not done["fallback"] and not done["llm_errors"] and done["llm_out"] > 0
    assert [s["by"] for s in done["segments"]] == ["slm", "llm"], done["segments"]
    assert done["output"] == "".join(s["text"] for s in done["segments"])
    return done


def _text(done: dict, by: str) -> str:
    return "".join(s["text"] for s in done["segments"] if s["by"] == by)


def test_vllm_openai_deepseek_anthropic_examples(tiny, capsys, monkeypatch):
    _, _, llm, _ = tiny
    vllm, openai_, deepseek, anthropic = (
        _by_host(h) for h in (":8001/", "openai.com", "deepseek.com", "anthropic.com")
    )
    apps = {
        vllm: (build_model_app(llm, vllm.split("#")[1]), "/v1"),
        openai_: (openai_double(llm, model=openai_.split("#")[1], key=KEY), "/v1"),
        deepseek: (deepseek_double(llm, model=deepseek.split("#")[1], key=KEY), "/beta"),
        anthropic: (anthropic_double(llm, model=anthropic.split("#")[1], key=KEY), "/v1"),
    }
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # a 127.0.0.1 URL reads OPENAI_API_KEY (deepseek.com: DEEPSEEK_...)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with contextlib.ExitStack() as stack:
        for readme_llm, (app, base) in apps.items():
            url = stack.enter_context(serve_in_thread(app)).removesuffix("/v1") + base
            run_example(readme_llm, f"{url}#{readme_llm.split('#')[1]}", tiny, capsys)
            if hasattr(app.state, "calls"):  # the doubles count generation requests: the handoff reached them
                assert len(app.state.calls) >= 1


@contextlib.contextmanager
def _process(cmd: list[str], ready_url: str, env: dict, log: Path, timeout: float = 120):
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"{cmd[0]} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_transformers_serve_example(tiny, capsys, tmp_path):
    readme_llm = _by_host(":8002/")
    port = free_port()
    (tmp_path / "hub").mkdir()
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), str(tiny[1])]
    with _process(cmd, f"http://127.0.0.1:{port}/health", env, tmp_path / "serve.log"):
        done = run_example(readme_llm, f"http://127.0.0.1:{port}/v1#{tiny[1]}", tiny, capsys)
    ref = HFBackend(tiny[1]).generate(
        GenRequest(
            messages=[
                {"role": "system", "content": get_prompts("world-v1").completion_system},
                {"role": "user", "content": "Start 47: +3, f."},
            ],
            prefix=_text(done, "slm"),
            max_tokens=24,
        )
    )
    assert _text(done, "llm") == ref.text  # the completion mode continues exactly as the in-process LLM


def litellm_bin(wait_s: float = 600.0) -> str | None:
    """LiteLLM's executable: $LITELLM_BIN, else .venv-litellm's, waiting while .ci/run still installs it (in the
    background, beside the project's own install: the marker file says so)."""
    marker = ROOT / ".venv-litellm.installing"
    # a marker older than `wait_s` (left by an interrupted .ci/run) is not waited on
    with contextlib.suppress(FileNotFoundError):
        deadline = marker.stat().st_mtime + wait_s
        while marker.exists() and time.time() < deadline:
            time.sleep(1.0)
    for cand in (os.environ.get("LITELLM_BIN"), str(ROOT / ".venv-litellm" / "bin" / "litellm")):
        if cand and Path(cand).exists():
            return cand
    return None


def litellm_or_skip() -> str:
    """LiteLLM's executable (`litellm_bin`), or the test is skipped saying how to install it."""
    exe = litellm_bin()
    if exe is None:
        pytest.skip(
            "LiteLLM is not installed: python3 -m venv .venv-litellm && .venv-litellm/bin/pip install "
            "'litellm[proxy]' (or set LITELLM_BIN); .ci/run does this"
        )
    return exe


LITELLM_MASTER = "sk-litellm-master-0123456789abcdef"  # a proxy's key (`litellm_proxy`); clients send it as theirs


@contextlib.contextmanager
def litellm_proxy(routes: dict[str, tuple[str, str]], api_key: str, tmp: Path):
    """A real LiteLLM proxy on 127.0.0.1 (its URL), routing each model name to (`provider/model`, api_base) with
    `api_key` upstream; clients send `LITELLM_MASTER`. Skipped where LiteLLM is not installed."""
    exe = litellm_or_skip()
    models = [
        {"model_name": name, "litellm_params": {"model": model, "api_base": base, "api_key": api_key}}
        for name, (model, base) in routes.items()
    ]
    (tmp / "litellm.yaml").write_text(json.dumps({"model_list": models}))
    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True",
           "LITELLM_MASTER_KEY": LITELLM_MASTER}  # fmt: skip
    cmd = [exe, "--config", str(tmp / "litellm.yaml"), "--host", "127.0.0.1", "--port", str(port)]
    with _process(cmd, f"http://127.0.0.1:{port}/health/liveliness", env, tmp / "litellm.log", 180):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_litellm_proxy_example(tiny, capsys, tmp_path, monkeypatch):
    exe = litellm_or_skip()
    readme_llm = _by_host(":4000/")
    name = readme_llm.split("#")[1]
    with serve_in_thread(build_model_app(tiny[2], "llm")) as upstream:
        cfg = tmp_path / "litellm.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "model_list": [
                        {
                            "model_name": name,
                            "litellm_params": {"model": "hosted_vllm/llm", "api_base": upstream, "api_key": "none"},
                        }
                    ]
                }
            )
        )
        port = free_port()
        master = "sk-litellm-master-0123456789abcdef"  # the proxy's key; clients send it as their API key
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "NO_DOCS": "True",
            "DISABLE_ADMIN_UI": "True",
            "LITELLM_MASTER_KEY": master,
        }
        monkeypatch.setenv("OPENAI_API_KEY", master)
        cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
        with _process(cmd, f"http://127.0.0.1:{port}/health/liveliness", env, tmp_path / "litellm.log", 180):
            run_example(readme_llm, f"http://127.0.0.1:{port}/v1#{name}", tiny, capsys)
