"""EasyHard curation, the first step of training: label examples easy/hard with the base SLM and build Corpus A
and Corpus B (read by Stages 1 and 2).

    pyrodash curate --config configs/world/quick.yaml --output-dir runs/quick

The base SLM labels each example easy (right) or hard (wrong); the frozen LLM reconstructs the hard ones; Corpus A
has no `<offload>`, Corpus B has P_s and `<offload>` in its hard targets. Conversations go the same path, one turn
at a time. Your own data with no held-out source gives a seeded share of its conversations to val first
(`carve_user_val`: DIR/curated/val.jsonl, out of training). Writes DIR/curated/{corpus_a,corpus_b,heldout}.jsonl,
DIR/curated/dataset/, stats.json and config.resolved.json. The steps, `hard_target`, conversations and the
outputs: docs/internals.md.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.data.benchmarks import load_world_split
from pyrodash.data.example import Example
from pyrodash.engine import slm_chat
from pyrodash.eval.carve import carve_val, conversation_key
from pyrodash.grading import grade_batch
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, get_prompts
from pyrodash.train.chat_logs import is_chat_log, load_chat_turns, turn_messages
from pyrodash.train.config import save_resolved
from pyrodash.train.generate import generate
from pyrodash.train.models import FrozenLLM, load_local
from pyrodash.train.paths import curated_dir, llm_spec, resolve_world, slm_spec
from pyrodash.train.relay_rows import relay_target

BOX = "\\boxed"


# --- sources -------------------------------------------------------------------------------------------------------


def _within_range(turns: list[Example], counts: dict, max_turns: int | None) -> tuple[list[Example], dict]:
    """The turns within the range rule's max_turns (None: all), with the counts of turns kept and dropped."""
    kept = [ex for ex in turns if max_turns is None or int(ex.meta.get("turn", 1)) <= max_turns]
    return kept, {**counts, "turns": len(kept), "past_range": len(turns) - len(kept)}


def load_examples(
    source: str,
    world_dir: str | Path | None = None,
    split: str = "train",
    question_field: str = "question",
    answer_field: str = "gold",
    limit: int | None = None,
    offset: int = 0,
) -> list[Example]:
    """(question, gold) examples from "world:<split>", a local .jsonl, or "hf:<dataset id>[:<config>]"."""
    if source.startswith("world:"):
        if world_dir is None:
            raise ValueError(f"source {source!r} needs a world: add `world: {{quick: true}}` to the recipe")
        examples = load_world_split(world_dir, source.split(":", 1)[1])
    elif source.startswith("hf:"):
        examples = _load_hf(source[3:], split, question_field, answer_field, offset + limit if limit else None)
    elif source.endswith(".jsonl"):
        path = Path(source)
        if not path.exists():
            raise ValueError(f"source file {source} not found")
        examples = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                examples.append(
                    _row_to_example(json.loads(line), f"{path.stem}-{i}", path.stem, question_field, answer_field)
                )
    else:
        raise ValueError(f"source {source!r}: use 'world:<split>', a path ending in .jsonl, or 'hf:<dataset id>'")
    examples = examples[offset:]
    return examples[:limit] if limit else examples


def load_conversations(
    source: str, world_dir: str | Path | None = None, limit: int | None = None, range_max_turns: int | None = None
) -> tuple[list[Example], dict]:
    """(one Example per turn of the first `limit` conversations, counts) from a world conversation split
    ("world:multiturn_train") or a chat-log JSONL (`pyrodash.train.chat_logs`). `range_max_turns`: the range rule's
    max_turns; turns past it are dropped (the LLM answers them when served: they would teach the SLM to fail), and
    counted as `past_range`."""
    if source.startswith("world:"):
        turns = load_examples(source, world_dir)
        if any("conversation" not in ex.meta for ex in turns):
            raise ValueError(f"{source} is not a conversation split; use e.g. world:multiturn_train")
        order = list(dict.fromkeys(ex.meta["conversation"] for ex in turns))
        keep = set(order[:limit] if limit else order)
        turns = [ex for ex in turns if ex.meta["conversation"] in keep]
        return _within_range(turns, {"conversations": len(keep)}, range_max_turns)
    if source.endswith(".jsonl") and Path(source).is_file() and is_chat_log(source):
        turns, counts = load_chat_turns(source, limit)
        return _within_range(turns, counts, range_max_turns)
    raise ValueError(
        f"conversations source {source!r}: use 'world:<conversation split>' or a chat-log .jsonl "
        '(one {"messages": [...]} per line)'
    )


