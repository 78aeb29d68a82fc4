"""The built-in world's conversations: follow-up turns that continue from the previous answer.

    user:       47: +7x4 f1                     assistant: (3,1) 47+7=54 ... \boxed{81}
    user:       Then: +3x6 f2                   assistant: (5,2) 81+3=84 ... \boxed{64}

A follow-up's gold is `solve(replace(problem, start=previous answer))`: same steps, same table, so the SLM can hand off
in any turn. Pretraining (`chat_messages`, `pretrain_example`) mixes in conversations of 2..`multiturn_turns` turns
(untaught lookups masked in every turn); evaluation (`make_multiturn_split`) makes one `Example` per turn with the
gold earlier turns as `meta["history"]` and `meta["turn"]` / `meta["conversation"]`. The long splits (`LONG_SPLITS`,
six turns, past what pretraining showed) are made on first use into a built world (`ensure_long_split`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pyrodash.data.example import Example
from pyrodash.world.config import WorldConfig
from pyrodash.world.evaluate import grade, greedy_generate, max_new_tokens_for
from pyrodash.world.task import Problem, Solution, make_known, make_table, sample_problem, solve, untaught_spans
from pyrodash.world.tokenizer import encode_chat

FOLLOWUP = "Then: "


def followup_question(problem: Problem) -> str:
    """A follow-up's text: "Then: " and the problem's operations, without its start (the previous answer)."""
    return FOLLOWUP + problem.program()


def sample_conversation(
    rng: random.Random,
    turns: int,
    first_tier: int,
    followup_tiers: list[int],
    table: list[int],
    sample: Callable[[random.Random, int], Problem] | None = None,
) -> list[tuple[str, Problem, Solution]]:
    """`turns` (question text, problem, gold solution) triples: a problem of `first_tier`, then follow-ups (tiers
    drawn from `followup_tiers`) each starting from the previous answer. `sample(rng, tier)` draws a problem
    (default: `task.sample_problem`)."""
    if turns < 1:
        raise ValueError(f"a conversation has at least one turn, got turns={turns}")
    if not followup_tiers and turns > 1:
        raise ValueError("followup_tiers must list at least one tier for conversations of 2+ turns")
    draw = sample or (lambda r, t: sample_problem(r, t))
    p = draw(rng, first_tier)
    sol = solve(p, table)
    out = [(p.question(), p, sol)]
    for _ in range(turns - 1):
        nxt = draw(rng, rng.choice(followup_tiers))
        p = replace(nxt, start=sol.answer)
        sol = solve(p, table)
        out.append((followup_question(p), p, sol))
    return out


def chat_messages(convo: list[tuple[str, Problem, Solution]], system: str | None = None) -> list[dict]:
    """The whole conversation as chat messages (gold assistant turns)."""
    msgs = [{"role": "system", "content": system}] if system else []
    for q, _, sol in convo:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": sol.text()}]
    return msgs


def assistant_starts(messages: list[dict], encode_chat) -> list[int]:
    """Token position where each assistant message's content starts in `encode_chat(messages)` (found through the
    chat encoder itself, so any template works): the end-of-turn token of an empty assistant message there."""
    starts = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            _, mask = encode_chat(messages[:i] + [{"role": "assistant", "content": ""}])
            starts.append(len(mask) - 1 - mask[::-1].index(1))
    return starts


def pretrain_example(
    rng: random.Random,
    which: str,
    turns_max: int,
    tiers: list[int],
    followup_tiers: list[int],
    table: list[int],
    known: frozenset[int],
    encode_chat,
    system: str | None = None,
    sample: Callable[[random.Random, int], Problem] | None = None,
) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one pretraining conversation of 2..`turns_max` turns; every assistant turn is
    trained, and for the SLM (`which == "slm"`) the results of lookups outside `known` are masked in each."""
    convo = sample_conversation(
        rng, rng.randint(2, max(turns_max, 2)), rng.choice(tiers), followup_tiers, table, sample
    )
    msgs = chat_messages(convo, system)
    ids, mask = encode_chat(msgs)
    if which == "slm":
        for start, (_, _, sol) in zip(assistant_starts(msgs, encode_chat), convo):
            for a, b in untaught_spans(sol, known):
                mask[start + a : start + b] = [0] * (b - a)
    return ids, [t if m else -100 for t, m in zip(ids, mask)]


def make_multiturn_split(
    seed: int,
    n: int,
    turns: int,
    tiers: list[int],
    followup_tiers: list[int],
    table: list[int],
    known: frozenset[int],
    exclude: set[str] | None = None,
    split: str = "multiturn",
    sample: Callable[[random.Random, int], Problem] | None = None,
) -> list[Example]:
    """`n` conversations of `turns` turns as `n * turns` examples (one per turn, gold history in meta); the first
    turns' questions are kept out of `exclude` (and added to it), so no split shares a question."""
    if n < 0:
        raise ValueError(f"split size must be >= 0, got {n}")
    rng = random.Random(f"world-split-{seed}-{split}")
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    c = 0
    while c < n:
        convo = sample_conversation(rng, turns, tiers[c % len(tiers)], followup_tiers, table, sample)
        if convo[0][0] in seen:
            continue
        seen.add(convo[0][0])
        for k, (q, _, sol) in enumerate(convo):
            hard = [i for i, x in sol.lookups if x not in known]
            out.append(
                Example(
                    id=f"world-{split}-{c:05d}-t{k + 1}",
                    benchmark=f"world:{split}",
                    question=q,
                    gold=str(sol.answer),
                    meta={
                        "turn": k + 1,
                        "conversation": f"world-{split}-{c:05d}",
                        "history": chat_messages(convo[:k]),
                        "steps": list(sol.steps),
                        "hard_steps": hard,
                        "solution": sol.text(),
                        "tier": len(sol.lookups),
                    },
                )
            )
        c += 1
    return out


