"""Math benchmark loaders: GSM8K, Minerva, OlympiadBench, AIME24, AIME25 (and MATH-500) as uniform `Example`s.

    from pyrodash.data.benchmarks import load_benchmark
    exs = load_benchmark("gsm8k", limit=100)            # 100 rows, a seeded subsample kept in file order
    exs = load_benchmark("world:tier3", path=WORLD_DIR)  # a split of the built-in world (`load_world_split`)
    exs = load_benchmark("world:multiturn-self", path=WORLD_DIR)  # conversations answered after own history

Where the rows come from (`path=`, the local benchmarks directory, the Hugging Face hub) and how `limit` / `seed`
subsample: `load_benchmark`. How each benchmark's gold is read: `_row_to_example`. Questions are stored bare;
evaluation puts them to models with `pyrodash.prompts.get_prompts(...).question()`.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import replace
from pathlib import Path

from pyrodash.data.example import Example
from pyrodash.grading import extract_answer

# name -> directory under the benchmarks dir
DIRS: dict[str, str] = {
    "gsm8k": "gsm8k",
    "minerva": "minerva_math",
    "olympiadbench": "olympiadbench",
    "aime24": "aime24",
    "aime25": "aime25",
    "math500": "math500",
}
ALIASES: dict[str, str] = {"minerva_math": "minerva", "math-500": "math500", "math_500": "math500"}
# name -> (hub id, config, split): the datasets the field evaluates on
HUB: dict[str, tuple[str, str | None, str]] = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "minerva": ("math-ai/minervamath", None, "test"),
    "olympiadbench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
    "aime24": ("HuggingFaceH4/aime_2024", None, "train"),
    "aime25": ("math-ai/aime25", None, "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
}
BENCHMARK_NAMES = tuple(DIRS)
ENV_DIR = "PYRODASH_BENCHMARKS_DIR"


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DIRS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {list(DIRS)} or 'world:<split>'")
    return key


def benchmarks_dir() -> Path | None:
    """The local benchmarks directory: $PYRODASH_BENCHMARKS_DIR, else `shared/benchmarks` found walking up."""
    env = os.environ.get(ENV_DIR)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise ValueError(f"{ENV_DIR}={env!r} is not a directory; point it at the folder holding gsm8k/, aime24/")
        return p
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for d in (start, *start.parents):
            cand = d / "shared" / "benchmarks"
            if cand.is_dir():
                return cand
    return None


def local_file(name: str) -> Path | None:
    """The local JSONL of a benchmark under `benchmarks_dir()`, or None."""
    root = benchmarks_dir()
    if root is None:
        return None
    f = root / DIRS[canonical_name(name)] / "test.jsonl"
    return f if f.is_file() else None


def _read_rows(path: Path) -> list[dict]:
    if path.is_dir():
        if not (path / "test.jsonl").is_file():
            raise ValueError(f"{path} is a directory without test.jsonl; pass the JSONL file itself as path=")
        path = path / "test.jsonl"
    if not path.is_file():
        raise ValueError(f"benchmark file {path} does not exist; pass an existing JSONL file or directory as path=")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json benchmark file must hold a list of objects")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e}); write one JSON object per line") from e
    return rows


def _load_from_hub(name: str) -> list[dict]:
    import datasets

    hub_id, config, split = HUB[name]
    ds = datasets.load_dataset(hub_id, config, split=split)
    return [dict(r) for r in ds]


def _strip_dollars(s: str) -> list[str]:
    """The parts of an OlympiadBench final answer: `'$69$,$84$'` -> `['69', '84']`; `'1,3'` -> `['1,3']`;
    a malformed `'$221,$8$'` (odd number of `$`) -> `['221', '8']` (split at commas outside brackets); a prose
    answer (`'$f(x)=ax+b$, where $b$ is an arbitrary integer'`) stays ONE answer with its `$` removed."""
    s = str(s).strip()
    if s.count("$") % 2:  # unbalanced delimiters: the commas outside brackets separate the parts
        return [p for p in (q.strip() for q in _split_top_level(s.replace("$", ""))) if p] or [s.strip("$ ")]
    parts = re.findall(r"\$([^$]*)\$", s)
    if not parts:
        return [s.strip("$ ")]
    outside = re.sub(r"\$[^$]*\$", "", s)
    if re.fullmatch(r"[\s,.;]*", outside):  # only separators between the $...$ parts
        return [p.strip() for p in parts]
    return [re.sub(r"\s+", " ", s.replace("$", "")).strip().rstrip(".")]  # prose: one answer


def _split_top_level(s: str) -> list[str]:
    """`s` split at commas that are not inside (), [] or {}."""
    out, depth, cur = [], 0, ""
    for c in s:
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth <= 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]


def _first(row: dict, *keys: str) -> str | None:
    for k in keys:
        if row.get(k) not in (None, ""):
            return row[k]
    return None


def _row_to_example(name: str, row: dict, index: int) -> Example:
    """Row `index` of benchmark `name` as an `Example`. Golds are strings graded by `pyrodash.grading.is_correct`:
    GSM8K's number after `####` (thousands commas removed), Minerva's `answer` or else the last `\\boxed{}` of its
    solution, OlympiadBench's `final_answer` list joined with ", " (`$` removed; multi-answer golds grade as a set;
    `$221,$8$` gives 221 and 8; a prose answer with `$...$` inside stays one answer), AIME's integer answer. Loader
    extras go to `Example.meta`."""
    rid = _first(row, "id", "idx", "unique_id")
    ex_id = f"{name}-{rid if rid is not None else index}"
    question = _first(row, "problem", "question")
    if question is None:
        raise ValueError(f"{name} row {index} has no 'problem' or 'question' field; fields: {sorted(row)}")
    meta: dict = {"source_index": index}
    if name == "gsm8k":
        answer = str(row.get("answer", ""))
        if "####" not in answer:
            raise ValueError(f"gsm8k row {index}: answer has no '#### <number>' line; is this GSM8K's test split?")
        solution, _, gold = answer.rpartition("####")
        gold = gold.strip().replace(",", "")
        meta["solution"] = solution.strip()
    elif name == "olympiadbench":
        finals = row.get("final_answer") or []
        finals = [finals] if isinstance(finals, str) else list(finals)
        answers = [part for a in finals for part in _strip_dollars(a)]
        gold = ", ".join(answers)
        if row.get("context"):
            question = f"{row['context']}\n{question}"
        meta.update({k: row.get(k) for k in ("subfield", "answer_type", "is_multiple_answer", "unit", "error")})
        meta["answers"] = answers
        sol = row.get("solution")
        meta["solution"] = sol[0] if isinstance(sol, list) and sol else sol
    else:  # minerva, aime24, aime25, math500: an answer field, else (Minerva) the last box of the solution
        gold = _first(row, "answer", "final_answer")
        if gold is None and row.get("solution"):
            gold = extract_answer(str(row["solution"]))
        gold = str(gold).strip().strip("$").strip() if gold is not None else ""
        for k in ("solution", "type", "subject", "level", "url"):
            if row.get(k) not in (None, ""):
                meta[k] = row[k]
    if not str(gold).strip():
        raise ValueError(f"{name} row {index} ({ex_id}) has no gold answer; fields: {sorted(row)}")
    return Example(id=ex_id, benchmark=name, question=str(question), gold=str(gold), meta=meta)


def subsample(items: list, limit: int | None, seed: int | None) -> list:
    """The first `limit` items (seed=None) or a seeded random `limit` of them, kept in their original order."""
    if limit is None:
        return items
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    if limit >= len(items):
        return items
    if seed is None:
        return items[:limit]
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def subsample_examples(exs: list[Example], limit: int | None, seed: int | None) -> list[Example]:
    """`subsample` of examples, by whole conversations where they carry `meta["conversation"]`: a subset of the
    conversations (file order with seed=None, else a seeded random order) taken while their turns total at most
    `limit` (at least one conversation, even a longer one), kept in file order. Plain examples: `subsample`."""
    if limit is None or not any("conversation" in (ex.meta or {}) for ex in exs):
        return subsample(exs, limit, seed)
    subsample([], limit, None)  # the same check of `limit`
    convs: dict[str, list[int]] = {}
    for i, ex in enumerate(exs):  # an example without a conversation is a conversation of its own
        convs.setdefault(str((ex.meta or {}).get("conversation", f"\0{ex.id}")), []).append(i)
    order = list(convs)
    if seed is not None:
        random.Random(seed).shuffle(order)
    keep: list[int] = []
    for c in order:
        if not keep or len(keep) + len(convs[c]) <= limit:
            keep += convs[c]
        if len(keep) >= limit:
            break
    return [exs[i] for i in sorted(keep)]


SELF_SUFFIX = "-self"


def own_history_benchmark(name: str) -> bool:
    """Whether `name` is an own-history conversation benchmark (`<conversations>-self`): `pyrodash.eval.harness` answers
    its turns after the method's own earlier answers."""
    return name.endswith(SELF_SUFFIX) and len(name) > len(SELF_SUFFIX)


