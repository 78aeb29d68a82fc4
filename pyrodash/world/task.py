"""The built-in world's task: runs of additions mod 100 and lookups in a secret table, worked out line by line.

A problem gives a start, an addend, a run length and a number of lookups. The solution adds the addend `run`
times, then does `lookups` rounds of: look the value up in a fixed random permutation `f: 0..99 -> 0..99` (seeded),
and add the addend `ADDS_PER_LOOKUP` times. The question and its gold solution:

    47: +7x4 f2

    (3,2) 47+7=54
    (2,2) 54+7=61
    (1,2) 61+7=68
    (0,2) 68+7=75

    f(75)=19

    (0,1) 19+7=26

    f(26)=64

    (0,0) 64+7=71

    \\boxed{71}

Every addition line starts with two counters: the additions left in its run and the lookups left. So each line
follows from the line before it (and the table), and no step needs to find its place in the question: a small model
never counts a run or looks far back. The value a lookup needs ends the line before it, right before the step
boundary where the SLM decides whether to hand off (a design choice for the decision's locality; not measured on its
own). The earlier world listed every operation in the question ("Start 47: +5, f, +2, f."): its models had to
locate the next operation there, a skill a 3-layer model learnt late and abruptly, and its solutions were only 1.4x
as long as the prompt. Values are written with two digits ("07").

A step is a run of additions (its lines joined by "\\n") or one lookup; steps are separated by a blank line
(`STEP_SEP`, the boundary GlimpRouter cuts at and `<offload>` is placed at).

Why this shape, measured by `scripts/world_economics.py` from gold solutions before any training:
- reasoning-workload economics: a short question expands into a long worked solution (LLM-only writes ~10x the
  tokens it reads, as in the paper's Table 4 where it writes ~30x);
- the lookups sit after a long lead run, so the first lookup the SLM was not taught falls anywhere from about a
  third of the way through the solution to near its end (`first_hard_frac`); a single handoff there leaves the LLM
  only the rest to write.

The SLM is taught the table only on the inputs below a threshold (`make_known`: 0..64 at known_frac 0.65); the LLM
on all of it. The SLM still pretrains on every kind of problem, but the loss never covers the result of a lookup it
was not taught (`untaught_spans`), so it adds and counts correctly everywhere and fails exactly at those lookups.
Which entry a problem needs is only known once the earlier lines are worked out, so difficulty is hidden from the
question: the SLM meets, mid-solution, a lookup it was never taught (`hard_steps`). A problem of tier t has t
lookups, so higher tiers are longer and more likely to be hard.

Why a threshold and not a random subset of the table: a model can only learn to hand off before a step it cannot do
if it can tell that step apart. Measured on a quick-world SLM (hidden 64) taught a random 65% of the table, a linear
probe on its hidden state at the step boundary before a lookup predicts "untaught" no better than the base rate
(63% vs 65% on held-out problems): the tiny model holds no usable "I never saw f(x)" feature, so no amount of SFT
on attention LoRA makes it emit `<offload>` there (Stage 2 measured 0-7.5% on hard problems). The same probe
predicts "x >= 65" at 96%. A large model's self-knowledge is richer; the threshold gives a small model the same kind
of recognisable gap (like a model that can do arithmetic only up to some size).
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
    """The table inputs the SLM is taught: 0 .. round(known_frac * 100) - 1 (see the module docstring for why a
    threshold)."""
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
) -> list[Example]:
    """`n` distinct problems for `split`, tiers cycling through `tiers`; questions in `exclude` are skipped (and
    the new ones added to it), so splits never share a question."""
    if n < 0:
        raise ValueError(f"split size must be >= 0, got {n}")
    rng = random.Random(f"world-split-{seed}-{split}")
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
