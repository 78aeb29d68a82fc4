"""Reports are recomputed from stored records: costs, ratios, calls, trigger positions, re-pricing, files."""

from __future__ import annotations

import json
import random

import pytest

from pyrodash.cli import main
from pyrodash.cost import Prices, Usage
from pyrodash.eval.names import parse_method, sort_key, sweep_kind
from pyrodash.record import read_record, usage_of
from pyrodash.report.load import load_run
from pyrodash.report.metrics import Metrics, compute_metrics, first_llm_step, trigger_positions
from pyrodash.report.plots import series
from pyrodash.report.render import render, write_report


def _simulate(method: str, ex: dict, rng: random.Random) -> dict:
    """A record produced by running a toy policy over the example's steps: counts come from the texts it writes."""
    steps = ex["steps"]
    hard = ex["hard_steps"]
    fam, knob, _ = parse_method(method)
    segs: list[dict] = []
    usage = Usage(slm_in=len(ex["question"]))
    for i, step in enumerate(steps):
        text = step + ("\n\n" if i < len(steps) - 1 else "")
        to_llm = (
            fam == "llm"
            or (fam == "pyrodash" and knob < 0.5 and i in hard)
            or (fam == "glimprouter" and rng.random() < 0.5)
        )
        if fam == "pyrodash" and segs and segs[-1]["model"] == "llm":
            to_llm = True  # single handoff: the LLM finishes
        prefix = "".join(s["text"] for s in segs)
        if to_llm:
            if fam == "llm":
                usage = Usage()
            usage = usage + Usage(
                llm_in=len(ex["question"]) + len(prefix),
                llm_out=len(text),
                llm_calls=int(not segs or segs[-1]["model"] != "llm"),
            )
        else:
            usage = usage + Usage(slm_out=len(text))
        segs.append({"model": "llm" if to_llm else "slm", "text": text})
    solved_hard = all(any(s["model"] == "llm" for s in segs[h : h + 1]) for h in hard)
    return {
        "id": ex["id"],
        "benchmark": ex["benchmark"],
        "sample": 0,
        "question": ex["question"],
        "gold": "1",
        "output": "".join(s["text"] for s in segs),
        "correct": solved_hard,
        "usage": usage.to_dict(),
        "llm_calls": usage.llm_calls,
        "segments": segs,
        "meta": {"hard_steps": hard, "steps": steps},
        "handoff": None,
    }


METHODS = ["slm", "llm", "pyrodash@0.1", "pyrodash@0.6", "glimprouter@0.9"]