def _load_self(name: str, path: str | Path | None, limit: int | None, seed: int | None) -> list[Example]:
    """`<name>-self` (e.g. `world:multiturn-self`): `<name>` with its benchmark renamed, ids kept;
    `pyrodash.eval.harness` then answers each turn after the method's OWN earlier answers instead of the gold history
    (`meta["history"]`). Only conversation benchmarks (`meta.conversation` and `meta.turn`) take the suffix."""
    base = name[: -len(SELF_SUFFIX)]
    exs = load_benchmark(base, path=path, limit=limit, seed=seed)
    if not all("conversation" in (ex.meta or {}) and "turn" in (ex.meta or {}) for ex in exs):
        raise ValueError(
            f"benchmark {name!r}: {base!r} is not a conversation benchmark (every example needs "
            "meta.conversation and meta.turn, as world:multiturn has); '-self' answers each turn after "
            "the method's own earlier turns"
        )
    return [replace(ex, benchmark=name, meta=dict(ex.meta)) for ex in exs]


def _load_world(name: str, path: str | Path | None) -> list[Example]:
    split = name.split(":", 1)[1]
    if not split:
        raise ValueError("world benchmarks are named 'world:<split>', e.g. 'world:tier3'")
    if path is None:
        raise ValueError(f"{name!r} needs path=<world directory> (made by `pyrodash world build --out DIR`)")
    return load_world_split(path, split)