def _row_to_example(row: dict, default_id: str, bench: str, qf: str, af: str) -> Example:
    if {"id", "benchmark", "question", "gold"} <= set(row):
        return Example.from_dict(row)
    if qf not in row or af not in row:
        raise ValueError(f"row {default_id} lacks {qf!r}/{af!r}; set question_field/answer_field (keys: {sorted(row)})")
    q = row[qf]
    if isinstance(q, list):  # a chat prompt: take the last user message
        q = [m["content"] for m in q if m.get("role") == "user"][-1]
    gold = row[af]
    if isinstance(gold, dict):  # e.g. DAPO's reward_model: {ground_truth: ...}
        gold = gold.get("ground_truth", gold)
    return Example(id=str(row.get("id", default_id)), benchmark=bench, question=str(q), gold=str(gold))


def _load_hf(spec: str, split: str, qf: str, af: str, n: int | None) -> list[Example]:
    import datasets

    name, _, config = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # offline, unknown id, ...
        raise ValueError(
            f"could not load HF dataset {name!r} (split {split!r}): {e}. Offline? Export it to a "
            "local .jsonl with question/gold fields and use that path as source."
        ) from e
    rows = ds.select(range(min(n, len(ds)))) if n else ds
    return [_row_to_example(dict(r), f"{name}-{i}", name.split("/")[-1], qf, af) for i, r in enumerate(rows)]


# --- <offload> insertion ---------------------------------------------------------------------------------------------


def boundary_candidates(steps: list[str]) -> list[int]:
    """Indices j such that `<offload>` may go right before step j: any step up to the first one holding the final
    answer (`\\boxed`), so the token never lands inside the final answer. Empty when no step has an answer."""
    answer = next((j for j, s in enumerate(steps) if BOX in s), None)
    return [] if answer is None else list(range(0, answer + 1))


def insert_offloads(
    text: str,
    step_sep: str,
    count: int,
    rng: random.Random,
    placement: str = "random",
    hard_steps: list[int] | None = None,
) -> tuple[str, int]:
    """Insert up to `count` `<offload>` tokens at step boundaries of `text`; return (new text, number inserted).

    random: distinct boundaries drawn uniformly. before_hard: the first one right before the first hard step
    (`hard_steps`, e.g. the world's untaught-fact steps), any others drawn from the later boundaries. at_hard: right
    before each hard step (the first `count`) and nowhere else, so every boundary in Corpus B teaches the same
    rule: hand off exactly when the next step needs what the SLM does not know."""
    steps = text.split(step_sep)
    chosen = offload_steps(steps, count, rng, placement, hard_steps)
    for j in chosen:
        steps[j] = OFFLOAD_TOKEN + steps[j]
    return step_sep.join(steps), len(chosen)


def offload_steps(
    steps: list[str], count: int, rng: random.Random, placement: str = "random", hard_steps: list[int] | None = None
) -> list[int]:
    """The steps `<offload>` goes right before (`insert_offloads` says how each placement picks them); [] when no
    step boundary precedes the answer."""
    cands = boundary_candidates(steps)
    if not cands or count < 1:
        return []
    if placement == "at_hard" and hard_steps:
        return [h for h in sorted(set(hard_steps)) if h in cands][:count] or [cands[-1]]
    if placement == "before_hard" and hard_steps:
        first = min(hard_steps)
        if first not in cands:
            first = cands[-1]
        later = [c for c in cands if c > first]
        return [first] + rng.sample(later, min(count - 1, len(later)))
    if placement in ("random", "before_hard", "at_hard"):
        return rng.sample(cands, min(count, len(cands)))
    raise ValueError(f"placement={placement!r}: choose 'random', 'before_hard' or 'at_hard'")


# --- corpora -----------------------------------------------------------------------------------------------------


