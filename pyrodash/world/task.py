"""The built-in world's task: runs of additions mod 100 and lookups in a secret table, worked out line by line.

    47: +7x4 f2        ->   (3,2) 47+7=54 / (2,2) 54+7=61 / ... / f(75)=19 / (0,1) 19+7=26 / ... / \boxed{71}

A problem (start, addend, run, lookups) adds the addend `run` times, then `lookups` rounds of: look the value up in a
seeded permutation `f` of 0..99 and add the addend `ADDS_PER_LOOKUP` times. Each addition line carries two counters
(additions left in its run, lookups left), so every line follows from the one before it. A step is a run of
additions or one lookup, steps separated by `STEP_SEP` (where `<offload>` goes). The SLM is taught the table only
below a threshold (`make_known`) and its loss never covers an untaught lookup's result (`untaught_spans`), so it fails
exactly there, mid-solution (`hard_steps`); a tier-t problem has t lookups. Why this shape: docs/world.md,
`scripts/world_economics.py`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pyrodash.data.example import Example

STEP_SEP = "\n\n"
LINE_SEP = "\n"
MOD = 100
ADDS_PER_LOOKUP = 1  # additions after every lookup
MAX_RUN = 9  # the counters are one digit


@dataclass(frozen=True)
class Problem:
    start: int
    addend: int  # 1..9
    run: int  # additions before the first lookup (the lead run)
    lookups: int  # rounds of "f, then ADDS_PER_LOOKUP additions"

    def question(self) -> str:
        return f"{self.start:02d}: {self.program()}"

    def program(self) -> str:
        """The question without its start, e.g. "+7x4 f2" (a follow-up turn's operations)."""
        return f"+{self.addend}x{self.run} f{self.lookups}"


@dataclass(frozen=True)
class Solution:
    steps: tuple[str, ...]  # one string per step: a run of addition lines, or "f(62)=19"
    lookups: tuple[tuple[int, int], ...]  # (step index, table input) of every lookup step
    answer: int

    def text(self) -> str:
        return STEP_SEP.join(self.steps) + STEP_SEP + f"\\boxed{{{self.answer:02d}}}"

    def step_starts(self) -> list[int]:
        """Character offset of every step in `text()`."""
        starts, pos = [], 0
        for step in self.steps:
            starts.append(pos)
            pos += len(step) + len(STEP_SEP)
        return starts


def make_table(seed: int) -> list[int]:
    """The secret lookup table f, a random permutation of 0..99 fixed by `seed`."""
    table = list(range(MOD))
    random.Random(f"world-table-{seed}").shuffle(table)
    return table


def make_known(known_frac: float) -> frozenset[int]:
    """The table inputs the SLM is taught: 0 .. round(known_frac * 100) - 1.

    Why a threshold and not a random subset: a model can only learn to hand off before a step it cannot do if it can
    tell that step apart. Measured on a quick-world SLM (hidden 64) taught a random 65% of the table, a linear probe
    on its hidden state at the step boundary before a lookup predicts "untaught" no better than the base rate (63% vs
    65% on held-out problems), and Stage 2 reached 0-7.5% `<offload>` on hard problems; the same probe predicts
    "x >= 65" at 96%. The threshold gives a small model a recognisable gap (like arithmetic only up to some size)."""
    if not 0.0 < known_frac < 1.0:
        raise ValueError(f"known_frac must be in (0, 1), got {known_frac}")
    return frozenset(range(round(known_frac * MOD)))


def add_lines(x: int, n: int, k: int, lookups_left: int) -> tuple[list[str], int]:
    """The worked lines of adding n to x, k times, each after its counters (additions left, lookups left)."""
    lines = []
    for left in range(k - 1, -1, -1):
        y = (x + n) % MOD
        lines.append(f"({left},{lookups_left}) {x:02d}+{n}={y:02d}")
        x = y
    return lines, x


def solve(problem: Problem, table: list[int]) -> Solution:
    """The gold step-by-step solution of `problem` under `table`."""
    steps, lookups = [], []
    lines, x = add_lines(problem.start, problem.addend, problem.run, problem.lookups)
    steps.append(LINE_SEP.join(lines))
    for r in range(problem.lookups - 1, -1, -1):
        lookups.append((len(steps), x))
        steps.append(f"f({x:02d})={table[x]:02d}")
        lines, x = add_lines(table[x], problem.addend, ADDS_PER_LOOKUP, r)
        steps.append(LINE_SEP.join(lines))
    return Solution(tuple(steps), tuple(lookups), x)


def sample_problem(rng: random.Random, tier: int, max_addend: int = 9, runs: tuple[int, int] = (7, 9)) -> Problem:
    """A random problem of `tier` (>= 1 lookups): start 0..99, addend 1..max_addend, lead run in `runs`."""
    if tier < 1:
        raise ValueError(f"tier must be >= 1, got {tier}")
    if not 1 <= max_addend <= 9:
        raise ValueError(f"max_addend must be in 1..9 (one digit), got {max_addend}")
    lo, hi = runs
    if not 1 <= lo <= hi <= MAX_RUN:
        raise ValueError(f"the lead run range must satisfy 1 <= lo <= hi <= {MAX_RUN}, got {runs}")
    return Problem(rng.randrange(MOD), rng.randint(1, max_addend), rng.randint(lo, hi), tier)


def untaught_spans(solution: Solution, known: frozenset[int]) -> list[tuple[int, int]]:
    """Character spans of `solution.text()` holding the result of a lookup outside `known`, e.g. "23" in
    "f(70)=23": the SLM's pretraining loss skips them, so it never learns those entries."""
    starts = solution.step_starts()
    spans = []
    for j, x in solution.lookups:
        if x not in known:
            head = solution.steps[j].index("=") + 1
            spans.append((starts[j] + head, starts[j] + len(solution.steps[j])))
    return spans


def to_example(problem: Problem, table: list[int], known: frozenset[int], split: str, index: int, tier: int) -> Example:
    """The evaluation record of a problem: gold answer, gold steps, and which steps the SLM was not taught."""
    sol = solve(problem, table)
    hard = [i for i, x in sol.lookups if x not in known]
    return Example(
        id=f"world-{split}-{index:05d}",
        benchmark=f"world:{split}",
        question=problem.question(),
        gold=str(sol.answer),
        meta={"tier": tier, "steps": list(sol.steps), "hard_steps": hard, "solution": sol.text()},
    )


def make_split(
    seed: int,
    split: str,
    n: int,
    tiers: list[int],
    table: list[int],
    known: frozenset[int],
    exclude: set[str] | None = None,
    max_addend: int = 9,
    runs: tuple[int, int] = (7, 9),
    stream: str | None = None,
) -> list[Example]:
    """`n` distinct problems for `split`, tiers cycling through `tiers`; questions in `exclude` are skipped (and
    the new ones added to it), so splits never share a question. `stream` names the random stream they are drawn
    from (default: the split's own name)."""
    if n < 0:
        raise ValueError(f"split size must be >= 0, got {n}")
    rng = random.Random(f"world-split-{seed}-{stream or split}")
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    while len(out) < n:
        tier = tiers[len(out) % len(tiers)]
        p = sample_problem(rng, tier, max_addend, runs)
        q = p.question()
        if q in seen:
            continue
        seen.add(q)
        out.append(to_example(p, table, known, split, len(out), tier))
    return out
