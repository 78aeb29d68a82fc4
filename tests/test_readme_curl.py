"""Every `curl` line of the docs' blocks marked `<!-- runs in: tests/test_readme_curl.py -->` (README.md and docs/*.md,
tests/doc_blocks.py) runs as written against a real `pyrodash serve` started as those blocks start it.

For each section (a file's heading) with marked `curl` examples, the section's `pyrodash serve` line runs as a process
(its flags as written: a server started with flags names its one operating point `pyrodash`), with the docs' paths and
ports swapped for test ones: the SLM directory for a tiny SLM with `<offload>`, each `http://127.0.0.1:PORT/v1#NAME`
LLM for a tiny model behind `pyrodash serve-model`'s app on a free port, `--port 8000` for a free port. Each `curl`
command then runs in bash with only `localhost:8000` changed to that server, and must exit 0 with an answer: a JSON
completion, or a stream that ends with `data: [DONE]`, and no error body.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from doc_blocks import ROOT, blocks_run_by, commands
from servers import free_port, stop, wait_healthy
from test_server import UvicornThread, tiny_llm
from tiny_models import tiny_model_dir

LLM_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/v1#([\w.-]+)")


def readme_sections() -> dict[str, tuple[list[str], list[str]]]:
    """{"file: section": (its `pyrodash serve` commands, its `curl` commands)} of the blocks marked for this test."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for block in blocks_run_by("tests/test_readme_curl.py"):
        key = f"{block.path.relative_to(ROOT)}: {block.section}"
        serves, curls = out.setdefault(key, ([], []))
        serves += commands(block.text, "pyrodash serve ")
        curls += commands(block.text, "curl ")
    return out


SECTIONS = readme_sections()


def test_the_docs_have_curl_examples():
    assert sum(len(c) for _, c in SECTIONS.values()) >= 4, SECTIONS
    assert any(k.startswith("README.md") for k in SECTIONS), "the README's tour serves and asks with curl"
    assert all(len(s) == 1 for s, c in SECTIONS.values() if c), "each section with curl starts one server"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("readme") / "slm", seed=0), tiny_llm(tmp_path_factory)


def _answer(out: str) -> None:
    """A completion: JSON with choices (pretty-printed or not), or an SSE stream that ends with [DONE]."""
    if out.lstrip().startswith("data:"):
        events = [line[5:].strip() for line in out.splitlines() if line.startswith("data:")]
        assert events[-1] == "[DONE]", out[-500:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks) and any(c.get("choices") for c in chunks), out[:500]
        return
    body = json.loads(out)
    assert "error" not in body and body["choices"] and "pyrodash" in body, out[:500]


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
@pytest.mark.parametrize("title", list(SECTIONS))
def test_readme_curl_lines_run_as_written(title, tiny, tmp_path):
    from pyrodash.server.model_server import build_model_app

    (serve,), curls = SECTIONS[title]
    slm_dir, llm = tiny
    argv = shlex.split(re.sub(r"\s+#\s.*$", "", serve.replace("\\\n", " "), flags=re.M))  # no shell comment
    assert argv[:2] == ["pyrodash", "serve"]
    llms = []
    for i, arg in enumerate(argv):
        if argv[i - 1] == "--slm":
            argv[i] = str(slm_dir)
        elif LLM_URL.fullmatch(arg):  # the README's LLM server: a tiny model behind serve-model's app
            name = LLM_URL.fullmatch(arg).group(2)
            llms.append(UvicornThread(build_model_app(llm, model_name=name), log_level="error").__enter__())
            argv[i] = f"{llms[-1].url}/v1#{name}"
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyrodash", *argv[1:], "--log-level", "warning"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYRODASH_API_KEY": ""},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, "pyrodash serve")
        for cmd in curls:
            assert "localhost:8000" in cmd, cmd
            run = subprocess.run(
                ["bash", "-o", "pipefail", "-c", cmd.replace("localhost:8000", f"127.0.0.1:{port}")],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert run.returncode == 0, f"{cmd}\n{run.stdout}\n{run.stderr}"
            _answer(run.stdout)
    finally:
        stop(proc)
        log.close()
        for srv in llms:
            srv.__exit__(None, None, None)
