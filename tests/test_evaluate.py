"""The evaluation harness with real tiny models: records, token counts, batched PyroDash == the engine, and a run
killed with SIGKILL that resumes without losing or duplicating a line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tiny_models import tiny_model_dir

from pyrodash.cost import Prices
from pyrodash.data.example import Example
from pyrodash.eval.harness import EvalConfig, evaluate, resume
from pyrodash.prompts import get_prompts
from pyrodash.record import usage_of

ROOT = Path(__file__).resolve().parent.parent
GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": None}


def examples(n: int) -> list[Example]:
    return [
        Example(
            id=f"t{i}",
            benchmark="toy",
            question=f"Start {i}: +{i % 7}, f.",
            gold=str(i),
            meta={"steps": ["a", "b"], "hard_steps": [i % 2]},
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    from pyrodash.backends.hf.backend import HFBackend

    d = tmp_path_factory.mktemp("models")
    return HFBackend(tiny_model_dir(d / "slm", seed=1)), HFBackend(tiny_model_dir(d / "llm", seed=2))


def env(max_tokens: int = 12):
    from pyrodash.eval.methods import Env

    return Env(get_prompts("world-v1"), Prices.from_yaml("paper"), max_tokens=max_tokens, batch_size=4)


def test_records_and_token_counts(tmp_path, backends):
    from pyrodash.eval.methods import Solo

    slm, llm = backends
    e = env()
    cfg = EvalConfig(run_dir=str(tmp_path), benchmarks=["toy"], batch_size=4)
    methods = {"slm": Solo("slm", slm, "slm", e), "llm": Solo("llm", llm, "llm", e)}
    exs = examples(6)
    evaluate(cfg, methods, examples=exs, quiet=True)
    for name, be in (("slm", slm), ("llm", llm)):
        recs = [json.loads(x) for x in (tmp_path / "records" / f"{name}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in recs] == [ex.id for ex in exs]
        for r, ex in zip(recs, exs):
            u = usage_of(r)
            from pyrodash.backends.base import GenRequest

            n_prompt = len(be.prompt_ids(GenRequest(messages=get_prompts("world-v1").plain_messages(ex.question))))
            got = (u.slm_in, u.slm_out) if name == "slm" else (u.llm_in, u.llm_out)
            assert got[0] == n_prompt and 0 < got[1] <= 12
            assert r["llm_calls"] == (name == "llm") and r["meta"] == ex.meta and r["correct"] in (True, False)
            assert [(s["by"], s["text"]) for s in r["segments"]] == [(name, r["output"])]
    saved = json.loads((tmp_path / "config.resolved.json").read_text())
    assert saved["prices"] == Prices.from_yaml("paper").to_dict()


@pytest.mark.parametrize("bias", [0.0, 6.0])
def test_batched_pyrodash_equals_engine(backends, bias):
    from pyrodash.eval.methods import PyroDash

    slm, llm = backends
    m = PyroDash("pyrodash@0.1", slm, llm, env(16), offload_bias=bias)
    exs = examples(5)
    batched = m([(ex, GREEDY) for ex in exs])
    for ex, r in zip(exs, batched):
        d = m.engine.run(ex.question)
        assert r["output"] == d.output and r["handoff"] == d.handoff
        assert usage_of(r) == d.usage
    if bias:
        assert any(r["llm_calls"] for r in batched), "a large offload_bias must make the SLM hand off"


SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{root!r}, {root!r} + "/tests"]
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.eval.harness import EvalConfig, evaluate
    from pyrodash.eval.methods import Solo
    from test_evaluate import env, examples

    class Slow(Solo):
        def __call__(self, items):
            time.sleep({delay})
            return super().__call__(items)

    e = env()
    e.batch_size = 1
    cfg = EvalConfig(run_dir={run!r}, benchmarks=["toy"], batch_size=1)
    m = Slow("slm", HFBackend({model!r}), "slm", e)
    evaluate(cfg, {{"slm": m}}, examples=examples({n}), quiet=True)
""")