def turn_prompt_ids(ex: Example, encode_chat) -> list[int]:
    """Ids of a conversation turn put to a world model: the gold history, the turn's question, the generation
    prompt."""
    msgs = list(ex.meta.get("history") or []) + [{"role": "user", "content": ex.question}]
    ids, _ = encode_chat(msgs, add_generation_prompt=True)
    return ids


def evaluate_turns(
    model, examples: list[Example], batch_size: int = 200, progress=None, label: str = "turns"
) -> dict[int, float]:
    """{turn: greedy accuracy} of a world model answering each conversation turn after its gold history (the
    build's check that pretraining taught follow-ups)."""
    if not examples:
        return {}
    cap = max(max_new_tokens_for(ex) for ex in examples)
    outs = greedy_generate(
        model, [turn_prompt_ids(ex, encode_chat) for ex in examples], cap, batch_size, progress, label
    )
    ok = grade(outs, [ex.gold for ex in examples])
    by: dict[int, list[bool]] = {}
    for ex, c in zip(examples, ok):
        by.setdefault(int(ex.meta["turn"]), []).append(c)
    return {t: round(sum(v) / len(v), 4) for t, v in sorted(by.items())}


# long conversation splits, made from a built world's own generator on first use: split -> (conversations, turns);
# "multiturn6" is the test split (world:multiturn6, world:multiturn6-self), "multiturn6_val" calibrates the range rule.
# The test split is 120 conversations so that a turn's bar (>= 90% of the LLM alone's accuracy) is measured in steps
# of a few percent: the LLM alone gets ~25% of sixth turns right with its own history, 10 of 40 conversations, where
# one conversation is a whole 10% margin (docs/conversations.md). The validation split is 150 conversations, as the
# world's `val`: the range it picks is read from turns measured in steps of under a point. A larger split keeps a
# smaller one's conversations as its first ones (one generator stream per split); the validation split excludes the
# test split's openers. A world's build writes them (`build.make_splits`, before `val`, which excludes their openers).
LONG_SPLITS = {"multiturn6": (120, 6), "multiturn6_val": (150, 6)}


def ensure_long_split(world_dir: str | Path, split: str) -> Path | None:
    """`DIR/data/<split>.jsonl` for a long split of a built world; every long split is written together on first
    use (or when one on disk has another size than `LONG_SPLITS` says), in `LONG_SPLITS` order (deterministic: the
    world's seed, config and generator; no opener shared with any split). None for any other split name."""
    if split not in LONG_SPLITS:
        return None
    data = Path(world_dir) / "data"
    if not all(_holds(data / f"{name}.jsonl", n * turns) for name, (n, turns) in LONG_SPLITS.items()):
        info_path = Path(world_dir) / "world.json"
        if not info_path.is_file():
            raise FileNotFoundError(f"{world_dir} is not a built world (no world.json): run `pyrodash world build`")
        info = json.loads(info_path.read_text())
        for name, exs in long_splits(WorldConfig.from_dict(info["config"]), int(info["seed"]), data).items():
            tmp = data / f"{name}.jsonl.tmp"
            tmp.write_text("".join(json.dumps(ex.to_dict()) + "\n" for ex in exs))
            tmp.replace(data / f"{name}.jsonl")
    return data / f"{split}.jsonl"


def _holds(path: Path, examples: int) -> bool:
    """Whether `path` is a long split of `examples` examples (one written at another size is made again)."""
    return path.is_file() and sum(1 for line in path.read_text().splitlines() if line.strip()) == examples


def long_splits(cfg: WorldConfig, seed: int, data: Path) -> dict[str, list[Example]]:
    """The long splits of the world (`cfg`, `seed`) whose built splits are in `data` (their questions excluded, but for
    `val`'s, drawn after the long splits: `build.make_splits`, whose long splits these are)."""
    seen: set[str] = set()
    for other in sorted(data.glob("*.jsonl")):
        if other.stem not in LONG_SPLITS and other.stem != "val":
            seen.update(json.loads(line)["question"] for line in other.read_text().splitlines() if line.strip())
    table, known = make_table(seed), make_known(cfg.known_frac)
    out = {}
    for name, (n, turns) in LONG_SPLITS.items():
        out[name] = world_conversations(cfg, seed, name, n, turns, table, known, seen)
    return out


def world_conversations(cfg, seed: int, name: str, n: int, turns: int, table, known, seen: set) -> list:
    """The world `cfg`'s conversation split `name`: `n` conversations of `turns` turns, openers of tiers 1-2 and
    follow-ups of `cfg.followup_tiers`, no opener in `seen` (`make_multiturn_split`)."""
    return make_multiturn_split(
        seed,
        n,
        turns,
        list(cfg.tiers[:2]),
        list(cfg.followup_tiers),
        table,
        known,
        seen,
        split=name,
        sample=lambda r, t: sample_problem(r, t, cfg.max_addend, cfg.lead_runs),
    )
