"""`pyrodash generate --max-llm-calls N`: relay from the command line (docs/relay.md) on real tiny models. The
random tiny LLM writes no blank lines, so the step separator is one character its own continuation writes
(`--step-sep`), found by a small search over the in-process engine."""

from __future__ import annotations

import json

import pytest
from tiny_models import HANDOFF_SLM_SEED, tiny_model_dir

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cli import main
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.relay import STEP_CAP, RelayConfig
from pyrodash.prompts import get_prompts
from pyrodash.record import Record

PROMPTS = get_prompts("world-v1")
PAPER = Prices.from_yaml("paper")
CALLS, CAP, BUDGET = 4, 8, 24


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen-relay")
    slm = tiny_model_dir(root / "slm", seed=HANDOFF_SLM_SEED)
    return str(slm), str(tiny_model_dir(root / "llm", seed=1, offload=False))


def relay_engine(dirs, sep: str, cap: int = CAP) -> CollaborateEngine:
    relay = RelayConfig(max_llm_calls=CALLS, step_sep=sep, step_max_tokens=cap)
    return CollaborateEngine(HFBackend(dirs[0]), HFBackend(dirs[1]), PROMPTS, PAPER, max_tokens=BUDGET, relay=relay)


@pytest.fixture(scope="module")
def point(dirs):
    """(question, separator, offload_bias, the in-process relay's answer): the first of a small grid where the relay
    stops at the separator (no fallback), makes two LLM calls or more, and the SLM writes between two of them."""
    single = CollaborateEngine(HFBackend(dirs[0]), HFBackend(dirs[1]), PROMPTS, PAPER, max_tokens=BUDGET)
    for q in ("x", "abc", "2+3=?"):
        for bias in (1.0, 1.5, 2.0):
            step = single.run(q, offload_bias=bias).llm_text
            for sep in dict.fromkeys(step[1:6]):  # a character the LLM writes after its first
                done = relay_engine(dirs, sep).run(q, offload_bias=bias)
                by = "".join(s["by"][0] for s in done.segments)
                if done.relay_fallback is None and done.usage.llm_calls >= 2 and "lsl" in by:
                    return q, sep, bias, done
    raise AssertionError("no question / separator / bias of the grid relays on the tiny models")


def cli(dirs, *extra) -> list[str]:
    base = ["generate", "--slm", dirs[0], "--llm", dirs[1], "--prompts", "world-v1", "--max-tokens", str(BUDGET)]
    return [*base, "--step-max-tokens", str(CAP), *extra]


def test_generate_max_llm_calls_relays_and_prints_the_record(dirs, point, capsys):
    q, sep, bias, ref = point
    flags = ["--max-llm-calls", str(CALLS), "--step-sep", sep, "--offload-bias", str(bias)]
    assert main(cli(dirs, "--json", *flags, q)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    want = Record.from_done(ref).to_json()
    assert {k: v for k, v in out.items() if k != "latency_s"} == {k: v for k, v in want.items() if k != "latency_s"}
    # one LLM call per handoff, each step ended at the separator (the stop), the SLM resuming after it
    assert out["llm_calls"] == len(out["handoffs"]) >= 2 and out["handoff"] == out["handoffs"][0]
    assert out["relay_fallback"] is None and out["llm_prior_in"] > 0
    first = next(s["text"] for s in out["segments"] if s["by"] == "llm")
    assert first.endswith(sep) and sep not in first[: -len(sep)]
    assert out["output"] == "".join(s["text"] for s in out["segments"])
    # the coloured stream's summary says how it relayed
    assert main(cli(dirs, *flags, q)) == 0
    text = capsys.readouterr().out
    positions = ", ".join(map(str, ref.handoffs))
    assert f"{len(ref.handoffs)} handoffs after {positions} SLM tokens" in text and f"calls {CALLS}" in text


def test_generate_says_when_the_relay_fell_back(dirs, point, capsys):
    q, _, bias, _ = point
    # a separator the LLM never writes within a 2-token cap: every step reaches the cap, the rest is one more call
    ref = relay_engine(dirs, "\x07", cap=2).run(q, offload_bias=bias)
    assert ref.relay_fallback == STEP_CAP
    flags = [
        "--max-llm-calls",
        str(CALLS),
        "--step-sep",
        "\\x07",
        "--step-max-tokens",
        "2",
        "--offload-bias",
        str(bias),
    ]
    assert main(cli(dirs, "--json", *flags, q)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["relay_fallback"] == STEP_CAP and out["llm_calls"] == ref.usage.llm_calls == 2
    assert main(cli(dirs, *flags, q)) == 0
    assert f"[relay fell back to a single handoff: {STEP_CAP}" in capsys.readouterr().out


@pytest.mark.parametrize("n", ["0", "-2", "x", "1.5"])
def test_an_invalid_max_llm_calls_is_a_one_line_error(dirs, n, capsys):
    assert main(cli(dirs, "--max-llm-calls", n, "q")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--max-llm-calls '{n}': give a positive integer" in err, err
