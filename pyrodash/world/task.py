"""The built-in world's task: chains of additions mod 100 and lookups in a secret table, solved step by step.

A problem starts from a number and applies a list of operations; `+n` adds n (mod 100) and `f` looks the current
value up in a fixed random permutation `f: 0..99 -> 0..99` (seeded). The question and its gold solution:

    Start 47: +5, f, +2, f.

    47+5=52

    f(52)=19

    19+2=21

    f(21)=64

    \\boxed{64}

Steps are separated by a blank line (`STEP_SEP`, the boundary GlimpRouter cuts at). The SLM is pretrained only on
chains whose lookups hit a "known" subset of the table; the LLM on all entries. Which entry a chain needs is only
known once the earlier steps are done, so a problem's difficulty is hidden from its surface: the SLM solves the
first steps and meets, mid-trajectory, a lookup it was never taught (`hard_steps`). A problem of tier t has t
lookups, each after an addition (2t steps), so higher tiers are longer and more likely to be hard.
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


def make_known(seed: int, known_frac: float) -> frozenset[int]:
    """The table inputs the SLM is taught: a random `known_frac` of 0..99, fixed by `seed`."""
    if not 0.0 < known_frac < 1.0:
        raise ValueError(f"known_frac must be in (0, 1), got {known_frac}")
    xs = list(range(MOD))
    random.Random(f"world-known-{seed}").shuffle(xs)
    return frozenset(xs[: round(known_frac * MOD)])


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


def sample_known_problem(rng: random.Random, tier: int, table: list[int], known: frozenset[int],
                         max_addend: int = 9) -> Problem:
    """A random problem of `tier` whose every lookup hits `known` (rejection sampling): the SLM's curriculum."""
    for _ in range(100_000):
        p = sample_problem(rng, tier, max_addend)
        if all(x in known for _, x in solve(p, table).lookups):
            return p
    raise ValueError(f"could not sample a tier-{tier} problem within the known entries; raise known_frac")


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
