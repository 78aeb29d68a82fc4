"""Steps side by side (pyrodash.jobs.scheduler):
order after what a step needs, one log per step, failures named; and the
demo's split of the evaluation into such steps."""

from __future__ import annotations

import io

import pytest

# the steps run in the scheduler's worker processes, which import the module that defines them (`job_steps`: the
# standard library only, not the demo this module imports)
from job_steps import fail, note, torch_loaded, torch_threads, watch_grant

from pyrodash.commands.demo import ROOT, eval_jobs, training_jobs
from pyrodash.eval.harness import EvalConfig
from pyrodash.jobs.scheduler import Job, log_name, run_jobs, waited_on_first


@pytest.mark.parametrize("workers", [1, 2])
def test_steps_run_after_what_they_need_with_a_log_each(tmp_path, workers):
    order = tmp_path / "order.txt"
    jobs = [
        Job("b needs a", note, (str(order), "b")),
        Job("a", note, (str(order), "a", 0.5)),
        Job("c", note, (str(order), "c")),
    ]
    jobs[0].after = ("a",)
    seconds = run_jobs(jobs, workers, tmp_path / "logs")
    text = order.read_text()
    assert sorted(text) == ["a", "b", "c"] and text.index("a") < text.index("b")
    assert set(seconds) == {"b needs a", "a", "c"} and seconds["a"] >= 0.5
    if workers == 2:  # each step printed into its own log, not onto the console
        assert "step a running" in (tmp_path / "logs" / log_name("a")).read_text()
        assert (tmp_path / "logs" / "b_needs_a.log").exists()


def test_of_two_ready_steps_the_one_others_wait_on_starts_first(tmp_path):
    """With one worker free, "needed" (listed after "free") starts first: a step waits on it. Fails if the scheduler
    starts ready steps in list order (then "free" runs, and ends, before "needed")."""
    order = tmp_path / "order.txt"
    jobs = [
        Job("long", note, (str(order), "L", 1.0)),
        Job("free", note, (str(order), "F")),
        Job("needed", note, (str(order), "N")),
        Job("after", note, (str(order), "A"), after=("needed",)),
    ]
    run_jobs(jobs, 2, tmp_path / "logs")
    text = order.read_text()
    assert text.index("N") < text.index("F"), text


def test_the_demo_trains_first_the_lambda_most_steps_wait_on():
    """The demo's steps by how many wait on each (`waited_on_first`): Stage 3 for λ 0.6 (the range calibration, the
    sweeps, the relay and the long conversations read it) before λ 0.2 and 2, whatever their list order."""
    from rich.console import Console

    lams = [0.2, 0.6, 2.0]
    cfg = EvalConfig.from_yaml(
        ROOT / "configs" / "eval" / "world-quick.yaml",
        run_dir="r",
        models={"slm": "s", "llm": "l", "sft": "f", "pyrodash": {lam: f"p{lam}" for lam in lams}},
    )
    jobs = training_jobs("recipe", ROOT / "no-such-run", lams, Console(file=io.StringIO()))
    jobs += eval_jobs(cfg, {lam: f"stage3 λ={lam:g}" for lam in lams}, {j.name for j in jobs})
    names = [j.name for j in waited_on_first(jobs)]
    stage3 = [n for n in names if n.startswith("stage3")]
    assert stage3[0] == "stage3 λ=0.6", names
    assert names.index("curation") < names.index("stage1") < names.index("stage2") < names.index("stage3 λ=0.6")


def test_a_worker_has_one_torch_thread(tmp_path):
    """Where a step loads torch it has one thread; a worker whose steps do not use torch never imports it (the
    threads are set through OMP_NUM_THREADS until torch is loaded: `scheduler.set_threads`)."""
    run_jobs(
        [
            Job("loaded?", torch_loaded, (str(tmp_path / "loaded"),)),
            Job("t", torch_threads, (str(tmp_path / "n"),), after=("loaded?",)),
            Job("u", note, (str(tmp_path / "x"), "u", 3.0)),  # still running when "t" starts: "t" is not alone
        ],
        2,
        tmp_path / "logs",
    )
    assert (tmp_path / "n").read_text() == "1" and (tmp_path / "loaded").read_text() == "no"


def test_a_failed_step_is_named_with_its_log_and_what_needs_it_never_runs(tmp_path):
    done = tmp_path / "done.txt"
    jobs = [
        Job("breaks", fail, ("boom",)),
        Job("slow", note, (str(done), "slow", 1.0)),
        Job("needs it", note, (str(done), "never"), after=("breaks",)),
    ]
    with pytest.raises(RuntimeError, match=r"breaks: ValueError: boom \(log: .*breaks\.log\)"):
        run_jobs(jobs, 2, tmp_path / "logs")
    assert done.read_text() == "slow"  # the step already running finished; the one that needed the failed never ran
    assert "about to fail" in (tmp_path / "logs" / "breaks.log").read_text()


