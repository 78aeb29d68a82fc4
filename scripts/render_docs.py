"""Render the documentation's figures from stored results, so that every page quotes one source.

    python scripts/render_docs.py                         # rewrite every rendered span and generated page
    python scripts/render_docs.py --check                 # exit 1 naming each span or page that differs
    python scripts/render_docs.py --store runs/demo-quick quick-seed0   # keep a run's figures in docs/results/

A span in README.md or docs/**/*.md reads

    <!-- rendered: VIEW NAME -->...<!-- /rendered -->

and everything between the two comments is rewritten from `docs/results/NAME.json` (a run's `summary.json` trimmed to
what the docs quote, with the machine it ran on and the demo's step times). Views: `table` (the headline table),
`verdict` (the report's one-sentence Pareto verdict), `picked` (the operating points picked on val, read on test),
`machine` (the platform, in words), `demo-time` (the demo's wall time and its steps), `profile` (each step's seconds
and whether it is on the critical path), `seeds` (the picked points over world seeds: a `pyrodash demo --seeds`
output directory stored with `--store`), `spread` (their mean and min-max in a sentence), `bars` (the demo's bar
for a pick on test), `seeds-verdict` (which seeds' picks meet it, and which picks are fallbacks), `turns` (the seeds'
conversations per turn), `sizing` (docs/scaling.md's table for 1M requests a day, from a run's handoff rates),
`relay` (docs/relay.md's oracles and relay points of a run), `ablation` and `ablation-gaps` (the normalized against
the direct cost penalty, stored with a seeds run), `suite`
(where the test suite's CPU-seconds go: a profile a suite run wrote, `PYRODASH_SUITE_PROFILE=FILE`, stored with
`--store FILE NAME`; `benchmarks/suite_profile.py`).
The reference pages under docs/reference/ are generated whole (`doc_reference.py`).
Last line printed: `rendered=N changed=M` (`--check`: `checked=N stale=M`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from doc_reference import generated_pages  # noqa: E402
from suite_profile import suite_markdown, suite_rows  # noqa: E402

from pyrodash.eval.names import parse_method  # noqa: E402
from pyrodash.jobs.profile import demo_profile, profile_markdown  # noqa: E402
from pyrodash.report.markdown import md_table  # noqa: E402
from pyrodash.report.seeds import BARS, ORACLE, meets_bar, seeds_markdown  # noqa: E402
from pyrodash.report.tables import verdict_sentence  # noqa: E402
from pyrodash.report.turns import seed_turn_table, seed_turns  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
SPAN = re.compile(r"<!-- rendered: ([\w.+-]+) ([\w.+-]+) -->(.*?)<!-- /rendered -->", re.S)
KEPT = ("accuracy", "llm_token_ratio", "llm_calls", "cost_normalized", "n")


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"no stored results {path.relative_to(ROOT)}: store a run with --store RUN_DIR {name}")
    return json.loads(path.read_text())


def _row_key(name: str) -> tuple[str, str]:
    """(row label, with `{}` where the points' knobs go; the point's knob) of a method: one row per family or
    sweep, one point per knob."""
    base = {"slm": "SLM / SLM+SFT", "slm+sft": "SLM / SLM+SFT", "oracle": "Oracle single handoff"}
    if "@" not in name:
        return base.get(name, {"relay_oracle": "Oracle relay", "llm": "LLM"}.get(name, name)), ""
    relay = f", relay {name.rsplit('+relay', 1)[1]}" if "+relay" in name else ""
    name = name.split("+relay", 1)[0]  # the point's own knob, read without its relay mode
    family, _, value = parse_method(name)
    lam = name.split("@", 1)[1].split("+", 1)[0]
    if family in ("routellm", "glimprouter"):
        knob = "α" if family == "routellm" else "τ"
        return f"{'RouteLLM-MF' if knob == 'α' else 'GlimpRouter'}, one {knob} a point (most LLM first)", ""
    if value is None:
        return f"PyroDash λ={{}}{relay}", lam
    if "+bias" in name:
        return f"PyroDash λ={lam}{relay}, offload_bias {{}}", f"{value:+g}"
    return f"PyroDash λ={lam}{relay}, handoff_share {{}}", f"{value:g}"


def table(res: dict) -> str:
    """The headline table: one row per method family (or sweep), its points joined with ' / ' (the routers' most
    LLM first), in the stored order otherwise."""
    rows: dict[str, list[tuple[str, dict]]] = {}
    for name, m in res["methods"].items():
        label, point = _row_key(name)
        rows.setdefault(label, []).append((point, m))
    for label, points in rows.items():
        if "most LLM first" in label:
            points.sort(key=lambda pm: -pm[1]["cost_normalized"])
    out = [
        "| Method | Avg. acc. (%) | LLM token ratio (%) | LLM calls | Cost / LLM-only |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, points in rows.items():

        def col(key: str, fmt: str, scale: float = 1.0, points=points) -> str:
            return " / ".join(format(m[key] * scale, fmt) for _, m in points)

        name = label.replace("{}", " / ".join(p for p, _ in points))
        out.append(
            f"| {name} | {col('accuracy', '.2f', 100)} | {col('llm_token_ratio', '.1f', 100)} | "
            f"{col('llm_calls', '.2f')} | {col('cost_normalized', '.3f')} |"
        )
    return "\n".join(out)


def verdict(res: dict) -> str:
    """The report's verdict sentence (`pyrodash.report.tables.verdict_sentence`) on the stored figures."""
    ms = {
        n: SimpleNamespace(name=n, cost_usd=m["cost_normalized"], **{k: m[k] for k in ("accuracy", "cost_normalized")})
        for n, m in res["methods"].items()
    }
    return verdict_sentence(ms)