def load_world_split(world_dir: str | Path, split: str) -> list[Example]:
    """The examples of `split` (train, val, tier1..tier5, multiturn) of a built world (`DIR/data/<split>.jsonl`,
    written by `pyrodash.world.build`)."""
    data = Path(world_dir) / "data"
    path = data / f"{split}.jsonl"
    if not path.is_file():
        if not data.is_dir():
            raise FileNotFoundError(
                f"{world_dir} is not a built world (no data/); run `pyrodash world build --out {world_dir}`"
            )
        splits = sorted(p.stem for p in data.glob("*.jsonl"))
        raise ValueError(f"unknown world split {split!r}; choose one of {splits}")
    with path.open() as f:
        return [Example.from_dict(json.loads(line)) for line in f if line.strip()]


def load_benchmark(
    name: str, path: str | Path | None = None, limit: int | None = None, seed: int | None = 0
) -> list[Example]:
    """Load a benchmark as `Example`s. Where the rows come from, first match wins:
    1. `path=`: a JSONL / JSON-list file, or a directory holding `test.jsonl`;
    2. the local benchmarks directory: `$PYRODASH_BENCHMARKS_DIR/<dir>/test.jsonl`, else the first `shared/benchmarks`
       found walking up from this package and from the current directory (a clone next to `../shared/benchmarks`);
    3. the Hugging Face dataset the field uses (`HUB`), when `datasets` can reach the hub.
    Neither available -> ValueError naming both options.

    `limit=None` keeps every row; with a limit, `seed=None` keeps the first `limit` rows and an integer seed keeps a
    deterministic random subset of `limit` rows (same seed -> same rows), in file order. A conversation benchmark
    (examples with `meta["conversation"]`, one per turn, e.g. `world:multiturn`) is subsampled by whole
    conversations (`subsample_examples`): at most `limit` turns, never a conversation cut short."""
    if own_history_benchmark(name):
        return _load_self(name, path, limit, seed)
    if name.startswith("world:"):
        return subsample_examples(_load_world(name, path), limit, seed)
    key = canonical_name(name)
    if path is not None:
        rows = _read_rows(Path(path).expanduser())
    elif (f := local_file(key)) is not None:
        rows = _read_rows(f)
    else:
        try:
            rows = _load_from_hub(key)
        except Exception as e:
            hub_id, config, split = HUB[key]
            raise ValueError(
                f"benchmark {name!r}: no local file and the Hugging Face hub dataset {hub_id}"
                f"{' (' + config + ')' if config else ''} [{split}] could not be loaded ({type(e).__name__}: {e}). "
                f"Either pass path=<JSONL file> (CLI: --path) or set {ENV_DIR} to a folder holding "
                f"{DIRS[key]}/test.jsonl, or make the hub reachable (network, HF_HUB_OFFLINE unset)."
            ) from e
    if not rows:
        raise ValueError(f"benchmark {name!r} has no rows; check the file you passed")
    return subsample_examples([_row_to_example(key, r, i) for i, r in enumerate(rows)], limit, seed)