@pytest.mark.parametrize("after, match", [(("nobody",), "unknown jobs"), (("y",), "wait for each other")])
def test_impossible_orders_are_refused_before_anything_runs(tmp_path, after, match):
    jobs = [
        Job("x", note, (str(tmp_path / "o"), "x"), after=after),
        Job("y", note, (str(tmp_path / "o"), "y"), after=("x",)),
    ]
    with pytest.raises(ValueError, match=match):
        run_jobs(jobs, 2, tmp_path / "logs")
    assert not (tmp_path / "o").exists()


def test_the_demo_evaluation_splits_into_steps_that_cover_every_method_once():
    lams = [0.6, 2.0, 4.0]
    cfg = EvalConfig.from_yaml(
        ROOT / "configs" / "eval" / "world-quick.yaml",
        run_dir="r",
        models={"slm": "s", "llm": "l", "sft": "f", "pyrodash": {lam: f"p{lam}" for lam in lams}},
    )
    stage3 = {lam: f"stage3 λ={lam:g}" for lam in lams}
    jobs = eval_jobs(cfg, stage3, pending={"stage3 λ=2", "stage2"})
    by = {j.name: j for j in jobs}
    assert set(by) == {
        "eval models alone, oracle",
        "eval routers",
        "eval slm+sft",
        "eval pyrodash λ=0.6",
        "eval pyrodash λ=2",
        "eval pyrodash λ=4",
        "eval sweeps λ=2",
        "eval sweeps λ=0.6",
    }
    assert by["eval pyrodash λ=2"].after == ("stage3 λ=2",) and by["eval pyrodash λ=0.6"].after == ()
    assert by["eval sweeps λ=2"].after == ("stage3 λ=2",)
    assert by["eval slm+sft"].after == ("stage2",)  # the Stage 2 model, once trained
    assert by["eval models alone, oracle"].after == ()  # beside training
    assert by["eval routers"].after == ("eval models alone, oracle",)  # their models' answers: read back
    assert eval_jobs(cfg, stage3, pending=set())[2].after == ()  # Stage 2 reused
    parts = {n: j.args[0] for n, j in by.items()}
    assert parts["eval models alone, oracle"].methods == ["slm", "llm", "oracle", "relay_oracle"]
    assert parts["eval slm+sft"].methods == ["slm+sft"]
    assert [next(iter(m)) for m in parts["eval routers"].methods] == ["routellm", "glimprouter"]
    assert parts["eval pyrodash λ=2"].methods == [{"pyrodash": {"lambdas": [2.0]}}]
    assert parts["eval sweeps λ=2"].methods == cfg.methods[-5:-3]  # the sweeps, a step of their own
    assert parts["eval sweeps λ=0.6"].methods == cfg.methods[-2:]  # the relay points
    assert parts["eval sweeps λ=2"].models == parts["eval pyrodash λ=2"].models
    assert parts["eval pyrodash λ=4"].models == {"slm": "s", "llm": "l", "sft": "f", "pyrodash": {4.0: "p4.0"}}
    assert "pyrodash" not in parts["eval routers"].models  # a step never needs a checkpoint not yet trained
    assert parts["eval routers"].models == parts["eval models alone, oracle"].models == {"slm": "s", "llm": "l"}
    assert all(p.run_dir == "r" and p.benchmarks == cfg.benchmarks for p in parts.values())


