"""Reading a run's stored records (`RUN_DIR/records/<method>.jsonl`) and its price sheet."""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.cost import Prices
from pyrodash.eval.names import parse_method, sort_key
from pyrodash.record import read_record


def read_records(path: Path) -> list[dict]:
    """The complete JSON lines of one records file; a torn last line (a killed writer) is skipped."""
    out = []
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(read_record(json.loads(line)))
        except json.JSONDecodeError:
            if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1 :]):
                raise ValueError(f"{path}: line {i + 1} is not JSON; delete that line and re-run eval") from None
    return out


def dedupe(records: list[dict]) -> tuple[list[dict], int]:
    """(records with one line per (benchmark, id, sample), the LAST one kept in file order; lines dropped).
    A records file gets a duplicate when two runs append to it (e.g. a copied or merged file); counting both would
    weigh those examples twice."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(records):
        last[(r.get("benchmark"), str(r.get("id")), int(r.get("sample", 0) or 0))] = i
    keep = sorted(last.values())
    return [records[i] for i in keep], len(records) - len(keep)


def load_run(run_dir: str | Path, duplicates: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """{method: records} for every `records/*.jsonl` of a run directory, deduplicated (`dedupe`); the number of
    dropped lines per method goes into `duplicates` when given."""
    rec_dir = Path(run_dir) / "records"
    files = sorted(rec_dir.glob("*.jsonl")) if rec_dir.is_dir() else []
    if not files:
        raise ValueError(f"no records in {rec_dir}: run `pyrodash eval --config CFG` with run_dir={run_dir} first")
    runs = {}
    for f in files:
        runs[f.stem], dropped = dedupe(read_records(f))
        if dropped and duplicates is not None:
            duplicates[f.stem] = dropped
    for name in runs:
        parse_method(name)
    return dict(sorted(runs.items(), key=lambda kv: sort_key(kv[0])))


def run_prices(run_dir: str | Path) -> Prices:
    """The price sheet the run was configured with (config.resolved.json), else the paper's sheet."""
    cfg = Path(run_dir) / "config.resolved.json"
    if cfg.exists():
        p = json.loads(cfg.read_text()).get("prices")
        if isinstance(p, dict):
            return Prices(**p)
    return Prices.from_yaml("paper")


def single_turn(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The runs without conversation turns (`meta.turn`): Tables 1-4, the Pareto verdict and the case studies
    cover single questions, as in the paper; turns have their own section. A run of turns only is kept whole."""
    out = {n: [r for r in rs if (r.get("meta") or {}).get("turn") is None] for n, rs in runs.items()}
    out = {n: rs for n, rs in out.items() if rs}
    return out or runs
