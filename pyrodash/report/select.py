"""Picking an operating point on validation data and reporting it on test: `pyrodash select`, the demo and the report's
"Picked on val" section.

    sel = select_run("runs/demo-quick", Criterion("min_accuracy", 0.98))          # reads runs/demo-quick/val
    sel = select_run("runs/demo-quick", Criterion("max_cost", 0.5), relay=True)   # the relay points in RUN/val

A run's PyroDash points (every `pyrodash@<λ>` and its offload_bias / handoff_share / relay sweeps,
`pyrodash.eval.names`) evaluated on a validation split are the candidates; the criterion picks one on those figures
alone: `min_accuracy` the cheapest (cost / LLM-only) at or above that accuracy, `max_cost` the most accurate at or
under that cost / LLM-only, `budget_usd_per_question` the most accurate at or under that many dollars per question.
When no candidate meets it, the most accurate point (min_accuracy) or the cheapest one (the others) is picked and the
selection says so (`met`).
The test figures of the picked point are read afterwards, from the run's test evaluation: they decide nothing.
`RUN/selection.json` holds the selection per kind (`single`, `relay`); the report reads it (`figures_on_test`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pyrodash.cost import Prices
from pyrodash.eval.names import parse_method, relay_calls, sweep_kind
from pyrodash.report.load import load_run, run_prices, single_turn
from pyrodash.report.markdown import md_table
from pyrodash.report.metrics import Metrics, all_metrics

SELECTION_FILE = "selection.json"
KINDS = {"single": "single handoff", "relay": "relay"}
# criterion kind -> (the figure it bounds, how the criterion reads, what the fallback is)
CRITERIA = {
    "min_accuracy": ("accuracy", "the cheapest point at >= {v:.2%} accuracy", "the most accurate point"),
    "max_cost": ("cost_normalized", "the most accurate point at <= {v:g} of LLM-only cost", "the cheapest point"),
    "budget_usd_per_question": (
        "usd_per_question",
        "the most accurate point at <= ${v:g} per question",
        "the cheapest point",
    ),
}


@dataclass(frozen=True)
class Criterion:
    """What a selection asks for: `kind` one of `CRITERIA`, `value` its bound."""

    kind: str
    value: float

    def __post_init__(self) -> None:
        if self.kind not in CRITERIA:
            raise ValueError(f"criterion {self.kind!r}: choose one of {sorted(CRITERIA)}")
        if self.kind == "min_accuracy" and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"--min-accuracy {self.value:g}: give a fraction in [0, 1], e.g. 0.98")
        if self.kind != "min_accuracy" and not self.value > 0:
            raise ValueError(f"--{self.kind.replace('_', '-')} {self.value:g}: give a number above 0")

    def text(self) -> str:
        return CRITERIA[self.kind][1].format(v=self.value)

    def meets(self, c: Candidate) -> bool:
        figure = getattr(c, CRITERIA[self.kind][0])
        return figure >= self.value if self.kind == "min_accuracy" else figure <= self.value

    def better(self, c: Candidate) -> tuple:
        """The order among candidates that meet it (the largest wins): cheaper first for min_accuracy, more accurate
        first for the cost bounds; ties to the more accurate, then the cheaper, then the name."""
        if self.kind == "min_accuracy":
            return (-c.cost_normalized, c.accuracy, c.name)
        return (c.accuracy, -c.cost_normalized, c.name)

    def fallback(self, c: Candidate) -> tuple:
        """The order when none meets it: the most accurate (min_accuracy), else the cheapest."""
        if self.kind == "min_accuracy":
            return (c.accuracy, -c.cost_normalized, c.name)
        return (-c.cost_normalized, c.accuracy, c.name)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "text": self.text()}


@dataclass(frozen=True)
class Candidate:
    """One PyroDash point of a run on its validation split: its knobs and figures."""

    name: str
    lam: float
    offload_bias: float
    handoff_share: float
    max_llm_calls: int
    accuracy: float
    cost_normalized: float
    usd_per_question: float
    llm_calls: float
    n: int

    def operating_point(self) -> dict:
        """The knobs as a serve config's `operating_points` entry (`pyrodash.server.config.OperatingPoint`)."""
        point = {"offload_bias": self.offload_bias, "handoff_share": self.handoff_share}
        return point | ({"max_llm_calls": self.max_llm_calls} if self.max_llm_calls > 1 else {})