def test_demo_refuses_zero_workers_in_one_line_before_writing_anything(tmp_path, capsys):
    from pyrodash.cli import main

    assert main(["demo", "--quick", "--workers", "0", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--workers 0: give 1 or more processes" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_the_demo_training_is_a_chain_of_steps_with_cost_base_beside_it(tmp_path):
    from rich.console import Console

    from pyrodash.train.paths import stage_dir

    console = Console(file=io.StringIO())
    jobs = training_jobs("recipe", tmp_path, [0.6, 2.0], console)
    assert [(j.name, j.after) for j in jobs] == [
        ("curation", ()),
        ("stage1", ("curation",)),
        ("stage2", ("stage1",)),
        ("cost base", ()),
        ("stage3 λ=0.6", ("stage2", "cost base")),
        ("stage3 λ=2", ("stage2", "cost base")),
    ]
    # a step whose output exists is reused: what needs it no longer waits for it
    for name in ("curated", "stage1", "stage2"):
        d = tmp_path / name if name == "curated" else stage_dir(tmp_path, name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.resolved.json").write_text("{}")
    jobs = training_jobs("recipe", tmp_path, [0.6], console)
    assert [(j.name, j.after) for j in jobs] == [("cost base", ()), ("stage3 λ=0.6", ("cost base",))]


def test_demo_evaluates_one_chain_with_one_llm_call_and_as_a_relay(tmp_path):
    """One training chain serves both kinds of point: the quick demo's eval config holds the relay oracle and relay
    points of the λ 0.6 policy (the same checkpoint its single-handoff points use), evaluated after that policy's
    Stage 3 on the test tiers and on world:val, where the relay point is picked."""
    from pyrodash.commands.demo import relay_points_in, val_config

    cfg = EvalConfig.from_yaml(
        ROOT / "configs" / "eval" / "world-quick.yaml",
        run_dir=str(tmp_path),
        models={"slm": "s", "llm": "l", "sft": "f", "pyrodash": {0.6: "p06", 2.0: "p2"}},
    )
    assert relay_points_in(cfg) and "relay_oracle" in cfg.methods
    stage3 = {0.6: "stage3 λ=0.6", 2.0: "stage3 λ=2"}
    jobs = {j.name: j for j in eval_jobs(cfg, stage3, set(stage3.values()))}
    sweeps = jobs["eval sweeps λ=0.6"]
    assert sweeps.after == ("stage3 λ=0.6",)
    names = [list(m)[0] for m in sweeps.args[0].methods]
    assert "pyrodash_relay" in names and sweeps.args[0].models["pyrodash"] == {0.6: "p06"}
    assert any(m == "relay_oracle" for m in jobs["eval models alone, oracle"].args[0].methods)
    val = val_config(cfg)
    assert val.benchmarks == ["world:val"] and relay_points_in(val) and "relay_oracle" not in val.methods


def test_demo_relay_flag_is_accepted_and_changes_nothing(tmp_path, capsys):
    """`--relay` does nothing (one chain serves both kinds of point): it parses, and the demo's own flag checks still
    refuse a bad combination in one line before anything is written."""
    from pyrodash.cli import main

    assert main(["demo", "--relay", "--workers", "0", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--workers 0" in err and "--relay" not in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_an_elastic_step_gets_the_core_another_step_leaves_and_gives_it_back(tmp_path):
    """Two workers: the elastic step starts on one thread beside a short step, is granted the second core when that
    step ends, and the worker is back on one thread for the step after it. Outside a step there is no grant."""
    from pyrodash.jobs.scheduler import granted_threads

    grants, after = tmp_path / "grants", tmp_path / "after"
    jobs = [
        Job("elastic", watch_grant, (str(grants),), elastic=True),
        Job("short", note, (str(tmp_path / "x"), "s", 1.0)),
        Job("after", torch_threads, (str(after),), after=("elastic",)),
        Job("after 2", torch_threads, (str(tmp_path / "after2"),), after=("elastic",)),
    ]
    run_jobs(jobs, 2, tmp_path / "logs")
    assert grants.read_text() == "1,2"
    assert after.read_text() == (tmp_path / "after2").read_text() == "1"  # whichever worker ran the elastic step
    assert granted_threads() is None


def test_a_step_that_is_not_elastic_keeps_one_thread_and_gets_no_grant(tmp_path):
    grants = tmp_path / "grants"
    run_jobs(
        [Job("plain", watch_grant, (str(grants), 2.0)), Job("short", note, (str(tmp_path / "x"), "s", 0.2))],
        2,
        tmp_path / "logs",
    )
    assert grants.read_text() == "1;no grant"


def test_an_elastic_step_run_here_gets_a_grant_that_changes_nothing(tmp_path):
    """With one worker the steps run in this process: the elastic step is handed the grant, which is None here, so
    its threads stay the caller's."""
    import torch

    grants = tmp_path / "grants"
    run_jobs([Job("elastic", watch_grant, (str(grants), 0.3), elastic=True)], 1, tmp_path / "logs")
    assert grants.read_text() == str(torch.get_num_threads())


def test_a_step_that_becomes_ready_takes_its_core_back(tmp_path):
    """Three workers: the elastic step gets the core a short step leaves (2 threads), and gives it back when two
    steps become ready at once (1 thread)."""
    grants = tmp_path / "grants"
    x = str(tmp_path / "x")
    jobs = [
        Job("elastic", watch_grant, (str(grants), 40.0, "1,2,1"), elastic=True),
        Job("short", note, (x, "s", 0.5)),
        Job("medium", note, (x, "m", 4.0)),
        Job("a", note, (x, "a", 3.0), after=("medium",)),
        Job("b", note, (x, "b", 3.0), after=("medium",)),
    ]
    run_jobs(jobs, 3, tmp_path / "logs")
    assert grants.read_text() == "1,2,1"


def test_demo_refuses_from_scratch_with_a_built_world_in_one_line(tmp_path, capsys):
    from pyrodash.cli import main

    assert main(["demo", "--quick", "--from-scratch", "--world", str(tmp_path), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--from-scratch builds the world's models" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_the_steps_as_they_ran_and_their_critical_path(tmp_path):
    """run_jobs writes the step graph (seconds, what each waited for, start and end); the critical path is the chain
    whose seconds add up to the most: `a` (1 s) then `b`, not `c` beside them; benchmarks/demo_profile.py prints it."""
    import json
    import subprocess
    import sys

    from pyrodash.jobs.profile import critical_path, read_steps

    x = str(tmp_path / "x")
    jobs = [Job("a", note, (x, "a", 1.0)), Job("b", note, (x, "b"), after=("a",)), Job("c", note, (x, "c"))]
    seconds = run_jobs(jobs, 2, tmp_path / "run" / "jobs")
    steps = read_steps(tmp_path / "run" / "jobs")
    assert [(s["name"], s["after"], s["seconds"]) for s in steps] == [
        (j.name, list(j.after), seconds[j.name]) for j in jobs
    ]
    by = {s["name"]: s for s in steps}
    assert by["b"]["start_s"] >= by["a"]["end_s"] and by["a"]["end_s"] - by["a"]["start_s"] >= 1.0
    assert critical_path(steps) == (["a", "b"], round(seconds["a"] + seconds["b"], 1))
    (tmp_path / "run" / "demo_times.json").write_text(json.dumps({**seconds, "world": 2.0, "report": 0.5}))
    script = ROOT / "benchmarks" / "demo_profile.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [x.split()[0] for x in lines[:-1]] == ["world", "a", "c", "b", "report"]  # by start, outside steps around
    assert [x.split()[0] for x in lines[:-1] if x.endswith("critical")] == ["world", "a", "b", "report"]
    last = dict(kv.split("=") for kv in lines[-1].split())
    assert last["steps"] == "3" and last["critical_steps"] == "4"
    assert float(last["critical_s"]) == round(2.0 + 0.5 + seconds["a"] + seconds["b"], 1)


def test_the_critical_path_of_a_diamond_takes_the_longer_side():
    from pyrodash.jobs.profile import critical_path

    def step(name, sec, *after):
        return {"name": name, "seconds": sec, "after": list(after), "elastic": False, "start_s": 0, "end_s": 0}

    steps = [step("end", 1, "left", "right"), step("left", 5, "top"), step("right", 7, "top"), step("top", 2)]
    assert critical_path(steps) == (["top", "right", "end"], 10.0)
    steps.append(step("alone", 11))  # a step waiting for nothing, longer than the chain
    assert critical_path(steps) == (["alone"], 11.0)
    steps.append(step("reused-by", 1, "not here"))  # waits for a step reused from an earlier run
    assert critical_path(steps)[0] == ["alone"] and critical_path([]) == ([], 0.0)


def test_the_policys_long_conversations_wait_for_the_llms_whose_answers_they_read_back():
    """The range rule hands the policy's turns past it to the LLM alone: the same requests as the LLM's own gold-history
    turns, so the policy's step runs after the LLM's and reads those answers from the run's store."""
    from pyrodash.commands.demo import long_conversation_jobs

    cfg = EvalConfig(run_dir="r", benchmarks=["world:tier1"])
    names = {"stage3 λ=0.6", "eval pyrodash λ=0.6", "eval models alone, oracle"}
    jobs = {j.name: j for j in long_conversation_jobs(cfg, 0.6, names)}
    assert set(jobs["long conversations: pyrodash"].after) == {
        "range calibration",
        "long conversations: llm",
        "eval pyrodash λ=0.6",
    }
    assert jobs["long conversations: llm"].after == ("eval models alone, oracle",)
    # the calibration's LLM half needs no training: it waits for nothing, the calibration waits for it
    assert jobs["range calibration: llm"].after == ()
    assert set(jobs["range calibration"].after) == {"stage3 λ=0.6", "range calibration: llm"}


def test_a_step_that_starts_alone_takes_every_core_and_the_worker_gets_them_back(tmp_path):
    """Two workers: `first` starts with nothing beside it and nothing else ready (2 threads); `b` and `c` become ready
    together (1 each); `last` waits for both, so it starts alone again (2). steps.json says so."""
    import json

    def path(name):
        return str(tmp_path / name)

    jobs = [
        Job("first", torch_threads, (path("first"),)),
        Job("b", torch_threads, (path("b"),), after=("first",)),
        Job("c", torch_threads, (path("c"),), after=("first",)),
        Job("last", torch_threads, (path("last"),), after=("b", "c")),
    ]
    run_jobs(jobs, 2, tmp_path / "logs")
    got = {n: (tmp_path / n).read_text() for n in ("first", "b", "c", "last")}
    assert got == {"first": "2", "b": "1", "c": "1", "last": "2"}
    steps = json.loads((tmp_path / "logs" / "steps.json").read_text())["steps"]
    assert {s["name"]: s["threads"] for s in steps} == {"first": 2, "b": 1, "c": 1, "last": 2}