def build_corpora(
    examples: list[Example], solutions: dict[str, str], difficulty: dict[str, str], prompts: Prompts, cfg
) -> tuple[list[dict], list[dict], Counter]:
    """Corpus A and Corpus B rows (with a `messages` column) from each kept example's solution and label."""
    rng = random.Random(cfg.seed)
    rows_a, rows_b, inserted = [], [], Counter()
    for ex in examples:
        if ex.id not in solutions:
            continue
        target, diff = solutions[ex.id].strip(), difficulty[ex.id]
        if OFFLOAD_TOKEN in target:
            target = target.replace(OFFLOAD_TOKEN, "")
        base = {
            "id": ex.id,
            "benchmark": ex.benchmark,
            "question": ex.question,
            "gold": ex.gold,
            "difficulty": diff,
            "turn": ex.meta.get("turn", 0),
        }
        chat = turn_messages(prompts, ex)
        cut = diff == "hard" and cfg.hard_target == "to_first_offload"  # (relay needs it: Corpus A has no masks)
        if not cut:  # a hard target cut at its handoff has nothing to teach without P_s
            rows_a.append(
                {
                    **base,
                    "corpus": "A",
                    "n_offload": 0,
                    "prompt": chat,
                    "completion": [{"role": "assistant", "content": target}],
                }
            )
        n, spans = 0, []
        if diff == "hard":
            target, n, spans = _hard_target(target, ex.meta, cfg, rng)
            inserted[n] += 1  # what the Corpus B target holds
            if n == 0:
                inserted["no_boundary"] += 1
                continue  # no step boundary before the answer: this hard example cannot teach a handoff position
        rows_b.append(
            {
                **base,
                "corpus": "B",
                "n_offload": n,
                "prompt": slm_chat(prompts, chat),
                "completion": [{"role": "assistant", "content": target}],
                **({"llm_spans": spans} if cfg.relay else {}),  # every row: `datasets` takes its columns from row 0
            }
        )
    return rows_a, rows_b, inserted


def _hard_target(target: str, meta: dict, cfg, rng: random.Random) -> tuple[str, int, list[list[int]]]:
    """A hard example's Corpus B target, its `<offload>` count and (relay) the LLM's spans in it: `<offload>` at the
    steps the placement picks; cut after the first one (hard_target to_first_offload), or, with `relay`, every picked
    step the LLM's (at_hard: every untaught step, whatever offload_max)."""
    steps = target.split(cfg.step_sep)
    count = cfg.offload_max if cfg.placement == "at_hard" else rng.randint(cfg.offload_min, cfg.offload_max)
    if cfg.relay and cfg.placement == "at_hard":
        count = len(steps)
    hard_steps = _locate_hard_steps(steps, meta) if cfg.placement in ("before_hard", "at_hard") else None
    if cfg.relay:
        chosen = offload_steps(steps, count, rng, cfg.placement, hard_steps)
        text, spans = relay_target(steps, cfg.step_sep, chosen)
        return text, len(chosen), spans
    target, n = insert_offloads(target, cfg.step_sep, count, rng, cfg.placement, hard_steps)
    if cfg.hard_target == "to_first_offload" and n:  # the SLM never writes past its first <offload>
        target, n = target[: target.index(OFFLOAD_TOKEN) + len(OFFLOAD_TOKEN)], 1
    return target, n, []


def _locate_hard_steps(steps: list[str], meta: dict) -> list[int] | None:
    """Map the gold hard-step indices onto a solution whose steps are laid out differently, by matching step text."""
    gold_steps = meta.get("steps") or []
    found = []
    for h in meta.get("hard_steps") or []:
        if h < len(gold_steps):
            want = gold_steps[h].strip()
            j = next((j for j, s in enumerate(steps) if want and want == s.strip()), None)
            if j is not None:
                found.append(j)
    return found or None


def label_and_reconstruct(
    examples: list[Example],
    slm,
    llm,
    prompts: Prompts,
    cfg,
    reconstruct: bool = True,
    tag: str = "",
    cache: str | Path | None = None,
) -> tuple[dict[str, str], dict[str, str], dict]:
    """Run the base SLM (a backend; greedy, no P_s) -> easy/hard, then the LLM (`FrozenLLM`) on the hard ones.
    Returns (solutions of the kept examples, difficulty, counts)."""
    reqs = [GenRequest(messages=turn_messages(prompts, ex), max_tokens=cfg.slm_max_new_tokens) for ex in examples]
    gens = generate(slm, reqs, batch_size=cfg.batch_size, desc=f"base SLM {tag}".strip())
    ok = grade_batch([g.text for g in gens], [ex.gold for ex in examples])
    difficulty = {ex.id: "easy" if c else "hard" for ex, c in zip(examples, ok, strict=True)}
    solutions = {ex.id: g.text for ex, g, c in zip(examples, gens, ok, strict=True) if c}
    counts = {
        "examples": len(examples),
        "easy": sum(ok),
        "hard": len(examples) - sum(ok),
        "hard_kept": 0,
        "hard_dropped": 0,
        "slm_truncated": sum(g.finish_reason == "length" for g in gens),
    }
    hard = [ex for ex, c in zip(examples, ok, strict=True) if not c]
    if reconstruct and hard:
        journal = {"cache": cache} if cache else {}  # results appended as they arrive: a re-run resumes
        recs = llm.generate(
            [
                GenRequest(messages=_reconstruct_messages(ex, prompts, cfg), max_tokens=cfg.llm_max_new_tokens)
                for ex in hard
            ],
            desc="LLM reconstructions",
            **journal,
        )
        counts["llm_failures"] = sum(r.finish_reason == "error" for r in recs)  # not cached: retried by a re-run
        good = grade_batch([r.text for r in recs], [ex.gold for ex in hard])
        for ex, r, g in zip(hard, recs, good, strict=True):
            if g:
                solutions[ex.id] = r.text
        counts["hard_kept"] = sum(good)
        counts["hard_dropped"] = len(hard) - sum(good)
    return solutions, difficulty, counts


