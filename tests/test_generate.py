"""`pyrodash generate` and `pyrodash calibrate` on real tiny models, and offload_bias calibration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tiny_models import HANDOFF_SLM_SEED, tiny_model_dir

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cli import main
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.calibrate import calibrate_offload_bias
from pyrodash.prompts import get_prompts
from pyrodash.record import Record, usage_of

PROMPTS = get_prompts("world-v1")
QUESTIONS = ["x", "abc", "2+3=?", "What is 7*8?", "hello", "q: 9-4", "zz top", "12*12"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    slm = tiny_model_dir(root / "slm", seed=HANDOFF_SLM_SEED)
    return str(slm), str(tiny_model_dir(root / "llm", seed=1, offload=False))


@pytest.fixture(scope="module")
def engine(dirs):
    return CollaborateEngine(HFBackend(dirs[0]), HFBackend(dirs[1]), PROMPTS, Prices.from_yaml("paper"), max_tokens=12)


def gen(dirs, *extra) -> list[str]:
    return ["generate", "--slm", dirs[0], "--llm", dirs[1], "--prompts", "world-v1", "--max-tokens", "12", *extra]


def test_generate_json_prints_the_engines_record(dirs, engine, capsys):
    """`generate --json` prints the one record shape (`pyrodash.record`, as eval records and the server's `pyrodash`
    object): the engine's answer, field for field (all but the wall time)."""
    for bias, handoff in ((1e4, 0), (-1e4, None)):
        assert main(gen(dirs, "--json", "--offload-bias", str(bias), "abc")) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        ref = Record.from_done(engine.run("abc", offload_bias=bias))
        assert set(out) == set(ref.to_json()) and "usage" not in out
        assert {k: v for k, v in out.items() if k != "latency_s"} == {
            k: v for k, v in ref.to_json().items() if k != "latency_s"
        }
        assert out["handoff"] == handoff and usage_of(out) == ref.usage and out["llm_calls"] == (handoff is not None)
        assert out["cost_usd"] == pytest.approx(ref.usage.cost(Prices.from_yaml("paper")))


def test_generate_handoff_share_zero_bans_the_handoff_and_says_so(dirs, capsys):
    assert main(gen(dirs, "--json", "--offload-bias", "1e4", "--handoff-share", "0", "abc")) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["handoff_admitted"] is False and out["handoff"] is None and out["llm_calls"] == 0
    assert main(gen(dirs, "--offload-bias", "1e4", "--handoff-share", "0", "abc")) == 0
    assert "outside --handoff-share 0" in capsys.readouterr().out
    assert main(gen(dirs, "--handoff-share", "2", "abc")) == 2
    assert "handoff_share=2.0 must be in [0, 1]" in capsys.readouterr().err


