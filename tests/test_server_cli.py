"""`pyrodash serve` as a user runs it: a real process with flags, serving real tiny models, stopped by a signal.

The SLM is a tiny model directory loaded in process by the server; the LLM is a tiny model behind
`pyrodash serve-model`'s app on 127.0.0.1 (in this test's process). On SIGTERM the server must let a running stream
finish (graceful shutdown) and exit 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from servers import free_port, wait_healthy
from test_server import llm_server, tiny_llm
from tiny_models import tiny_model_dir

from pyrodash.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_serve_without_models_is_a_clear_cli_error(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["serve", "--port", "8123"]) == 2
    assert "--slm and --llm" in capsys.readouterr().err
    assert main(["serve", "--config", "configs/serve/nope.yaml"]) == 2
    assert main(["serve", "--slm", "runs/none/slm", "--llm", "http://127.0.0.1:9/v1"]) == 2
    assert "slm model directory runs/none/slm does not exist" in capsys.readouterr().err
    assert (
        main(
            [
                "serve",
                "--config",
                "configs/serve/world.yaml",
                "--slm",
                "http://127.0.0.1:9/v1",
                "--llm",
                "http://127.0.0.1:9/v1",
                "--prices",
                "nope",
            ]
        )
        == 2
    )
    assert "price sheet 'nope' not found" in capsys.readouterr().err


def _serve_cmd(slm_dir, llm: str, port: int) -> list[str]:
    """`pyrodash serve` over the tiny SLM and the LLM at `llm`, with a key, a token limit and a graceful timeout."""
    flags = {"--slm": str(slm_dir), "--llm": llm, "--prompts": "world-v1", "--port": str(port), "--api-key": "k"}
    flags |= {"--max-tokens": "300", "--graceful-timeout": "20", "--log-level": "warning"}
    return [sys.executable, "-m", "pyrodash.cli", "serve", *(x for kv in flags.items() for x in kv)]


def test_serve_process_answers_and_shuts_down_gracefully(tmp_path_factory):
    slm_dir = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0)
    port = free_port()
    with llm_server(tiny_llm(tmp_path_factory)) as lsrv:
        cmd = _serve_cmd(slm_dir, f"{lsrv.url}/v1#tiny-llm", port)
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, "pyrodash serve")
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=60)
            r = client.chat.completions.create(
                model="pyrodash",
                messages=[{"role": "user", "content": "1+2="}],
                max_tokens=5,
                extra_body={"offload_bias": 100.0},
            )
            assert r.model_extra["pyrodash"]["handoff"] == 0 and r.model_extra["pyrodash"]["llm_calls"] == 1
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(
                    model="pyrodash", messages=[{"role": "user", "content": "x"}], max_tokens=301
                )

            # a stream in flight when SIGTERM arrives still finishes; then the server exits 0
            stream = client.chat.completions.create(
                model="pyrodash",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=250,
                stream=True,
                extra_body={"offload_bias": -100.0},
            )
            parts = [next(stream)]
            proc.send_signal(signal.SIGTERM)
            parts += list(stream)
            assert parts[-1].choices[0].finish_reason == "length"
            assert len([p for p in parts if p.choices and p.choices[0].delta.content]) >= 200
            assert proc.wait(timeout=60) == 0
            out = proc.stdout.read()
            assert f"http://127.0.0.1:{port}/v1" in out and "auth=on" in out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