def make_run(tmp_path, prices: Prices | None = None):
    rng = random.Random(0)
    exs = []
    for b in ("alpha", "beta"):
        for i in range(6):
            n = rng.randint(2, 5)
            exs.append(
                {
                    "id": f"{b}-{i}",
                    "benchmark": b,
                    "question": f"q{i} " * rng.randint(2, 9),
                    "steps": [f"s{j}=" + "x" * rng.randint(1, 12) for j in range(n)],
                    "hard_steps": sorted(rng.sample(range(n), rng.randint(0, 1))),
                }
            )
    rec = tmp_path / "records"
    rec.mkdir(parents=True)
    runs = {}
    for m in METHODS:
        runs[m] = [_simulate(m, ex, rng) for ex in exs]
        (rec / f"{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs[m]))
    if prices:
        (tmp_path / "config.resolved.json").write_text(json.dumps({"prices": prices.to_dict()}))
    return runs


def test_summary_recomputed_from_records(tmp_path):
    runs = make_run(tmp_path)
    paper = Prices.from_yaml("paper")
    write_report(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())["methods"]
    assert set(summary) == set(METHODS)
    for m, recs in runs.items():
        usages = [usage_of(r) for r in recs]
        assert summary[m]["cost_usd"] == pytest.approx(sum(u.cost(paper) for u in usages))
        out_l, out_s = sum(u.llm_out for u in usages), sum(u.slm_out for u in usages)
        assert summary[m]["llm_token_ratio"] == pytest.approx(out_l / (out_l + out_s))
        assert summary[m]["llm_calls"] == pytest.approx(sum(u.llm_calls for u in usages) / len(recs))
        accs = [sum(r["correct"] for r in recs if r["benchmark"] == b) / 6 for b in ("alpha", "beta")]
        assert summary[m]["accuracy"] == pytest.approx(sum(accs) / 2)
    assert summary["slm"]["llm_token_ratio"] == 0 and summary["llm"]["llm_token_ratio"] == 1
    assert summary["pyrodash@0.6"]["llm_calls"] == 0 < summary["pyrodash@0.1"]["llm_calls"]
    md = (tmp_path / "report.md").read_text()
    for head in ("Table 1", "Table 2", "Table 3", "Table 4", "Trigger positions", "Case studies", "Re-pricing"):
        assert head in md
    assert "λ=0.1" in md and "λ=0.6" in md
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_repricing_scales_with_sheet(tmp_path):
    runs = make_run(tmp_path)
    doubled = Prices(0.10, 0.16, 1.80, 5.72)
    _, base, _ = render(tmp_path)
    _, re, _ = render(tmp_path, doubled)
    for m in runs:
        assert re["methods"][m]["cost_usd"] == pytest.approx(2 * base["methods"][m]["cost_usd"])
        assert re["methods"][m]["accuracy"] == base["methods"][m]["accuracy"]


def test_run_sheet_is_default(tmp_path):
    cheap = Prices(0.01, 0.01, 0.01, 0.01)
    runs = make_run(tmp_path, prices=cheap)
    _, s, _ = render(tmp_path)
    u = sum((usage_of(r) for r in runs["llm"]), Usage())
    assert s["methods"]["llm"]["cost_usd"] == pytest.approx(u.cost(cheap))


def test_trigger_positions():
    def rec(segs, hard):
        return {"segments": [{"by": m, "text": t} for m, t in segs], "meta": {"hard_steps": hard}}

    assert first_llm_step(rec([("slm", "a\n\nb\n\n"), ("llm", "c")], [])) == 2
    assert first_llm_step(rec([("slm", "a\n\nb")], [])) is None
    recs = [
        rec([("slm", "a\n\n"), ("llm", "b")], [2]),  # before
        rec([("slm", "a\n\nb\n\n"), ("llm", "c")], [2]),  # at
        rec([("slm", "a\n\nb\n\nc\n\n"), ("llm", "d")], [1, 2]),  # after
        rec([("llm", "a")], []),  # no hard step
        rec([("slm", "a")], [0]),
    ]  # hard, no handoff
    assert trigger_positions(recs) == {
        "before": 1,
        "at": 1,
        "after": 1,
        "no_hard_step": 1,
        "hard_no_handoff": 1,
        "handoffs": 4,
    }


def test_torn_last_line_and_bad_names(tmp_path):
    make_run(tmp_path)
    path = tmp_path / "records" / "slm.jsonl"
    n = len(path.read_text().splitlines())
    with path.open("a") as f:
        f.write('{"id": "torn", "bench')
    assert len(load_run(tmp_path)["slm"]) == n
    (tmp_path / "records" / "mystery.jsonl").write_text("")
    with pytest.raises(ValueError, match="scheme"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="pyrodash eval"):
        load_run(tmp_path / "nowhere")


def test_cli(tmp_path, capsys):
    make_run(tmp_path)
    assert main(["report", str(tmp_path), "--prices", "cached"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--prices", "no-such-sheet"]) == 2


def test_duplicated_records_count_once_keeping_the_last(tmp_path, capsys):
    runs = make_run(tmp_path)
    path = tmp_path / "records" / "slm.jsonl"
    first = runs["slm"][0]
    n = len(runs["slm"])
    flipped = {**first, "correct": not first["correct"]}
    with path.open("a") as f:  # the same (benchmark, id, sample) again, graded the other way, plus an exact copy
        f.write(json.dumps(flipped) + "\n" + json.dumps(runs["slm"][1]) + "\n")
    dups: dict = {}
    loaded = load_run(tmp_path, dups)["slm"]
    assert len(loaded) == n and dups == {"slm": 2}
    assert [r for r in loaded if r["id"] == first["id"]] == [read_record(flipped)]  # the last line wins
    md, summary, ms = render(tmp_path)
    assert ms["slm"].n == n
    expect = compute_metrics("slm", [flipped] + runs["slm"][1:], Prices.from_yaml("paper"))
    assert ms["slm"].accuracy == pytest.approx(expect.accuracy)
    assert ms["slm"].cost_usd == pytest.approx(expect.cost_usd)
    assert summary["duplicates_dropped"] == {"slm": 2} and "Duplicate records ignored" in md
    assert main(["report", str(tmp_path)]) == 0
    assert "duplicate records ignored" in capsys.readouterr().out


def test_sweep_names_parse_sort_and_draw_as_their_own_series():
    assert parse_method("pyrodash@0.6+share0.25") == ("pyrodash", 0.6, 0.25)
    assert parse_method("pyrodash@0.6+bias-2") == ("pyrodash", 0.6, -2.0)
    assert [sweep_kind(n) for n in ("pyrodash@0.6+share0.5", "pyrodash@0.6+bias1", "pyrodash@0.6", "llm")] == [
        "share",
        "bias",
        None,
        None,
    ]
    with pytest.raises(ValueError, match="only pyrodash"):
        parse_method("routellm@0.5+share0.5")
    names = ["llm", "pyrodash@0.6+share0.5", "pyrodash@0.6+bias1", "pyrodash@0.6", "slm", "pyrodash@0.6+share0.25"]
    assert sorted(names, key=sort_key) == [
        "slm",
        "pyrodash@0.6",
        "pyrodash@0.6+bias1",
        "pyrodash@0.6+share0.25",
        "pyrodash@0.6+share0.5",
        "llm",
    ]
    ms = {
        n: Metrics(
            name=n,
            per_benchmark={},
            accuracy=0.5,
            llm_token_ratio=0.0,
            llm_calls=0.0,
            cost_usd=1.0,
            usage=Usage(),
            usage_by_benchmark={},
            n=1,
        )
        for n in names
    }
    s = series(ms)
    # a share sweep ends at its policy (share 1), a bias sweep passes through it (bias 0)
    assert [k for k, _ in s["pyrodash@0.6 share sweep"]] == [0.25, 0.5, 1.0]
    assert [k for k, _ in s["pyrodash@0.6 bias sweep"]] == [0.0, 1.0]


@pytest.mark.parametrize(
    "provenance, says",
    [
        (
            {"models_from": "/x/checkpoints/seed0", "models_shipped": True},
            "models: the base models that ship with PyroDash, copied from /x/checkpoints/seed0",
        ),
        (
            {"models_from": "/cache/worlds/other", "models_shipped": False},
            "models: copied from the world at /cache/worlds/other",
        ),
        (
            {"models_from": "/cache/worlds/other", "models_shipped": False, "measurements_from": "/cache/worlds/other"},
            "(pretrained there in ? s); their measurements copied too (same platform).",
        ),
        (
            {"models_from": None, "models_shipped": False, "timings": {"pretrain_wall": 194.9}},
            "models: pretrained by its build (194.9 s)",
        ),
    ],
)
def test_the_report_names_the_world_and_where_its_base_models_come_from(tmp_path, provenance, says):
    run = tmp_path / "run"
    make_run(run)
    world = tmp_path / "world"
    world.mkdir()
    (world / "world.json").write_text(json.dumps({"seed": 0, "config_hash": "abc", **provenance}))
    (run / "config.resolved.json").write_text(json.dumps({"world_dir": str(world)}))
    md, _, _ = render(run)
    line = next(x for x in md.splitlines() if x.startswith("World:"))
    assert f"`{world}` (seed 0, config hash abc)" in line and says in line
    (world / "world.json").unlink()  # a world that is gone: no line, no error
    assert "World:" not in render(run)[0]


def test_the_report_names_the_platform_of_the_run(tmp_path, monkeypatch):
    """report.md and summary.json name the platform (torch, CPU capability, CPU, threads): the run's
    `platform.json` where it recorded one (`pyrodash demo` does), else the machine writing the report, marked as such;
    the rest of summary.json does not depend on it."""
    from pyrodash.report.platform import PLATFORM_FILE, record_platform
    from pyrodash.world.shipped import platform

    make_run(tmp_path)
    md, summary, _ = render(tmp_path)
    here = summary.pop("platform")
    assert {k: here[k] for k in platform()} == platform() and here["threads"] >= 1 and here["source"] == "report"
    assert f"CPU capability {here['cpu_capability']}" in md and "the run recorded none" in md
    recorded = {**platform(), "cpu_capability": "AVX2", "cpu": "GenuineIntel Some CPU", "threads": 2, "workers": 2}
    (tmp_path / PLATFORM_FILE).write_text(json.dumps(recorded))
    md, again, _ = render(tmp_path)
    assert again.pop("platform") == {**recorded, "source": "run"} and again == summary
    line = next(x for x in md.splitlines() if x.startswith("Platform: "))
    assert "CPU capability AVX2, GenuineIntel Some CPU, 2 torch threads, 2 worker processes" in line
    assert "recorded by the run" in line
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    written = record_platform(tmp_path, workers=3)
    assert written == {**platform(), "threads": written["threads"], "workers": 3}
    write_report(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["platform"] == {**written, "source": "run"}
    # kernels chosen by the environment (AVX2 ones on an AVX-512 CPU, say) are named as such
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert record_platform(tmp_path)["kernels_set_by"] == "ATEN_CPU_CAPABILITY"
    md, _, _ = render(tmp_path)
    assert "(set by ATEN_CPU_CAPABILITY)" in next(x for x in md.splitlines() if x.startswith("Platform: "))