def _run(tmp_path, model, delay, n=24):
    code = SCRIPT.format(root=str(ROOT), run=str(tmp_path / "run"), model=str(model), delay=delay, n=n)
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_resume_after_sigkill(tmp_path):
    model = tiny_model_dir(tmp_path / "m", seed=1)
    path = tmp_path / "run" / "records" / "slm.jsonl"
    proc = _run(tmp_path, model, delay=0.05)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = path.read_bytes()
    n_before = before.count(b"\n")
    assert 3 <= n_before < 24
    with path.open("ab") as f:  # a torn line, as if killed in the middle of a write
        f.write(b'{"id": "t99", "bench')
    assert len(resume(path)) == n_before and path.read_bytes() == before
    with path.open("ab") as f:
        f.write(b'{"id": "t99", "bench')
    proc = _run(tmp_path, model, delay=0.0)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    lines = path.read_text().splitlines()
    ids = [json.loads(x)["id"] for x in lines]
    assert sorted(ids) == sorted(ex.id for ex in examples(24)) and len(set(ids)) == 24
    assert path.read_bytes().startswith(before)
    # the resumed records equal those of one uninterrupted run
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.eval.methods import Solo

    e = env()
    e.batch_size = 1
    evaluate(
        EvalConfig(run_dir=str(tmp_path / "fresh"), benchmarks=["toy"], batch_size=1),
        {"slm": Solo("slm", HFBackend(model), "slm", e)},
        examples=examples(24),
        quiet=True,
    )
    fresh_lines = (tmp_path / "fresh/records/slm.jsonl").read_text().splitlines()
    fresh = {json.loads(x)["id"]: json.loads(x) for x in fresh_lines}
    for x in lines:
        r = json.loads(x)
        assert (r["output"], usage_of(r)) == (fresh[r["id"]]["output"], usage_of(fresh[r["id"]]))


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="benchmarks"):
        EvalConfig(run_dir=str(tmp_path), benchmarks=[])
    with pytest.raises(ValueError, match="avg@k"):
        EvalConfig(run_dir=str(tmp_path), benchmarks=["aime24"], samples={"aime24": 0})
    p = tmp_path / "c.yaml"
    p.write_text("run_dir: x\nbenchmarks: [toy]\nbogus: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        EvalConfig.from_yaml(p)


def test_cli_eval_avg_at_k(tmp_path):
    """`pyrodash eval --config` end to end with tiny models: avg@k sampling, every method, report; a re-run adds
    nothing."""
    from pyrodash.cli import main

    data = tmp_path / "aime.jsonl"
    data.write_text(
        "".join(json.dumps({"id": i, "problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    slm, llm = tiny_model_dir(tmp_path / "slm", seed=1), tiny_model_dir(tmp_path / "llm", seed=2)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        json.dumps(
            {
                "run_dir": str(tmp_path / "run"),
                "benchmarks": ["aime24"],
                "benchmark_paths": {"aime24": str(data)},
                "samples": {"aime24": 2},
                "prompts": "world-v1",
                "max_tokens": 8,
                "batch_size": 4,
                "models": {"slm": str(slm), "llm": str(llm), "pyrodash": {0.1: str(slm)}},
                "methods": [
                    "slm",
                    "llm",
                    "pyrodash",
                    {"glimprouter": {"taus": [1.0]}},
                    {"pyrodash_bias": {"lambda": 0.1, "biases": [5.0]}},
                    {"pyrodash_share": {"lambda": 0.1, "shares": [0.0]}},
                ],
            }
        )
    )
    assert main(["eval", "--config", str(cfg)]) == 0
    rec = tmp_path / "run" / "records"
    names = sorted(p.stem for p in rec.glob("*.jsonl"))
    assert names == sorted(["slm", "llm", "pyrodash@0.1", "glimprouter@1", "pyrodash@0.1+bias5", "pyrodash@0.1+share0"])
    # handoff_share 0: no request may hand off, and every record says so
    share0 = [json.loads(x) for x in (rec / "pyrodash@0.1+share0.jsonl").read_text().splitlines()]
    assert all(r["handoff_admitted"] is False and r["llm_calls"] == 0 and r["handoff_share"] == 0.0 for r in share0)
    assert all(json.loads(x)["handoff_admitted"] for x in (rec / "pyrodash@0.1.jsonl").read_text().splitlines())
    first = {n: (rec / f"{n}.jsonl").read_text() for n in names}
    for n in names:
        rows = [json.loads(x) for x in first[n].splitlines()]
        assert sorted((r["id"], r["sample"]) for r in rows) == sorted(
            (f"aime24-{i}", s) for i in range(3) for s in range(2)
        )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["methods"]
    assert set(summary) == set(names)
    assert main(["eval", "--config", str(cfg)]) == 0
    assert {n: (rec / f"{n}.jsonl").read_text() for n in names} == first


def test_refuses_records_from_other_settings(tmp_path, backends):
    from pyrodash.eval.methods import Solo

    slm, _ = backends
    cfg = EvalConfig(run_dir=str(tmp_path), benchmarks=["toy"], models={"slm": "a"})
    evaluate(cfg, {"slm": Solo("slm", slm, "slm", env())}, examples=examples(2), quiet=True)
    for change in ({"models": {"slm": "b"}}, {"max_tokens": 99}):
        other = EvalConfig(**{**cfg.__dict__, **change})
        with pytest.raises(ValueError, match="different settings"):
            evaluate(other, {"slm": Solo("slm", slm, "slm", env())}, examples=examples(2), quiet=True)
    more = EvalConfig(**{**cfg.__dict__, "methods": ["slm", "llm"], "prices": "cached"})
    evaluate(more, {"slm": Solo("slm", slm, "slm", env())}, examples=examples(3), quiet=True)
    assert len((tmp_path / "records" / "slm.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run_dir: x\nbenchmarks: [toy\n", "not valid YAML at line"),
        ("- run_dir: x\n- benchmarks: [toy]\n", "top level must be a mapping"),
        ("run_dir: x\nbenchmarks: [toy]\nmax_tokens: abc\n", "max_tokens='abc' must be a positive integer"),
        ("run_dir: x\nbenchmarks: 7\n", "benchmarks=7 must be a list"),
        ("run_dir: x\nbenchmarks: [toy]\nmodels: [a]\n", "models=\\['a'\\] must be a mapping"),
        ("benchmarks: [toy]\n", "missing run_dir"),
        ("run_dir: x\nbenchmarks: [toy]\nlimit: 0\n", "limit=0 must be a positive integer"),
        ("run_dir: x\nbenchmarks: [toy]\nsamples: {toy: true}\n", "samples.toy=True"),
        ("run_dir: x\nbenchmarks: [toy]\nmax_tokns: 9\n", "unknown keys \\['max_tokns'\\]; expected \\['answers'"),
        ("run_dir: x\nbenchmarks: [toy]\nsample_top_p: -1\n", "sample_top_p=-1 must be a non-negative number"),
        ("run_dir: x\nbenchmarks: [toy]\nbenchmark_methods: {toy: ['(']}\n", "'\\(' is not a regular expression"),
    ],
)
def test_cli_eval_bad_configs_are_one_line_errors(tmp_path, capsys, text, message):
    from pyrodash.cli import main

    p = tmp_path / "c.yaml"
    p.write_text(text.replace("run_dir: x", f"run_dir: {tmp_path / 'x'}"))
    assert main(["eval", "--config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err
    assert not (tmp_path / "x").exists()


def test_cli_eval_directory_as_config(tmp_path, capsys):
    from pyrodash.cli import main

    assert main(["eval", "--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a directory" in err, err


def test_a_string_benchmark_is_a_one_item_list(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run_dir: x\nbenchmarks: gsm8k\nmethods: slm\n")
    cfg = EvalConfig.from_yaml(p)
    assert cfg.benchmarks == ["gsm8k"] and cfg.methods == ["slm"]


def test_missing_model_path_fails_before_the_run_dir_exists(tmp_path, capsys):
    from pyrodash.cli import main

    p = tmp_path / "c.yaml"
    run = tmp_path / "run"
    p.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "benchmarks": ["aime24"],
                "methods": ["slm"],
                "models": {"slm": str(tmp_path / "no-such-model")},
            }
        )
    )
    assert main(["eval", "--config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "models.slm" in err and "does not exist" in err and len(err.splitlines()) == 1, err
    assert not run.exists()


def test_broken_resolved_config_names_the_file(tmp_path, backends):
    from pyrodash.eval.methods import Solo

    slm, _ = backends
    cfg = EvalConfig(run_dir=str(tmp_path), benchmarks=["toy"], models={"slm": "a"})
    evaluate(cfg, {"slm": Solo("slm", slm, "slm", env())}, examples=examples(1), quiet=True)
    (tmp_path / "config.resolved.json").write_text('{"models": ')
    with pytest.raises(ValueError, match=r"config\.resolved\.json is not valid JSON"):
        evaluate(cfg, {"slm": Solo("slm", slm, "slm", env())}, examples=examples(1), quiet=True)


def test_benchmark_methods_limits_which_methods_run_on_a_benchmark(tmp_path, backends):
    from pyrodash.eval.methods import Solo

    slm, llm = backends
    e = env()
    other = [Example(id=f"c{i}", benchmark="chat", question=f"q{i}", gold="1", meta={}) for i in range(3)]
    cfg = EvalConfig(
        run_dir=str(tmp_path),
        benchmarks=["toy", "chat"],
        batch_size=4,
        benchmark_methods={"chat": ["llm", "pyrodash@[0-9.]+"]},
    )
    methods = {"slm": Solo("slm", slm, "slm", e), "llm": Solo("llm", llm, "llm", e)}
    evaluate(cfg, methods, examples=examples(4) + other, quiet=True)
    benches = {
        n: sorted({json.loads(x)["benchmark"] for x in (tmp_path / "records" / f"{n}.jsonl").read_text().splitlines()})
        for n in ("slm", "llm")
    }
    assert benches == {"slm": ["toy"], "llm": ["chat", "toy"]}
    assert cfg.runs_on("pyrodash@0.6", "chat") and not cfg.runs_on("pyrodash@0.6+share0.5", "chat")
    assert cfg.runs_on("pyrodash@0.6+share0.5", "toy")
    with pytest.raises(ValueError, match="not a regular expression"):
        EvalConfig(run_dir="x", benchmarks=["toy"], benchmark_methods={"toy": ["pyrodash@(["]})
    with pytest.raises(ValueError, match="list of method names"):
        EvalConfig(run_dir="x", benchmarks=["toy"], benchmark_methods={"toy": "slm"})