def picked(res: dict) -> str:
    """The operating points picked on val (summary.json `selection`, `pyrodash.report.select`) and their test figures
    beside the oracle's: the headline a user can bank on."""
    sel = res.get("selection")
    if not sel:
        raise SystemExit("the stored results have no selection: store a demo run (it picks on world:val) with --store")
    out = [
        "| Picked on val | Criterion | Val acc. (%) / cost | Test acc. (%) / cost | Oracle on test |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind, s in sel.items():
        v, t, o = s["val"], s.get("test") or {}, s.get("oracle") or {}
        fig = lambda m: f"{100 * m['accuracy']:.2f} / {m['cost_normalized']:.3f}" if m else "--"  # noqa: E731
        label = {"single": "single handoff", "relay": "relay"}.get(kind, kind)
        crit = s["criterion"]["text"] + ("" if s["met"] else " (none met it: the fallback)")
        out.append(f"| {label}: `{s['picked']}` | {crit} | {fig(v)} | {fig(t)} | {fig(o)} |")
    return "\n".join(out)


def machine(res: dict) -> str:
    p = res["platform"]
    cores = f"{p['cores']}-core " if p.get("cores") else ""
    chosen = f", chosen with {p['kernels_set_by']}" if p.get("kernels_set_by") else ""
    return f"{cores}{p.get('cpu', 'CPU')} ({p.get('cpu_capability')} kernels{chosen}), torch {p.get('torch')}"


def demo_time(res: dict) -> str:
    t = res.get("times") or {}
    if "training + evaluation (wall)" not in t:
        raise SystemExit(
            "the stored results have no demo times (demo_times.json): store the demo's run with "
            "`python scripts/render_docs.py --store RUN_DIR NAME`"
        )
    world, jobs, report = t.get("world", 0.0), t["training + evaluation (wall)"], t.get("report", 0.0)
    total = world + jobs + report
    return (
        f"{total / 60:.1f} min on a {machine(res)} (world {world:.0f} s, training and evaluation {jobs:.0f} s, "
        f"report {report:.0f} s)"
    )


def profile(res: dict) -> str:
    """The stored demo's steps: seconds, threads, on the critical path (`pyrodash.jobs.profile.demo_profile`)."""
    if not res.get("profile"):
        raise SystemExit("the stored results have no step profile: store a demo run whose jobs/steps.json exists")
    t = res["profile"]["totals"]
    return (
        f"{profile_markdown([tuple(r) for r in res['profile']['rows']])}\n\n{t['sum_s']:.0f} one-thread seconds over "
        f"{t['steps']} steps in the graph; a critical path of {t['critical_s']:.0f} s over {t['critical_steps']} "
        f"steps; {t['wall_s']} s of demo from the world to the report."
    )


def seeds(res: dict) -> str:
    """The picked points per world seed and their spread (`pyrodash.report.seeds`)."""
    if not res.get("seeds"):
        raise SystemExit("the stored results have no seeds: store a `pyrodash demo --seeds` output directory")
    return "\n".join(seeds_markdown(res["seeds"]))


def bars(res: dict) -> str:
    """The demo's bars for a picked point on test (`pyrodash.report.seeds.BARS`, which `tests/test_demo.py` checks),
    for the kinds the stored seeds run picked, in one sentence."""
    kinds = dict.fromkeys(r["kind"] for r in res["seeds"]["rows"])
    return "; ".join(f"{_KIND[k]}: {BARS[k]} of LLM-only, on test" for k in kinds)


_KIND = {"single": "the single-handoff pick", "relay": "the relay's pick"}


def _seed_list(seeds: list) -> str:
    if not seeds:
        return "no seed"
    names = [str(s) for s in seeds]
    return ("seed " if len(names) == 1 else "seeds ") + (
        names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    )


def seeds_verdict(res: dict) -> str:
    """Which seeds' picks meet their bar on test, per kind, and which picks are fallbacks (no candidate met the
    criterion on that seed's val, so the most accurate one was served): the seeds table in one sentence."""
    rows = res["seeds"]["rows"]
    out = []
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        meets = [r["seed"] for r in mine if meets_bar(r)]
        misses = [r["seed"] for r in mine if meets_bar(r) is False]
        fallback = [r["seed"] for r in mine if not r["met"]]
        text = f"{_KIND[kind]} meets its bar on {_seed_list(meets)}"
        if misses and meets:
            text += f" and misses it on {_seed_list(misses)}"
        if fallback:
            text += (
                f" ({_seed_list(fallback)}: a fallback, no point reached the criterion on `world:val`, so the most "
                "accurate there was picked)"
            )
        out.append(text)
    return "; ".join(out)


def turns(res: dict) -> str:
    """The seeds' conversations per turn (`pyrodash.report.turns.seed_turn_table`)."""
    if not res.get("turns"):
        raise SystemExit("the stored results have no per-turn figures: store a `pyrodash demo --seeds` directory again")
    return "\n".join(seed_turn_table(res["turns"]))


def _ablation_points(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(normalized, direct nearest in LLM calls) pairs of a seed's matched rows, by normalized λ."""
    return sorted(((r["normalized"], r["direct"]) for r in rows), key=lambda nd: nd[0]["lambda"])


def _turn3(p: dict) -> str:
    return "--" if p.get("turn3_self") is None else f"{100 * p['turn3_self']:.0f}"


def ablation(res: dict) -> str:
    """The normalized against the direct cost penalty per seed (`benchmarks/cost_penalty_ablation.py`'s
    cost_penalty.json, stored with a seeds run): single questions as accuracy at LLM calls (cost / LLM-only), and
    own-history turn 3, the normalized point beside the direct one closest to it in LLM calls (each cell: normalized /
    direct)."""
    if not res.get("ablation"):
        raise SystemExit("the stored results have no cost-penalty ablation: run benchmarks/cost_penalty_ablation.py")
    rows = []
    for seed, ab in res["ablation"].items():
        for n, d in _ablation_points(ab["matched"]):
            rows.append([
                seed,
                f"{n['lambda']:g} / {d['lambda']:g}",
                f"{100 * n['accuracy']:.1f} / {100 * d['accuracy']:.1f}",
                f"{n['llm_calls']:.2f} / {d['llm_calls']:.2f}",
                f"{n['cost']:.3f} / {d['cost']:.3f}",
                f"{_turn3(n)} / {_turn3(d)}",
            ])  # fmt: skip
    header = ["seed", "λ", "accuracy (%)", "LLM calls", "cost / LLM-only", "turn 3, own history (%)"]
    return "\n".join(md_table(header, rows))


def ablation_gaps(res: dict) -> str:
    """The ablation table's largest differences between matched points, in one sentence."""
    pairs = [(s, n, d) for s, ab in res["ablation"].items() for n, d in _ablation_points(ab["matched"])]
    calls = max(abs(n["llm_calls"] - d["llm_calls"]) for _, n, d in pairs)
    s, n, d = max(pairs, key=lambda p: abs(p[1]["accuracy"] - p[2]["accuracy"]))
    turn = [
        abs(n["turn3_self"] - d["turn3_self"]) for _, n, d in pairs if None not in (n["turn3_self"], d["turn3_self"])
    ]
    base = sorted(ab["mean_cost_base_usd"] for ab in res["ablation"].values())
    spreads = [ab["cost_base"] for ab in res["ablation"].values()]
    cvs = sorted(c["cv"] for c in spreads)
    lo, hi = min(c["min"] for c in spreads), max(c["max"] for c in spreads)
    return (
        f"over {len(pairs)} matched pairs the LLM-call rates differ by at most {calls:.2f}; single-question accuracy "
        f"by at most {100 * abs(n['accuracy'] - d['accuracy']):.1f} points (seed {s}, normalized λ {n['lambda']:g}), "
        f"own-history turn 3 by at most {100 * max(turn):.0f} points. Cost_base over the training prompts: a mean of "
        f"{base[0]:.2e} to {base[-1]:.2e} $ by seed, from {lo:.1e} to {hi:.1e} $, a coefficient of variation of "
        f"{cvs[0]:.2f} to {cvs[-1]:.2f}"
    )


def relay(res: dict) -> str:
    """docs/relay.md's rows of a stored run: the single-handoff oracle, the relay oracle and every relay point (a
    method served with several LLM calls), each with its accuracy, cost, LLM output tokens and LLM calls."""
    points = [n for n in res["methods"] if "+relay" in n]
    if not points:
        raise SystemExit("the stored results have no relay points: store a run that evaluates a relay method")
    names = [n for n in ("oracle", "relay_oracle") if n in res["methods"]] + points
    label = {"oracle": "oracle (single handoff)", "relay_oracle": "relay oracle"}
    rows = [
        [
            label.get(n, f"`{n}`"),
            f"{100 * m['accuracy']:.2f}",
            f"{m['cost_normalized']:.3f}",
            f"{100 * m['llm_token_ratio']:.1f}",
            f"{m['llm_calls']:.2f}",
        ]
        for n, m in ((n, res["methods"][n]) for n in names)
    ]
    header = ["method", "accuracy (%)", "cost / LLM-only", "LLM token ratio (%)", "LLM calls per answer"]
    return "\n".join(md_table(header, rows))


# docs/scaling.md "1M requests a day": the sizing arithmetic, with the assumptions that page states above the table
PEAK_RPS = 3 * 1e6 / 86400  # a peak of 3x the average of 1M requests a day
PAPER_RATES = (
    ("paper, cost table: λ=0.05", 0.975),
    ("paper, cost table: λ=0.1", 0.058),
    ("paper, cost table: λ=0.6", 0.012),
)
SIZED = ("pyrodash@0.05", "pyrodash@0.6")  # the world's measured rates shown beside the pick on val


def _sizing_row(label: str, h: float, slm_tokens: float, llm_out: float = 3000.0, llm_in: float = 1200.0) -> list:
    """One row: CE CPU = 1.7 ms + 59 µs a token; SLM GPUs at 4,600 tokens/s; the paper's price sheet; SLM prompt 150."""
    cpu_ms = 1.7 + 0.059 * (slm_tokens + h * llm_out)
    procs, slm_tps = PEAK_RPS * cpu_ms / 1000 / 0.7, PEAK_RPS * slm_tokens
    llm_usd = 1e6 * h * (0.90 * llm_in + 2.86 * llm_out) / 1e6
    slm_usd = 1e6 * (0.05 * 150 + 0.08 * slm_tokens) / 1e6 if slm_tokens else 0.0
    cells = [label, f"{h:.3g}", f"{slm_tokens:,.0f}", f"{cpu_ms:.0f} ms", f"{math.ceil(procs)} ({procs:.1f})"]
    cells += [f"{slm_tps:,.0f}", f"{math.ceil(slm_tps / 4600)} ({slm_tps / 4600:.1f})" if slm_tps else "0"]
    return cells + [f"${llm_usd:,.0f}", f"${slm_usd:,.0f}", f"${llm_usd + slm_usd:,.0f}"]


def sizing(res: dict) -> str:
    """docs/scaling.md's table for 1M requests a day: the handoff rate h (LLM calls per example) of the stored run's
    λ 0.05 and 0.6 and of its single-handoff pick on val, then the paper's rates and the LLM alone. The SLM alone
    writes 2,000 tokens or hands off after 1,000; a handoff sends 1,200 tokens and the LLM writes 3,000."""
    pick = (res.get("selection") or {}).get("single", {}).get("picked")
    measured = [(f"world, measured: full demo λ={n.split('@')[1]}", n) for n in SIZED if n in res["methods"]]
    if pick:
        measured.append((f"world, measured: full demo's pick on val (`{pick}`)", pick))
    rates = [(label, res["methods"][n]["llm_calls"]) for label, n in measured] + list(PAPER_RATES)
    header = ["handoff rate from", "h", "SLM tokens / request", "CE CPU / request", "CE processes (cores)"]
    header += ["SLM tokens/s at peak", "SLM GPUs at 4,600 tok/s", "LLM $/day", "SLM $/day", "total $/day"]
    rows = [_sizing_row(label, h, 2000 - 1000 * h) for label, h in rates]
    rows.append(_sizing_row("LLM only (no SLM; 150 in, 4,000 out)", 1.0, 0.0, llm_out=4000.0, llm_in=150.0))
    return "\n".join(md_table(header, rows))


def spread(res: dict) -> str:
    """The picks' spread over the seeds in one sentence per kind (the lines under `seeds`' table)."""
    lines = [ln[2:] for ln in seeds(res).splitlines() if ln.startswith("- ")]
    return "; ".join(lines)


def suite(res: dict) -> str:
    """The test suite's CPU-seconds by part and the floor they put under its wall (`benchmarks/suite_profile.py`)."""
    if not res.get("suite"):
        raise SystemExit("the stored results have no suite profile: store the file PYRODASH_SUITE_PROFILE wrote")
    rows, t = res["suite"]["rows"], res["suite"]["totals"]
    return (
        f"{suite_markdown([tuple(r) for r in rows])}\n\n{t['cpu_s']:.0f} CPU-seconds ({t['builds_cpu_s']:.0f} in "
        f"the background builds, {t['tests_cpu_s']:.0f} in the tests) on {t['cores']} cores: with every core busy the "
        f"whole time, at least {t['floor_s'] / 60:.1f} min; the run took {t['wall_s'] / 60:.1f} min of pytest on a "
        f"{machine(res)}."
    )


VIEWS = {
    "spread": spread,
    "bars": bars,
    "seeds-verdict": seeds_verdict,
    "table": table,
    "verdict": verdict,
    "machine": machine,
    "demo-time": demo_time,
    "picked": picked,
    "profile": profile,
    "seeds": seeds,
    "turns": turns,
    "sizing": sizing,
    "relay": relay,
    "ablation": ablation,
    "ablation-gaps": ablation_gaps,
    "suite": suite,
}


def render_text(text: str) -> str:
    """`text` with every span rewritten; a span that starts on its own line stays a block."""

    def one(m: re.Match) -> str:
        view, name = m.group(1), m.group(2)
        if view not in VIEWS:
            raise SystemExit(f"unknown view {view!r} in <!-- rendered: {view} {name} -->; one of {sorted(VIEWS)}")
        body = VIEWS[view](load(name))
        if m.group(3).startswith("\n"):
            body = f"\n{body}\n"
        return f"<!-- rendered: {view} {name} -->{body}<!-- /rendered -->"

    return SPAN.sub(one, text)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def targets() -> dict[Path, str]:
    """Every file this script owns a part of, with its rendered text."""
    out = {p: render_text(p.read_text()) for p in doc_pages() if SPAN.search(p.read_text())}
    out.update({ROOT / rel: text for rel, text in generated_pages().items()})
    return out


def store(run_dir: Path, name: str) -> Path:
    """docs/results/NAME.json from a run: its summary's methods (the quoted fields), platform, demo times and step
    profile; or from a `pyrodash demo --seeds` directory (its seeds.json), the seeds' picks with seed 0's platform; or
    from a suite profile (the file `PYRODASH_SUITE_PROFILE` names), its parts' CPU-seconds (`suite_rows`)."""
    if run_dir.is_file():
        profile = json.loads(run_dir.read_text())
        rows, totals = suite_rows(profile)
        return _write({"what": "a run of the test suite", "platform": profile["platform"],
                       "suite": {"rows": rows, "totals": totals}}, name)  # fmt: skip
    if (run_dir / "seeds.json").is_file():
        spread = json.loads((run_dir / "seeds.json").read_text())
        first = run_dir / f"seed{spread['seeds'][0]}" / "summary.json"
        platform = {**json.loads(first.read_text()).get("platform", {}), "cores": os.cpu_count()}
        per_turn = {
            str(s): seed_turns(json.loads((run_dir / f"seed{s}" / "summary.json").read_text())["per_turn_by_benchmark"])
            for s in spread["seeds"]
        }
        res = {"what": f"the seeds run {run_dir.name}", "platform": platform, "seeds": spread, "turns": per_turn}
        ablations = {s: run_dir / f"seed{s}" / "cost_penalty.json" for s in spread["seeds"]}
        if any(p.is_file() for p in ablations.values()):  # benchmarks/cost_penalty_ablation.py, run on the seeds
            res["ablation"] = {str(s): _ablation(p) for s, p in ablations.items() if p.is_file()}
        return _write(res, name)
    summary = json.loads((run_dir / "summary.json").read_text())
    times = run_dir / "demo_times.json"
    platform = {**summary.get("platform", {}), "cores": os.cpu_count()}
    res = {
        "what": f"the run {run_dir.name}",
        "source": f"{run_dir.name}/summary.json; cores: the machine that stored it",
        "platform": platform,
        "times": json.loads(times.read_text()) if times.is_file() else {},
        "profile": _profile(run_dir),
        "methods": {n: {k: m[k] for k in KEPT if k in m} for n, m in summary["methods"].items()},
    }
    if summary.get("selection"):  # the points picked on val (the `picked` view), without their candidate lists
        res["selection"] = {k: _picked(run_dir, k, s) for k, s in summary["selection"].items()}
    return _write(res, name)


def _ablation(path: Path) -> dict:
    """A seed's cost_penalty.json trimmed to what the `ablation` views read, with the spread of the Cost_base it
    divides by (the run's cost_base.json beside it)."""
    cp = json.loads(path.read_text())
    base = [e["cost_base"] for e in json.loads((path.parent / "cost_base.json").read_text()).values()]

    def keep(p: dict) -> dict:
        return {k: p[k] for k in ("lambda", "accuracy", "llm_calls", "cost")} | {
            "turn3_self": (p.get("turns_self") or {}).get("3")
        }

    rows = [{"normalized": keep(r["normalized"]), "direct": keep(r["direct_nearest"])} for r in cp["matched"]]
    spread = {"cv": statistics.pstdev(base) / statistics.fmean(base), "min": min(base), "max": max(base)}
    return {"mean_cost_base_usd": cp["mean_cost_base_usd"], "cost_base": spread, "matched": rows}


def _profile(run_dir: Path) -> dict:
    """The demo's step profile as stored: its rows and totals (`pyrodash.jobs.profile.demo_profile`), or {}."""
    if not (run_dir / "jobs" / "steps.json").is_file():
        return {}
    rows, totals = demo_profile(run_dir)
    return {"rows": rows, "totals": totals}


def _write(res: dict, name: str) -> Path:
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    return path


def _picked(run_dir: Path, kind: str, sel: dict) -> dict:
    """One kind's selection as stored: criterion, point, val and test figures, and the oracle's on test beside it."""
    methods = json.loads((run_dir / "summary.json").read_text())["methods"]
    oracle = ORACLE[kind]
    keep = lambda m: {k: m[k] for k in KEPT if k in m} if m else None  # noqa: E731
    out = {k: sel[k] for k in ("criterion", "picked", "met", "operating_point", "val_split") if k in sel}
    return out | {"val": keep(sel["val"]), "test": keep(sel.get("test")), "oracle": keep(methods.get(oracle))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a span or page is stale")
    ap.add_argument("--store", nargs=2, metavar=("RUN_DIR", "NAME"), help="keep RUN_DIR's figures as NAME first")
    args = ap.parse_args(argv)
    if args.store:
        print(f"stored {store(Path(args.store[0]), args.store[1]).relative_to(ROOT)}")
    stale = []
    done = targets()
    for path, text in done.items():
        if not path.is_file() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    for p in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {p}")
    print(f"checked={len(done)} stale={len(stale)}" if args.check else f"rendered={len(done)} changed={len(stale)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