def test_generate_colours_slm_and_llm_text(dirs, engine, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    bias = next(b / 10 for b in range(60) if (engine.run("x", offload_bias=b / 10).handoff or 0) >= 2)
    ref = engine.run("x", offload_bias=bias)
    assert main(gen(dirs, "--offload-bias", str(bias), "x")) == 0
    out = capsys.readouterr().out
    assert "\x1b[36m" in out and "\x1b[35m" in out  # cyan SLM segment, magenta LLM segment
    assert out.index("\x1b[36m") < out.index("LLM (after") < out.rindex("\x1b[35m")
    assert f"handoff after {ref.handoff} SLM tokens" in out and f"${ref.cost_usd:.6f}" in out
    assert f"LLM in/out {ref.usage.llm_in}/{ref.usage.llm_out}" in out


def test_generate_without_offload_token_is_a_one_line_error(dirs, capsys):
    assert main(["generate", "--slm", dirs[1], "--llm", dirs[1], "q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "add_offload_token" in err


def test_calibration_hits_a_target_rate(engine):
    cal = calibrate_offload_bias(engine, QUESTIONS, target_rate=0.5, iters=10)
    n = len(QUESTIONS)
    assert cal.met and abs(cal.rate - 0.5) <= 1 / n
    # the reported rate is what the engine really does at that bias
    recount = sum(engine.run(q, offload_bias=cal.bias).handoff is not None for q in QUESTIONS) / n
    assert recount == cal.rate
    rates = [p["rate"] for p in cal.trace]
    assert rates == sorted(rates) and rates[0] == 0.0 and rates[-1] == 1.0  # monotone in the bias


def test_calibration_within_a_budget(engine):
    half = calibrate_offload_bias(engine, QUESTIONS[:4], target_rate=0.5, iters=8)
    budget = sum(engine.run(q, offload_bias=half.bias).cost_usd for q in QUESTIONS[:4]) / 4
    cal = calibrate_offload_bias(engine, QUESTIONS[:4], budget_usd=budget, iters=8)
    assert cal.met and cal.cost_usd <= budget and cal.bias >= half.bias - 1e-9
    with pytest.raises(ValueError, match="exactly one"):
        calibrate_offload_bias(engine, QUESTIONS, target_rate=0.5, budget_usd=1.0)


def test_calibrate_cli(dirs, tmp_path, capsys):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[:4]))
    argv = [
        "calibrate",
        "--slm",
        dirs[0],
        "--llm",
        dirs[1],
        "--prompts",
        "world-v1",
        "--max-tokens",
        "12",
        "--questions",
        str(qfile),
        "--target-rate",
        "0.25",
        "--iters",
        "8",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["questions"] == 4 and out["met"] and abs(out["rate"] - 0.25) <= 0.25
    assert main(argv[:-1]) == 0
    assert f"offload_bias={out['bias']:.4f}" in capsys.readouterr().out
    assert main(argv[:9] + ["--questions", str(tmp_path / "none.jsonl"), "--target-rate", "0.2"]) == 2


def test_serve_model_cli_serves_on_127_0_0_1(dirs):
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyrodash.cli", "serve-model", dirs[0], "--port", str(port), "--name", "slm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(300):
            try:
                models = httpx.get(url + "/models", timeout=1).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        assert models["data"][0]["id"] == "slm"
        tok = httpx.post(
            f"http://127.0.0.1:{port}/tokenize", json={"prompt": "<offload>", "add_special_tokens": False}
        ).json()
        assert tok["tokens"] == [HFBackend(dirs[0]).token_id("<offload>")]
    finally:
        proc.terminate()
        proc.wait(10)


def _python(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, **kw)


def test_generate_json_exits_0_every_time(dirs):
    """The in-process decode threads are joined before the interpreter exits: `generate --json` never aborts after
    printing its answer (it did with `terminate called without an active exception`, exit 134)."""
    for i in range(3):
        r = _python("-m", "pyrodash", *gen(dirs, "--json", "--offload-bias", "1e4", f"{i}+{i}"))
        assert r.returncode == 0, f"run {i}: exit {r.returncode}: {r.stderr[-500:]}"
        assert "terminate called" not in r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1])["handoff"] == 0


def test_a_stream_left_mid_decode_does_not_abort_the_interpreter(dirs, tmp_path):
    """The deterministic form of the exit crash: leave a stream while its thread is inside a torch forward and let
    the interpreter exit. A daemon decode thread was killed there by pthread_exit -> abort (exit 134, 3 runs of 3
    before the fix); now the stream's close cancels it and exit waits for it."""
    script = tmp_path / "leave.py"
    script.write_text(
        textwrap.dedent(f"""
        import asyncio
        from pyrodash.backends.base import GenRequest
        from pyrodash.backends.hf.backend import HFBackend

        backend = HFBackend({dirs[1]!r})

        async def main():
            it = backend.stream(GenRequest(messages=[{{"role": "user", "content": "abc"}}], max_tokens=400))
            await anext(it)  # one token, then leave: the thread is still decoding

        asyncio.run(main())
        print("left", flush=True)
    """)
    )
    r = _python(str(script))
    assert r.returncode == 0 and "terminate called" not in r.stderr, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.strip() == "left"
