"""docs/serving.md's examples of OpenAI's Responses API and Anthropic's Messages API run as written: the `curl` lines
of the block marked `<!-- runs in: tests/test_fronts_docs.py -->` (bash, `$KEY` set) and the Python block of the same
section (the `openai` and `anthropic` SDKs), against a real `pyrodash serve` on tiny models with `localhost:8000`
swapped for its address. Each answer is its API's object with the `pyrodash` object."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from doc_blocks import ROOT, blocks, blocks_run_by, commands
from front_stack import front_stack
from test_server import KEY

BLOCKS = blocks_run_by("tests/test_fronts_docs.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with front_stack(tmp_path_factory) as (srv, _):
        yield srv


def test_the_docs_show_both_apis():
    [block] = BLOCKS
    curls = commands(block.text, "curl ")
    assert any("/v1/responses" in c for c in curls) and any("/v1/messages" in c for c in curls)


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
def test_the_curl_lines_run_as_written(server):
    [block] = BLOCKS
    for cmd in commands(block.text, "curl "):
        run = subprocess.run(
            ["bash", "-o", "pipefail", "-c", cmd.replace("localhost:8000", server.url.removeprefix("http://"))],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KEY": KEY},
        )
        assert run.returncode == 0, f"{cmd}\n{run.stderr}"
        body = json.loads(run.stdout)
        kind = body.get("object") or body.get("type")
        assert kind == ("response" if "/v1/responses" in cmd else "message"), run.stdout[:500]
        assert body["pyrodash"]["cost_usd"] > 0, run.stdout[:500]


def test_the_python_block_runs_as_written(server, capsys):
    [block] = BLOCKS
    [code] = [b.text for b in blocks(block.path) if b.lang == "python" and b.section == block.section]
    code = code.replace("http://localhost:8000", server.url)
    exec(compile(code, str(ROOT / "docs" / "serving.md"), "exec"), {"KEY": KEY})  # noqa: S102 - the docs' own code
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and all(line.strip() for line in printed)