def _reconstruct_messages(ex: Example, prompts: Prompts, cfg) -> list[dict]:
    """The LLM's request for a hard example: the same chat the SLM was judged on (a turn: after its history), so a
    reconstruction continues that turn only."""
    msgs = turn_messages(prompts, ex)
    if cfg.reconstruct_with_gold:
        msgs[-1]["content"] += (
            f"\n\nThe correct final answer is {ex.gold}. Write a concise step-by-step solution "
            "that reaches it, with a blank line between steps."
        )
    return msgs


def run_curation(recipe, out_dir: str | Path) -> Path:
    """Curate with `recipe` into OUT_DIR/curated/ and return that directory."""
    cfg = recipe.curate
    prompts = get_prompts(recipe.prompts)
    world = resolve_world(recipe)
    examples, conv_counts = _curation_examples(cfg, world)
    examples, val, carve = carve_user_val(cfg, examples)
    slm = HFBackend(*load_local(slm_spec(recipe), chat_template=recipe.chat_template))
    llm = FrozenLLM.from_spec(llm_spec(recipe), batch_size=cfg.batch_size, concurrency=cfg.llm_concurrency)
    solutions, difficulty, counts = label_and_reconstruct(
        examples, slm, llm, prompts, cfg, cache=curated_dir(out_dir) / "llm_calls.jsonl"
    )
    if counts.get("llm_failures"):
        print(
            f"pyrodash curate: WARNING: {counts['llm_failures']} LLM reconstruction call(s) failed after retries "
            "and were dropped; re-run the same command to retry them (the others are journaled)",
            flush=True,
        )
    rows_a, rows_b, inserted = build_corpora(examples, solutions, difficulty, prompts, cfg)
    heldout = _heldout_rows(cfg, world, slm, llm, prompts, counts, val)
    out = curated_dir(out_dir)
    _write_corpora(out, rows_a, rows_b, heldout)
    if carve:
        write_val(out / "val.jsonl", val, carve)
    if cfg.conversations:
        conv_counts |= _turn_counts(rows_a + rows_b, examples, difficulty)
    hard_b = [r for r in rows_b if r["difficulty"] == "hard"]
    stats = {
        **counts,
        "conversations": conv_counts if cfg.conversations else None,
        "corpus_a": len(rows_a),
        "corpus_b": len(rows_b),
        "corpus_b_hard": len(hard_b),
        "hard_no_boundary": inserted.pop("no_boundary", 0),
        "insertions_per_hard_example": {str(k): v for k, v in sorted(inserted.items())},
        "mean_insertions": sum(r["n_offload"] for r in hard_b) / max(1, len(hard_b)),
        "hard_target": "relay" if cfg.relay else cfg.hard_target,
        "llm_calls": llm.calls,
        "val": carve or {"carved": False, "heldout_source": cfg.heldout_source},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    save_resolved(out, recipe, cfg, {"world_dir": str(world) if world else None})
    return out


def _curation_examples(cfg, world) -> tuple[list, dict]:
    """The examples to curate (single questions, then conversation turns, each after its history) and the
    conversations' counts."""
    examples = (
        load_examples(cfg.source, world, cfg.split, cfg.question_field, cfg.answer_field, cfg.limit)
        if cfg.source
        else []
    )
    conv_counts = {}
    if cfg.conversations:
        turns, conv_counts = load_conversations(cfg.conversations, world, cfg.conversation_limit, cfg.range_max_turns)
        examples += turns
    if not examples:
        raise ValueError(
            f"curate.source {cfg.source!r} and curate.conversations {cfg.conversations!r} gave no examples"
        )
    return examples, conv_counts


def carve_user_val(cfg, examples: list[Example]) -> tuple[list[Example], list[Example], dict | None]:
    """(examples to curate, val, what was carved or None): a user's data (no world split named) with no
    `heldout_source` gives `val_share` of its conversations to val (`pyrodash.eval.carve.carve_val`, seeded by
    `val_seed`, whole conversations), kept out of training; printed, and recorded in stats.json."""
    if not cfg.carves_val():
        return examples, [], None
    sources = [s for s in (cfg.source, cfg.conversations) if s]
    val, rest = carve_val(examples, cfg.val_share, cfg.val_seed, knob="curate.val_share")
    convs = {k: len({conversation_key(ex) for ex in part}) for k, part in (("val", val), ("train", rest))}
    carve = {"carved": True, "share": cfg.val_share, "seed": cfg.val_seed, "from": sources, "val": len(val),
             "train": len(rest), "val_conversations": convs["val"], "train_conversations": convs["train"]}  # fmt: skip
    print(
        f"pyrodash curate: val: {len(val)} of {len(examples)} examples ({convs['val']} of {sum(convs.values())} "
        f"conversations, share {cfg.val_share:g}, seed {cfg.val_seed}) carved from {', '.join(sources)} into "
        "curated/val.jsonl and kept out of training; evaluate on it and pick your operating point there "
        "(curate.heldout_source names your own val instead)",
        flush=True,
    )
    return rest, val, carve


def write_val(path: Path, val: list[Example], carve: dict) -> None:
    """The carved val as a benchmark file (`problem`, `answer`, the example's id and meta): `pyrodash eval` reads it
    through `benchmark_paths`; a conversation's turn is read as its question alone."""
    path.write_text("".join(json.dumps({"id": ex.id, "problem": ex.question, "answer": ex.gold, "meta": ex.meta})
                            + "\n" for ex in val))  # fmt: skip
    path.with_name("val.carve.json").write_text(json.dumps(carve, indent=2) + "\n")


def _heldout_rows(cfg, world, slm, llm, prompts, counts: dict, carved: list[Example]) -> list[dict]:
    """The held-out examples (`heldout_source`, else the carved val: `carve_user_val`) with their difficulty labels
    (no reconstruction); their counts go into `counts`."""
    if not cfg.heldout_source and not carved:
        return []
    if not cfg.heldout_source:
        held = carved[: cfg.heldout_limit] if cfg.heldout_limit else list(carved)
    else:
        held = load_examples(
            cfg.heldout_source, world, cfg.split, cfg.question_field, cfg.answer_field, cfg.heldout_limit
        )
    if cfg.heldout_conversations:
        held += load_conversations(cfg.heldout_conversations, world, cfg.heldout_conversation_limit)[0]
    _, hdiff, hcounts = label_and_reconstruct(held, slm, llm, prompts, cfg, reconstruct=False, tag="(held-out)")
    counts["heldout"] = {k: hcounts[k] for k in ("examples", "easy", "hard")}
    return [{**ex.to_dict(), "difficulty": hdiff[ex.id]} for ex in held]


def _write_corpora(out: Path, rows_a: list[dict], rows_b: list[dict], heldout: list[dict]) -> None:
    """OUT/corpus_a.jsonl, corpus_b.jsonl, heldout.jsonl and the two corpora as a `datasets` DatasetDict."""
    import datasets

    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus_a", rows_a), ("corpus_b", rows_b), ("heldout", heldout)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.DatasetDict(
        {"corpus_a": datasets.Dataset.from_list(rows_a), "corpus_b": datasets.Dataset.from_list(rows_b)}
    ).save_to_disk(str(out / "dataset"))


def _turn_counts(rows: list[dict], examples: list, difficulty: dict) -> dict:
    """Corpus rows by conversation turn and the share of hard examples at each turn."""
    turn_rows = [r for r in rows if r["turn"]]
    by_turn = {
        str(t): {c: sum(1 for r in turn_rows if r["turn"] == t and r["corpus"] == c) for c in "AB"}
        for t in sorted({r["turn"] for r in turn_rows})
    }
    turn_diff = Counter((ex.meta["turn"], difficulty[ex.id]) for ex in examples if ex.meta.get("turn"))
    return {
        "rows_by_turn": by_turn,
        "hard_share_by_turn": {
            str(t): turn_diff[(t, "hard")] / (turn_diff[(t, "hard")] + turn_diff[(t, "easy")])
            for t in sorted({t for t, _ in turn_diff})
        },
    }


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
