"""Every `curl` line of the README runs as written against a real `pyrodash serve` started as the README starts it.

For each README section with `curl` examples, the section's `pyrodash serve` line runs as a process (its flags as
written: a server started with flags names its one operating point `pyrodash`), with the README's paths and ports
swapped for test ones: the SLM directory for a tiny SLM with `<offload>`, each `http://127.0.0.1:PORT/v1#NAME` LLM
for a tiny model behind `pyrodash serve-model`'s app on a free port, `--port 8000` for a free port. Each `curl`
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
from pathlib import Path

import pytest
from servers import free_port, stop, wait_healthy
from test_server import UvicornThread, tiny_llm
from tiny_models import tiny_model_dir

ROOT = Path(__file__).resolve().parent.parent
LLM_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/v1#([\w.-]+)")


def _commands(block: str, start: str) -> list[str]:
    """The commands of a bash block that begin with `start`, continuation lines and multi-line quotes joined."""
    out, cur = [], None
    for line in block.splitlines():
        if cur is None and not line.startswith(start):
            continue
        cur = line if cur is None else cur + "\n" + line
        try:
            shlex.split(cur)
        except ValueError:  # a quote still open
            continue
        if cur.endswith("\\"):
            continue
        out.append(cur)
        cur = None
    return out


def readme_sections() -> dict[str, tuple[list[str], list[str]]]:
    """{section title: (its `pyrodash serve` commands, its `curl` commands)} for sections with curl examples."""
    text = (ROOT / "README.md").read_text()
    out = {}
    for part in re.split(r"\n#{2,3} ", text)[1:]:
        title = part.split("\n", 1)[0]
        blocks = re.findall(r"```bash\n(.*?)```", part, re.S)
        curls = [c for b in blocks for c in _commands(b, "curl ")]
        if curls:
            serves = [c for b in blocks for c in _commands(b, "pyrodash serve ")]
            out[title] = (serves, curls)
    return out


SECTIONS = readme_sections()


def test_the_readme_has_curl_examples():
    assert sum(len(c) for _, c in SECTIONS.values()) >= 3, SECTIONS
    assert all(len(s) == 1 for s, _ in SECTIONS.values()), "each section with curl starts one server"


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
    from pyrodash.backends.model_server import build_model_app

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
