"""The serve config's `relay: {step_sep, step_max_tokens}` per operating point, through a real `pyrodash serve`
process (the tiny SLM in it, the tiny LLM behind `pyrodash serve-model`'s app in this test's process, whose requests
are recorded) with the official openai SDK; and the config's checks of those keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import yaml
from servers import free_port, wait_healthy
from test_server import llm_server, tiny_llm
from tiny_models import tiny_model_dir

from pyrodash.server.config import ServeConfig

ROOT = Path(__file__).resolve().parent.parent
SEP, CAP = " ", 3  # a step ends at a space or after 3 tokens (the engine's defaults: "\n\n", 64)


def test_relay_keys_reach_the_llm_calls_of_their_operating_point(tmp_path_factory, tmp_path):
    slm_dir = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0)
    llm, seen = tiny_llm(tmp_path_factory), []
    stream = llm.stream

    def recorded(req):
        seen.append(req)
        return stream(req)

    llm.stream = recorded
    port = free_port()
    with llm_server(llm) as lsrv:
        points = {
            "relay": {"offload_bias": 100.0, "max_llm_calls": 3},
            "relay-short": {
                "offload_bias": 100.0,
                "max_llm_calls": 3,
                "relay": {"step_sep": SEP, "step_max_tokens": CAP},
            },
        }
        cfg = {"slm": str(slm_dir), "llm": f"{lsrv.url}/v1#tiny-llm", "prompts": "world-v1", "operating_points": points}
        (tmp_path / "serve.yaml").write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "pyrodash.cli", "serve", "--config", str(tmp_path / "serve.yaml")]
        cmd += ["--port", str(port), "--api-key", "k", "--log-level", "warning"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, "pyrodash serve")
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120)
            firsts = {}
            for model in points:
                n = len(seen)
                r = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "1+2="}], max_tokens=40
                )
                firsts[model] = (r.model_extra["pyrodash"], seen[n] if len(seen) > n else None)
        finally:
            proc.kill()
            proc.wait()
    (_, default), (info, short) = firsts["relay"], firsts["relay-short"]
    assert info["handoff"] == 0 and info["llm_calls"] >= 2  # a step of at most CAP tokens, then more
    assert default.stop == ["\n\n"] and default.max_tokens > CAP  # the engine's relay
    assert short.stop == [SEP] and short.max_tokens == CAP  # the operating point's


@pytest.mark.parametrize(
    ("relay", "says"),
    [
        ({"step_sep": ""}, "relay.step_sep=''"),
        ({"step_max_tokens": 0}, "relay.step_max_tokens=0"),
        ({"step_max_tokens": True}, "relay.step_max_tokens=True"),
        ({"stop": "x"}, "step_sep and/or step_max_tokens"),
        ("\n\n", "step_sep and/or step_max_tokens"),
    ],
)
def test_a_bad_relay_key_names_the_operating_point_and_the_key(relay, says):
    with pytest.raises(ValueError, match="operating_points.p: ") as e:
        ServeConfig(operating_points={"p": {"max_llm_calls": 2, "relay": relay}})
    assert says in str(e.value)


def test_relay_keys_parse_and_default_to_the_engines():
    c = ServeConfig(operating_points={"a": 0.0, "b": {"relay": {"step_max_tokens": 16}}})
    assert c.operating_points["a"].relay == {} and c.operating_points["b"].relay == {"step_max_tokens": 16}