def candidate(name: str, m: Metrics) -> Candidate:
    """`name`'s knobs (`pyrodash.eval.names`) and `m`'s figures."""
    _, lam, value = parse_method(name)
    kind = (sweep_kind(name) or "").split("+")[0]
    if m.cost_normalized is None:
        raise ValueError(f"{name}: no cost / LLM-only (the run has no `llm` records on its split): evaluate `llm` too")
    return Candidate(
        name=name,
        lam=float(lam),
        offload_bias=float(value) if kind == "bias" else 0.0,
        handoff_share=float(value) if kind == "share" else 1.0,
        max_llm_calls=relay_calls(name),
        accuracy=m.accuracy,
        cost_normalized=m.cost_normalized,
        usd_per_question=m.cost_usd / m.n,
        llm_calls=m.llm_calls,
        n=m.n,
    )


def candidates(ms: dict[str, Metrics], relay: bool = False) -> list[Candidate]:
    """The run's PyroDash points of one kind: single handoff (one LLM call at most) or, with `relay`, relay points
    (more than one)."""
    out = [
        candidate(n, m)
        for n, m in ms.items()
        if n != "relay_oracle" and parse_method(n)[0] == "pyrodash" and (relay_calls(n) > 1) == relay
    ]
    return sorted(out, key=lambda c: (c.cost_normalized, -c.accuracy, c.name))


def pick(cands: list[Candidate], criterion: Criterion) -> tuple[Candidate, bool]:
    """(the picked candidate, whether it meets `criterion`)."""
    if not cands:
        raise ValueError("no PyroDash points to pick from: evaluate pyrodash (and its sweeps) on the validation split")
    meeting = [c for c in cands if criterion.meets(c)]
    if meeting:
        return max(meeting, key=criterion.better), True
    return max(cands, key=criterion.fallback), False


def val_dir(run_dir: str | Path) -> Path:
    """Where a run's validation evaluation is: RUN/val (single-handoff and relay points side by side)."""
    return Path(run_dir) / "val"


def _split_names(runs: dict[str, list[dict]]) -> list[str]:
    return sorted({r["benchmark"] for rs in runs.values() for r in rs})


def select(val: str | Path, criterion: Criterion, relay: bool = False) -> dict:
    """The selection on the validation run `val`: criterion, split, every candidate, the pick and whether it meets
    the criterion."""
    runs = single_turn(load_run(val))
    ms = all_metrics(runs, run_prices(val))
    cands = candidates(ms, relay)
    chosen, met = pick(cands, criterion)
    return {
        "kind": "relay" if relay else "single",
        "criterion": criterion.to_dict(),
        "val_run": str(val),
        "val_split": _split_names(runs),
        "candidates": [asdict(c) for c in cands],
        "picked": chosen.name,
        "met": met,
        "val": asdict(chosen),
        "operating_point": chosen.operating_point(),
    }


def select_run(run_dir: str | Path, criterion: Criterion, relay: bool = False, val: str | Path | None = None) -> dict:
    """`select` on RUN's validation evaluation (`val`, default `val_dir`), recorded in RUN/selection.json under its
    kind (a later selection of that kind replaces it); the selection."""
    run_dir = Path(run_dir)
    val = Path(val) if val is not None else val_dir(run_dir)
    if not (val / "records").is_dir():
        raise ValueError(
            f"no validation evaluation in {val}: evaluate the run's PyroDash points and `llm` on a validation split "
            f"there (`pyrodash eval` with run_dir={val}), or name one with --val DIR"
        )
    sel = select(val, criterion, relay)
    rel = lambda p: str(Path(p).resolve().relative_to(run_dir.resolve())) if _under(p, run_dir) else str(p)  # noqa: E731
    sel["val_run"], sel["test_run"] = rel(val), rel(run_dir)
    path = run_dir / SELECTION_FILE
    stored = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**stored, sel["kind"]: sel}, indent=2) + "\n")
    return sel


