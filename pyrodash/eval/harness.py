"""Evaluation harness: methods x benchmarks -> one JSON line per (method, example, sample), resumable.

    pyrodash eval --config configs/eval/world-full.yaml [--run-dir DIR]

Records go to `RUN_DIR/records/<method>.jsonl`: id, benchmark, sample, question, gold, correct, the answer's record
(`pyrodash.record.Record`), method extras, latency_s and the example's meta. Lines are appended and fsync'ed one by
one; a restarted run skips the (benchmark, id, sample) keys already present and first cuts a torn last line, so a
run killed at any point (kill -9) loses and duplicates nothing. The resolved config is saved as
`RUN_DIR/config.resolved.json` (accepted back by `EvalConfig.from_yaml`; the config: `pyrodash.eval.config`).
Accuracy is pass@1 with greedy decoding, or avg@k for benchmarks listed under `samples`. Conversations and own
history: `evaluate`; metrics and tables come from the records (`pyrodash.report.core`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pyrodash.data.benchmarks import SELF_SUFFIX, load_benchmark, own_history_benchmark
from pyrodash.data.example import Example
from pyrodash.eval.build import build_methods
from pyrodash.eval.config import EvalConfig
from pyrodash.eval.methods import Env, timed
from pyrodash.grading import grade_batch
from pyrodash.prompts import get_prompts
from pyrodash.world.multiturn import ensure_long_split

# --- resumable JSONL ---------------------------------------------------------------------------------------------


def record_key(r: dict) -> tuple[str, str, int]:
    return r["benchmark"], str(r["id"]), int(r.get("sample", 0))


def resume(path: Path) -> set[tuple[str, str, int]]:
    """Keys already stored in `path`; a torn last line (killed mid-write) is cut off so appends stay valid."""
    return _resume(path)[0]


def _resume(path: Path, keep: set[str] | None = None) -> tuple[set[tuple[str, str, int]], dict[tuple, dict]]:
    """(`resume`'s keys, the stored records of the benchmarks in `keep` by key: the last line of each key)."""
    if not path.exists():
        return set(), {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    keys, kept = set(), {}
    for line in data[:end].decode().splitlines():
        if line.strip():
            r = json.loads(line)
            keys.add(record_key(r))
            if keep and r.get("benchmark") in keep:
                kept[record_key(r)] = r  # the last line of a key, as the report reads it
    return keys, kept


def append_records(path: Path, records: list[dict]) -> None:
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


# --- the run ------------------------------------------------------------------------------------------------------


# the settings a record depends on; not the range rule, which may come and go between evaluations of one run (the
# demo's main step has none, its long conversations one): each record says whether it was routed by it (`routed`)
RECORD_KEYS = ("prompts", "max_tokens", "samples", "sample_temperature", "sample_top_p")


def check_compatible(run_dir: Path, cfg: EvalConfig) -> None:
    """Refuse to append to records made with other models or decoding settings (methods, benchmarks and prices may
    change between runs: records do not depend on them)."""
    old_path = run_dir / "config.resolved.json"
    if not old_path.exists() or not any((run_dir / "records").glob("*.jsonl")):
        return
    try:
        old = json.loads(old_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{old_path} is not valid JSON ({e}); restore it, or delete it to accept the current "
            "config for the records already in this run_dir"
        ) from None
    if not isinstance(old, dict):
        raise ValueError(f"{old_path} must hold a JSON object; restore it or delete it")
    new = json.loads(json.dumps(asdict(cfg), default=str))
    diff = [k for k in RECORD_KEYS if k in old and old[k] != new[k]]
    om, nm = old.get("models") or {}, new.get("models") or {}
    diff += [f"models.{k}" for k in ("slm", "llm", "sft") if k in om and k in nm and om[k] != nm[k]]
    op, np_ = om.get("pyrodash") or {}, nm.get("pyrodash") or {}
    diff += [f"models.pyrodash.{k}" for k in op if k in np_ and op[k] != np_[k]]
    if diff:
        raise ValueError(
            f"{run_dir} holds records made with different settings ({', '.join(diff)}); use a new "
            "run_dir or delete its records/ to start over"
        )


def load_examples(cfg: EvalConfig, name: str, limit: int | None = None) -> list[Example]:
    base = name[: -len(SELF_SUFFIX)] if own_history_benchmark(name) else name
    path = cfg.world_dir if name.startswith("world:") else cfg.benchmark_paths.get(name, cfg.benchmark_paths.get(base))
    if name.startswith("world:") and path is not None:
        ensure_long_split(path, base.split(":", 1)[1])  # a long conversation split: made on first use
    return load_benchmark(name, path=path, limit=limit)


def _sampling(cfg: EvalConfig, k: int, s: int) -> dict:
    if k == 1:
        return {"temperature": 0.0, "top_p": 1.0, "seed": None}
    return {"temperature": cfg.sample_temperature, "top_p": cfg.sample_top_p, "seed": s}


def own_history_plan(examples: list[Example]) -> dict[tuple[str, str], tuple[str, str] | None]:
    """{(benchmark, id): (benchmark, id) of the earlier turn, or None for turn 1} for the examples of own-history
    benchmarks (`<name>-self`); a ValueError names a turn whose earlier turn is not among the examples."""
    plan: dict[tuple[str, str], tuple[str, str] | None] = {}
    at: dict[tuple[str, str, int], Example] = {}
    own = [ex for ex in examples if own_history_benchmark(ex.benchmark)]
    for ex in own:
        meta = ex.meta or {}
        try:
            conv, turn = str(meta["conversation"]), int(meta["turn"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{ex.benchmark} example {ex.id}: an own-history benchmark ('-self') needs "
                "meta.conversation and an integer meta.turn (1, 2, ...) on every example"
            ) from None
        if turn < 1:
            raise ValueError(f"{ex.benchmark} example {ex.id}: meta.turn={turn} (turns count from 1)")
        if (ex.benchmark, conv, turn) in at:
            raise ValueError(
                f"{ex.benchmark}: conversation {conv} has two examples of turn {turn} "
                f"({at[(ex.benchmark, conv, turn)].id}, {ex.id})"
            )
        at[(ex.benchmark, conv, turn)] = ex
    for (b, conv, turn), ex in at.items():
        prev = None if turn == 1 else at.get((b, conv, turn - 1))
        if turn > 1 and prev is None:
            raise ValueError(
                f"{b} example {ex.id}: turn {turn} of conversation {conv} is answered after this "
                f"method's own turn {turn - 1}, which is not among the examples; evaluate whole "
                "conversations (a `limit` keeps them whole) or drop the later turns"
            )
        plan[(b, str(ex.id))] = None if prev is None else (b, str(prev.id))
    return plan


def own_history(prev_example: Example | None, prev_record: dict | None) -> list[dict]:
    """The history a turn is answered after in an own-history benchmark: none for turn 1, else the history turn k-1
    was answered with + [user: turn k-1's question, assistant: the method's output for turn k-1]."""
    if prev_example is None or prev_record is None:
        return []
    return list((prev_record.get("meta") or {}).get("history") or []) + [
        {"role": "user", "content": prev_example.question},
        {"role": "assistant", "content": prev_record["output"]},
    ]


def _answer(cfg: EvalConfig, name: str, method, chunk: list[tuple[str, str, int]], exs: list[Example]) -> list[dict]:
    """The graded records of one batch: `method` over `exs` (one per key of `chunk`)."""
    items = [(ex, _sampling(cfg, cfg.samples.get(b, 1), s)) for (b, _, s), ex in zip(chunk, exs)]
    outs = timed(method, items)
    ok = grade_batch([o["output"] for o in outs], [ex.gold for ex, _ in items], workers=0)
    return [
        {
            "id": id_,
            "benchmark": b,
            "sample": s,
            "method": name,
            "question": ex.question,
            "gold": ex.gold,
            "correct": bool(c),
            **o,
            "meta": ex.meta,
        }
        for (b, id_, s), (ex, _), o, c in zip(chunk, items, outs, ok)
    ]


def _batches(
    todo: list[tuple[str, str, int]],
    plan: dict,
    by_key: dict[tuple[str, str], Example],
    stored: dict[tuple, dict],
    batch_size: int,
    where: str,
):
    """(keys, examples) batches of a method's keys to answer: plain examples first (conversation turns after their
    gold history grouped by turn, so a batch holds histories of one length and pads little), then own-history turns,
    turn 1 of every conversation before turn 2, ... Lazy: a turn's examples are made (their own history read from
    `stored`) only once the caller has stored every batch before it."""
    plain = sorted((k for k in todo if k[:2] not in plan), key=lambda k: int(by_key[k[:2]].meta.get("turn") or 0))
    for i in range(0, len(plain), batch_size):
        yield plain[i : i + batch_size], [by_key[k[:2]] for k in plain[i : i + batch_size]]
    own = [k for k in todo if k[:2] in plan]
    for turn in sorted({int(by_key[k[:2]].meta["turn"]) for k in own}):
        at = [k for k in own if int(by_key[k[:2]].meta["turn"]) == turn]
        for i in range(0, len(at), batch_size):
            exs = []
            for b, id_, s in at[i : i + batch_size]:
                prev = plan[(b, id_)]
                prev_rec = None if prev is None else stored.get((*prev, s))
                if prev is not None and prev_rec is None:
                    raise RuntimeError(
                        f"{where}: no record of {prev[1]} (sample {s}) to answer {id_} after; was "
                        "the records file edited during the run?"
                    )
                ex = by_key[(b, id_)]
                hist = own_history(None if prev is None else by_key[prev], prev_rec)
                exs.append(replace(ex, meta={**ex.meta, "history": hist, "history_source": "self"}))
            yield at[i : i + batch_size], exs


def evaluate(
    cfg: EvalConfig, methods: dict | None = None, examples: list[Example] | None = None, quiet: bool = False
) -> Path:
    """Run every method over every benchmark into RUN_DIR/records; returns RUN_DIR. `methods` defaults to
    `pyrodash.eval.build.build_methods(cfg, ...)`, `examples` to the config's benchmarks.

    Conversations (examples with `meta.conversation` and `meta.turn`, one per turn): a benchmark answers each turn after
    the history in `meta.history` (`world:multiturn`: the GOLD earlier turns, the same context for every method), except
    an own-history benchmark, named `<conversations>-self` (`world:multiturn-self`, `pyrodash.data.benchmarks`), whose
    turns are answered as a user lives them, after the method's OWN earlier answers (`own_history`): turn 1 with no
    history, turn k after [the history turn k-1 was answered with] + [user: turn k-1's question, assistant: this
    method's `output` for turn k-1]. It runs turn by turn (every conversation's turn 1 in batches, then turn 2, ...);
    the stored record's `meta.history` is the history it was answered after and `meta.history_source` is "self". The
    gold stays the conversation's gold: a wrong earlier answer carries into later turns, as it would for a user. Earlier
    outputs come from the method's records file, so a resumed run (records of turn 1 on disk, turn 2 not yet) answers
    turn 2 after the stored turn-1 outputs. Each sample s (avg@k) continues sample s of the earlier turn. Every turn k >
    1 needs turn k-1 of its conversation among the examples (a `limit` keeps whole conversations, so only hand-picked
    examples can miss one): otherwise the run stops with a ValueError before anything is answered."""
    run_dir = Path(cfg.run_dir)
    if methods is None:
        cfg.check_models()  # before the run directory exists: a typo in a path leaves nothing behind
    prices = cfg.price_sheet()
    check_compatible(run_dir, cfg)
    (run_dir / "records").mkdir(parents=True, exist_ok=True)
    resolved = asdict(cfg) | {"prices": prices.to_dict(), "prices_sheet": cfg.prices}
    # written whole or not at all: evaluations of other methods in the same run_dir may read it at the same time
    tmp = run_dir / f"config.resolved.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(resolved, indent=2, default=str) + "\n")
    os.replace(tmp, run_dir / "config.resolved.json")
    if examples is None:
        examples = [ex for b in cfg.benchmarks for ex in load_examples(cfg, b, cfg.limit)]
    keys = [(b, str(ex.id), s) for ex in examples for b in [ex.benchmark] for s in range(cfg.samples.get(b, 1))]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate (benchmark, id) pairs among the examples; give every example a unique id")
    by_key = {(ex.benchmark, str(ex.id)): ex for ex in examples}
    plan = own_history_plan(examples)  # before any model runs: a conversation missing a turn stops the run here
    own_benchmarks = {b for b, _ in plan}
    env = Env(get_prompts(cfg.prompts), prices, cfg.max_tokens, cfg.batch_size, cfg.concurrency)
    if methods is None:
        methods = build_methods(cfg, env, load_examples=lambda name, limit: load_examples(cfg, name, limit))
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=quiet
    ) as bar:
        for name, method in methods.items():
            path = run_dir / "records" / f"{name}.jsonl"
            done, stored = _resume(path, own_benchmarks)
            mine = [k for k in keys if cfg.runs_on(name, k[0])]
            todo = [k for k in mine if k not in done]
            task = bar.add_task(f"{name:<28}", total=len(mine), completed=len(mine) - len(todo))
            for chunk, exs in _batches(todo, plan, by_key, stored, cfg.batch_size, f"{name} ({path})"):
                recs = _answer(cfg, name, method, chunk, exs)
                append_records(path, recs)
                stored.update((record_key(r), r) for r in recs if r["benchmark"] in own_benchmarks)
                bar.advance(task, len(chunk))
    return run_dir
