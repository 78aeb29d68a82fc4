"""The built-in world's task: chains of additions mod 100 and lookups in a secret table, solved step by step.

A problem starts from a number and applies a list of operations; `+n` adds n (mod 100) and `f` looks the current
value up in a fixed random permutation `f: 0..99 -> 0..99` (seeded). The question and its gold solution:

    Start 47: +5, f, +2, f.

    47+5=52

    f(52)=19

    19+2=21

    f(21)=64

    \\boxed{64}

Steps are separated by a blank line (`STEP_SEP`, the boundary GlimpRouter cuts at). The SLM is taught the table
only on the inputs below a threshold (`make_known`: 0..64 at known_frac 0.65); the LLM on all of it. The SLM still
pretrains on every kind of chain, but the loss never covers the result of a lookup it was not taught
(`untaught_spans`), so it adds correctly over the whole range and fails exactly at those lookups. Which entry a
chain needs is only known once the earlier steps are done, so a problem's difficulty is hidden from its surface:
the SLM solves the first steps and meets, mid-trajectory, a lookup it was never taught (`hard_steps`). A problem of
tier t has t lookups, each after an addition (2t steps), so higher tiers are longer and more likely to be hard.

Why a threshold and not a random subset of the table: a model can only learn to hand off before a step it cannot do
if it can tell that step apart. Measured on a quick-world SLM (hidden 64) taught a random 65% of the table, a linear
probe on its hidden state at the step boundary before a lookup predicts "untaught" no better than the base rate
(63% vs 65% on held-out problems): the tiny model holds no usable "I never saw f(x)" feature, so no amount of SFT
on attention LoRA makes it emit `<offload>` there (Stage 2 measured 0-7.5% on hard problems). The same probe
predicts "x >= 65" at 96%. A large model's self-knowledge is richer; the threshold gives a 2-layer model the same
kind of recognisable gap (like a model that can do arithmetic only up to some size).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pyrodash.data.example import Example

STEP_SEP = "\n\n"
MOD = 100


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[int | None, ...]  # an int n is "+n", None is a lookup "f"

    def question(self) -> str:
        return f"Start {self.start}: " + ", ".join("f" if op is None else f"+{op}" for op in self.ops) + "."


@dataclass(frozen=True)
class Solution:
    steps: tuple[str, ...]  # one string per step, e.g. "47+35=82" or "f(82)=19"
    lookups: tuple[tuple[int, int], ...]  # (step index, table input) of every lookup step
    answer: int

    def text(self) -> str:
        return STEP_SEP.join(self.steps) + STEP_SEP + f"\\boxed{{{self.answer}}}"


def make_table(seed: int) -> list[int]:
    """The secret lookup table f, a random permutation of 0..99 fixed by `seed`."""
    table = list(range(MOD))
    random.Random(f"world-table-{seed}").shuffle(table)
    return table


def make_known(known_frac: float) -> frozenset[int]:
    """The table inputs the SLM is taught: 0 .. round(known_frac * 100) - 1 (see the module docstring for why a
    threshold)."""
    if not 0.0 < known_frac < 1.0:
        raise ValueError(f"known_frac must be in (0, 1), got {known_frac}")
    return frozenset(range(round(known_frac * MOD)))


def solve(problem: Problem, table: list[int]) -> Solution:
    """The gold step-by-step solution of `problem` under `table`."""
    x, steps, lookups = problem.start, [], []
    for op in problem.ops:
        if op is None:
            lookups.append((len(steps), x))
            steps.append(f"f({x})={table[x]}")
            x = table[x]
        else:
            y = (x + op) % MOD
            steps.append(f"{x}+{op}={y}")
            x = y
    return Solution(tuple(steps), tuple(lookups), x)


def sample_problem(rng: random.Random, tier: int, max_addend: int = 9) -> Problem:
    """A random problem of `tier` (>= 1): `tier` pairs "+n, f" with distinct addends n in 1..max_addend, so each
    step is located in the question by the addend before it (small models cannot count long runs of "f")."""
    if tier < 1:
        raise ValueError(f"tier must be >= 1, got {tier}")
    if not tier <= max_addend < MOD:
        raise ValueError(f"max_addend must be in {tier}..{MOD - 1} (distinct addends per problem), got {max_addend}")
    ops: list[int | None] = []
    for n in rng.sample(range(1, max_addend + 1), tier):
        ops += [n, None]
    return Problem(rng.randrange(MOD), tuple(ops))


def untaught_spans(solution: Solution, known: frozenset[int]) -> list[tuple[int, int]]:
    """Character spans of `solution.text()` holding the result of a lookup outside `known`, e.g. "23" in
    "f(70)=23": the SLM's pretraining loss skips them, so it never learns those entries."""
    starts, pos = [], 0
    for step in solution.steps:
        starts.append(pos)
        pos += len(step) + len(STEP_SEP)
    spans = []
    for j, x in solution.lookups:
        if x not in known:
            head = solution.steps[j].index("=") + 1
            spans.append((starts[j] + head, starts[j] + len(solution.steps[j])))
    return spans


def to_example(problem: Problem, table: list[int], known: frozenset[int], split: str, index: int,
               tier: int) -> Example:
    """The evaluation record of a problem: gold answer, gold steps, and which steps the SLM was not taught."""
    sol = solve(problem, table)
    hard = [i for i, x in sol.lookups if x not in known]
    return Example(
        id=f"world-{split}-{index:05d}", benchmark=f"world:{split}", question=problem.question(),
        gold=str(sol.answer),
        meta={"tier": tier, "steps": list(sol.steps), "hard_steps": hard, "solution": sol.text()},
    )


def make_split(seed: int, split: str, n: int, tiers: list[int], table: list[int], known: frozenset[int],
               exclude: set[str] | None = None, max_addend: int = 9) -> list[Example]:
    """`n` distinct problems for `split`, tiers cycling through `tiers`; questions in `exclude` are skipped (and
    the new ones added to it), so splits never share a question."""
    if n < 0:
        raise ValueError(f"split size must be >= 0, got {n}")
    rng = random.Random(f"world-split-{seed}-{split}")
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    while len(out) < n:
        tier = tiers[len(out) % len(tiers)]
        p = sample_problem(rng, tier, max_addend)
        q = p.question()
        if q in seen:
            continue
        seen.add(q)
        out.append(to_example(p, table, known, split, len(out), tier))
    return out