def _under(p: str | Path, root: Path) -> bool:
    return Path(p).resolve().is_relative_to(root.resolve())


def read_selection(run_dir: str | Path) -> dict:
    """RUN/selection.json ({kind: selection}), or {} when nothing was selected for the run."""
    path = Path(run_dir) / SELECTION_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def figures_on_test(run_dir: str | Path, sel: dict, prices: Prices | None = None) -> dict | None:
    """The picked point's figures on the run's test evaluation (`sel["test_run"]` under RUN, at `prices`, default
    that run's sheet): accuracy, cost / LLM-only, $ per question, LLM calls; None when that run lacks the point."""
    test = Path(run_dir) / sel.get("test_run", ".")
    try:
        runs = single_turn(load_run(test))
    except ValueError:
        return None
    if sel["picked"] not in runs:
        return None
    m = all_metrics(runs, prices or run_prices(test))[sel["picked"]]
    return {
        "accuracy": m.accuracy,
        "cost_normalized": m.cost_normalized,
        "usd_per_question": m.cost_usd / m.n,
        "llm_calls": m.llm_calls,
        "n": m.n,
        "split": _split_names({sel["picked"]: runs[sel["picked"]]}),
    }


def selection_summary(run_dir: str | Path, prices: Prices | None = None) -> dict:
    """summary.json's `selection`: each kind's selection with its `test` figures (`figures_on_test`)."""
    return {
        kind: {**sel, "test": figures_on_test(run_dir, sel, prices)} for kind, sel in read_selection(run_dir).items()
    }


def _figures(f: dict | None) -> str:
    if not f:
        return "--"
    return (
        f"{100 * f['accuracy']:.2f}% at {f['cost_normalized']:.3f} of LLM-only (${f['usd_per_question']:.2e}/question)"
    )


def picked_section(selection: dict) -> list[str]:
    """The report's "Picked on val" lines from `selection_summary`: per kind the criterion, the picked point's
    validation and test figures, and the candidates it was picked from."""
    out = [
        "Operating points picked on the validation split, then read on the test problems: the test decides nothing. "
        "`pyrodash select RUN` picks and writes the point into a serve config.",
        "",
    ]
    for kind, sel in selection.items():
        fell_back = "" if sel["met"] else f" (none meets it: {CRITERIA[sel['criterion']['kind']][2]})"
        splits = ", ".join(sel.get("val_split") or [])
        out += [
            f"**{KINDS.get(kind, kind)}**: criterion {sel['criterion']['text']}{fell_back} -> **{sel['picked']}** "
            f"(`{json.dumps(sel['operating_point'])}`).",
            "",
            f"- on val ({splits}, {sel['val']['n']} questions): {_figures(sel['val'])}",
            f"- on test ({', '.join((sel.get('test') or {}).get('split') or [])}): {_figures(sel.get('test'))}",
            "",
        ]
        rows = [
            [
                c["name"] + (" ◀" if c["name"] == sel["picked"] else ""),
                f"{100 * c['accuracy']:.2f}",
                f"{c['cost_normalized']:.3f}",
                f"{c['usd_per_question']:.2e}",
                f"{c['llm_calls']:.3f}",
            ]
            for c in sel["candidates"]
        ]
        out += md_table(["Candidate (val)", "Acc. (%)", "Cost / LLM", "$ / question", "LLM calls"], rows) + [""]
    return out
