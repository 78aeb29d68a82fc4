"""A candidate world v2 task (a design study, not wired into the build): runs of additions mod 100 and lookups in
the secret table, worked out line by line. `scripts/world_economics.py --design v2` measures its economics; the
README's "Known gaps" gives what pretraining it measured (the models did not learn it within the build budget).

A problem starts from a number and applies groups of operations; `+nxk` adds n (mod 100) k times, and `f` looks
the current value up in a fixed random permutation `f: 0..99 -> 0..99` (seeded). A compact question expands into a
long worked solution, as in reasoning workloads (the LLM writes ~10x the tokens it reads):

    47: +5x3 f +2x1 f +7x2

    47+5=52 (2 left)
    52+5=57 (1 left)
    57+5=62 (0 left)

    f(62)=19

    19+2=21 (0 left)

    f(21)=64

    64+7=71 (1 left)
    71+7=78 (0 left)

    \\boxed{78}

A step is one group of additions (its lines joined by "\\n") or one lookup; steps are separated by a blank line
(`STEP_SEP`, the boundary GlimpRouter cuts at and `<offload>` is placed at). Every addition line carries a countdown
("(2 left)"): the count is copied once from the question and then decremented on each line, so a 2-layer model never
has to count a long run. Addends are distinct within a problem, so the model finds its place in the question from
the addend of the group it just finished (small models cannot count runs of "f").

Where the hard steps fall: a tier-t problem has t lookups between t+1 groups; the first group ("lead") and the last
("tail") are long runs, the groups between lookups short ones, so the lookups sit in the middle of the solution and
the first lookup the SLM was not taught lies, as a fraction of the gold solution's length, between about 0.3 and 0.8
(`first_hard_frac`). A single handoff there leaves the LLM only the rest of the solution to write.

What the SLM is taught (the table below a threshold), why a threshold, and how hidden difficulty arises are as in
the built-in world: see `pyrodash/world/task.py`'s docstring; this module reuses its table and threshold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pyrodash.data.example import Example
from pyrodash.world.task import MOD, STEP_SEP, make_known, make_table  # noqa: F401  (the same table and threshold)

LINE_SEP = "\n"
MAX_REPS = 9  # the countdown is one digit

# (lo, hi) repetitions of the lead group, of the groups between lookups, and of the tail group.
Reps = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
DEFAULT_REPS: Reps = ((4, 9), (1, 1), (3, 6))
LEAD_GROUPS = 2  # groups of additions before the first lookup


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[int, int] | None, ...]  # (n, k) is "+nxk" (add n, k times); None is a lookup "f"

    def question(self) -> str:
        return f"{self.start}: " + " ".join("f" if op is None else f"+{op[0]}" if op[1] == 1 else f"+{op[0]}x{op[1]}"
                                            for op in self.ops)


@dataclass(frozen=True)
class Solution:
    steps: tuple[str, ...]  # one string per step: a group of addition lines, or "f(62)=19"
    lookups: tuple[tuple[int, int], ...]  # (step index, table input) of every lookup step
    answer: int

    def text(self) -> str:
        return STEP_SEP.join(self.steps) + STEP_SEP + f"\\boxed{{{self.answer}}}"

    def step_starts(self) -> list[int]:
        """Character offset of every step in `text()`."""
        starts, pos = [], 0
        for step in self.steps:
            starts.append(pos)
            pos += len(step) + len(STEP_SEP)
        return starts


def add_lines(x: int, n: int, k: int) -> tuple[list[str], int]:
    """The worked lines of "+nxk" from x, each with its countdown, and the value after them."""
    lines = []
    for left in range(k - 1, -1, -1):
        y = (x + n) % MOD
        lines.append(f"{x}+{n}={y} ({left} left)")
        x = y
    return lines, x


def solve(problem: Problem, table: list[int]) -> Solution:
    """The gold step-by-step solution of `problem` under `table`."""
    x, steps, lookups = problem.start, [], []
    for op in problem.ops:
        if op is None:
            lookups.append((len(steps), x))
            steps.append(f"f({x})={table[x]}")
            x = table[x]
        else:
            lines, x = add_lines(x, op[0], op[1])
            steps.append(LINE_SEP.join(lines))
    return Solution(tuple(steps), tuple(lookups), x)


def check_reps(reps: Reps) -> None:
    if len(reps) != 3 or any(not (1 <= lo <= hi <= MAX_REPS) for lo, hi in reps):
        raise ValueError(f"reps must be three (lo, hi) pairs with 1 <= lo <= hi <= {MAX_REPS} (lead, middle, "
                         f"tail groups), got {reps}")


def sample_problem(rng: random.Random, tier: int, max_addend: int = 9, reps: Reps = DEFAULT_REPS,
                   lead_groups: int = LEAD_GROUPS) -> Problem:
    """A random problem of `tier` (>= 1): `lead_groups` long runs of additions, then t lookups each followed by a
    group (short between lookups, a long run at the tail), addends distinct in 1..max_addend (`reps`)."""
    if tier < 1:
        raise ValueError(f"tier must be >= 1, got {tier}")
    if not tier + lead_groups <= max_addend < MOD:
        raise ValueError(f"max_addend must be in {tier + lead_groups}..{MOD - 1} (distinct addends per problem), "
                         f"got {max_addend}")
    check_reps(reps)
    addends = rng.sample(range(1, max_addend + 1), tier + lead_groups)
    ops: list[tuple[int, int] | None] = []
    for i, n in enumerate(addends):
        if i >= lead_groups:
            ops.append(None)
        lo, hi = reps[0] if i < lead_groups else reps[2] if i == len(addends) - 1 else reps[1]
        ops.append((n, rng.randint(lo, hi)))
    return Problem(rng.randrange(MOD), tuple(ops))


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


def first_hard_frac(solution: Solution, hard: list[int]) -> float | None:
    """Where the first hard step starts, as a fraction of the gold solution's length (None: no hard step). A
    single handoff there leaves the LLM this fraction's complement of the solution to write."""
    if not hard:
        return None
    return solution.step_starts()[hard[0]] / len(solution.text())


def to_example(problem: Problem, table: list[int], known: frozenset[int], split: str, index: int,
               tier: int) -> Example:
    """The evaluation record of a problem: gold answer, gold steps, and which steps the SLM was not taught."""
    sol = solve(problem, table)
    hard = [i for i, x in sol.lookups if x not in known]
    frac = first_hard_frac(sol, hard)
    return Example(
        id=f"world-{split}-{index:05d}", benchmark=f"world:{split}", question=problem.question(),
        gold=str(sol.answer),
        meta={"tier": tier, "steps": list(sol.steps), "hard_steps": hard, "solution": sol.text(),
              "first_hard_frac": None if frac is None else round(frac, 4)},
    )


def make_split(seed: int, split: str, n: int, tiers: list[int], table: list[int], known: frozenset[int],
               exclude: set[str] | None = None, max_addend: int = 9, reps: Reps = DEFAULT_REPS) -> list[Example]:
    """`n` distinct problems for `split`, tiers cycling through `tiers`; questions in `exclude` are skipped (and
    the new ones added to it), so splits never share a question."""
    if n < 0:
        raise ValueError(f"split size must be >= 0, got {n}")
    rng = random.Random(f"world-split-{seed}-{split}")
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    while len(out) < n:
        tier = tiers[len(out) % len(tiers)]
        p = sample_problem(rng, tier, max_addend, reps)
        q = p.question()
        if q in seen:
            continue
        seen.add(q)
        out.append(to_example(p, table, known, split, len(out), tier))
    return out
