"""The built-in world's tool task: the world's problems with lookups in a second table `g` that neither model is
taught and only a tool returns, solved as an agent loop.

    47: +7x2 fg   ->  request 1: (1,2) 47+7=54 / (0,2) 54+7=61 / f(61)=08 / (0,1) 08+7=15, then a call of
                                 lookup_g with {"x": 15}
                      tool:      g(15)=72
                      request 2: (0,0) 72+7=79 / \\boxed{79}

A problem adds the addend `run` times, then for each letter of its `ops` looks the value up (`f`: the world's table,
written by the model; `g`: a second seeded permutation, asked of the tool `lookup_g`) and adds the addend
`ADDS_PER_LOOKUP` times. Each `g` lookup ends an assistant message with a call; the tool's result comes back as a
`tool` message and the next request continues from it, so a problem of k `g` lookups takes k + 1 requests. The
lines carry the world's counters (additions left in the run, lookups left), as in `pyrodash.world.task`. A tier-t
problem has t lookups; `g_share` of its letters are `g`. Splits draw from their own random streams and never share a
question.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from pyrodash.chat import Message, ToolCall, ToolSpec
from pyrodash.cost import Usage
from pyrodash.data.example import Example
from pyrodash.world.task import ADDS_PER_LOOKUP, LINE_SEP, MOD, STEP_SEP, add_lines, make_table
from pyrodash.world.tokenizer import encode_chat

TOOL_NAME = "lookup_g"
TOOL = ToolSpec(
    TOOL_NAME,
    "The value of the table g at x (0..99).",
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
)


def make_g_table(seed: int) -> list[int]:
    """The tool's table g, a random permutation of 0..99 fixed by `seed` (its own stream, apart from the table f's)."""
    table = list(range(MOD))
    random.Random(f"world-g-table-{seed}").shuffle(table)
    return table


def tool_result(g: list[int], x: int) -> str:
    """What the tool returns for x: the world's lookup line, e.g. "g(15)=72"."""
    if not 0 <= int(x) < MOD:
        return f"error: x={x} is outside 0..{MOD - 1}"
    return f"g({int(x):02d})={g[int(x)]:02d}"


def run_tool(g: list[int], call: ToolCall) -> str:
    """The tool's answer to a call of `lookup_g` (an error text for another name or a malformed call, as a tool
    would answer it: the loop goes on and the model may try again)."""
    if call.name != TOOL_NAME:
        return f"error: no tool named {call.name!r}"
    args = call.args()
    x = args.get("x") if isinstance(args, dict) else None
    if isinstance(x, bool) or not isinstance(x, int):
        return 'error: lookup_g takes {"x": an integer}'
    return tool_result(g, x)


@dataclass(frozen=True)
class ToolProblem:
    start: int
    addend: int  # 1..9
    run: int  # additions before the first lookup
    ops: str  # one letter per lookup: "f" (the model's table) or "g" (the tool's)

    def question(self) -> str:
        return f"{self.start:02d}: +{self.addend}x{self.run} {self.ops}"


def trajectory(p: ToolProblem, f: list[int], g: list[int], ids: str = "call") -> list[Message]:
    """The gold agent loop of `p`: the user's question, then per request an assistant message (its steps, ending in
    a `lookup_g` call for a `g` lookup) and the tool's result, the last assistant message the answer. Call ids are
    `{ids}_{k}`."""
    out: list[Message] = [Message("user", p.question())]
    lines, x = add_lines(p.start, p.addend, p.run, len(p.ops))
    steps = [LINE_SEP.join(lines)]
    for k, op in enumerate(p.ops):
        left = len(p.ops) - k - 1
        if op == "f":
            steps.append(f"f({x:02d})={f[x]:02d}")
            y = f[x]
        else:
            call = ToolCall(f"{ids}_{k}", TOOL_NAME, json.dumps({"x": x}))
            out += [Message("assistant", STEP_SEP.join(steps) + STEP_SEP, tool_calls=(call,))]
            out += [Message("tool", tool_result(g, x), tool_call_id=call.id)]
            steps, y = [tool_result(g, x)], g[x]
        lines, x = add_lines(y, p.addend, ADDS_PER_LOOKUP, left)
        steps.append(LINE_SEP.join(lines))
    out.append(Message("assistant", STEP_SEP.join(steps) + STEP_SEP + f"\\boxed{{{x:02d}}}"))
    return out


def answer(p: ToolProblem, f: list[int], g: list[int]) -> int:
    """The problem's final value."""
    x = p.start
    for _ in range(p.run):
        x = (x + p.addend) % MOD
    for op in p.ops:
        x = (f if op == "f" else g)[x]
        for _ in range(ADDS_PER_LOOKUP):
            x = (x + p.addend) % MOD
    return x


def requests(loop: list[Message]) -> list[tuple[list[Message], Message]]:
    """Each request of an agent loop and its gold answer: (the conversation up to it, the assistant message)."""
    return [(loop[:i], m) for i, m in enumerate(loop) if m.role == "assistant"]


def sample(rng: random.Random, tier: int, g_share: float = 0.5, runs: tuple[int, int] = (7, 9)) -> ToolProblem:
    """A random problem of `tier` lookups (>= 1), each a `g` with probability `g_share` (at least one of each kind
    when the tier allows both and `g_share` is strictly between 0 and 1)."""
    if tier < 1:
        raise ValueError(f"tier must be >= 1, got {tier}")
    ops = "".join("g" if rng.random() < g_share else "f" for _ in range(tier))
    if tier > 1 and 0 < g_share < 1 and len(set(ops)) == 1:
        k = rng.randrange(tier)
        ops = ops[:k] + ("f" if ops[k] == "g" else "g") + ops[k + 1 :]
    return ToolProblem(rng.randrange(MOD), rng.randint(1, 9), rng.randint(*runs), ops)


def to_example(p: ToolProblem, f: list[int], g: list[int], known: frozenset[int], split: str, i: int) -> Example:
    """The evaluation record of a tool problem: gold answer, the gold loop, and which lookups need what: an untaught
    `f` lookup (the SLM cannot do it: a handoff) and every `g` lookup (a tool call)."""
    loop = trajectory(p, f, g)
    x, needs, xs = p.start, [], []
    for _ in range(p.run):
        x = (x + p.addend) % MOD
    for op in p.ops:
        needs.append("tool" if op == "g" else "llm" if x not in known else "slm")
        xs.append(x)
        x = (f if op == "f" else g)[x]
        for _ in range(ADDS_PER_LOOKUP):
            x = (x + p.addend) % MOD
    return Example(
        id=f"world-tools-{split}-{i:05d}",
        benchmark=f"world-tools:{split}",
        question=p.question(),
        gold=str(x),
        meta={"tier": len(p.ops), "ops": p.ops, "needs": needs, "xs": xs, "loop": [m.to_dict() for m in loop]},
    )


def make_tool_split(
    seed: int, split: str, n: int, tiers: list[int], known: frozenset[int], g_share: float = 0.5, exclude=None
) -> list[Example]:
    """`n` distinct tool problems for `split` of world `seed`, tiers cycling through `tiers`, from the split's own
    random stream; questions in `exclude` are skipped (and the new ones added to it)."""
    rng = random.Random(f"world-tools-split-{seed}-{split}")
    f, g = make_table(seed), make_g_table(seed)
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    while len(out) < n:
        p = sample(rng, tiers[len(out) % len(tiers)], g_share)
        if p.question() in seen:
            continue
        seen.add(p.question())
        out.append(to_example(p, f, g, known, split, len(out)))
    return out


# ---- economics from gold loops (no model): what a handoff buys where the context grows at every step ------------


def _tokens(messages: list[dict], tools: list[dict], generation: bool = True) -> int:
    return len(encode_chat(messages, add_generation_prompt=generation, tools=tools)[0])


def task_usage(ex: Example, prompts, tools: list[dict]) -> tuple[Usage, Usage]:
    """(the LLM alone, the oracle) over a tool task's requests, from its gold loop: the LLM alone reads the whole
    conversation each request and writes each assistant message; the oracle lets the SLM write each message and
    hands off once in a message that holds an untaught `f` step, right before it, the LLM writing the rest of that
    message. Input an earlier LLM call of the task already read is counted as `llm_cached_in` (a provider's prompt
    cache: the cached sheet bills it at its own price, the paper's at the full one)."""
    loop, ops, needs, xs = ex.meta["loop"], ex.meta["ops"], ex.meta["needs"], ex.meta["xs"]
    alone, oracle, first, seen = Usage(), Usage(), 0, {"alone": 0, "oracle": 0}
    for i, m in enumerate(loop):
        if m["role"] != "assistant":
            continue
        before, last = loop[:i], ops.find("g", first)
        mine = range(first, len(ops) if last < 0 else last)  # the f lookups this message writes
        prompt = _tokens(before, tools)
        out = _tokens(loop[: i + 1], tools, False) - prompt - 1  # its text and <|im_end|> (not the newline after)
        alone += Usage(llm_in=prompt, llm_out=out, llm_cached_in=min(seen["alone"], prompt), llm_calls=1)
        seen["alone"] = prompt + out
        slm_in = _tokens([{"role": "system", "content": prompts.offload_system}, *before], tools)
        hard = [k for k in mine if needs[k] == "llm"]
        if not hard:
            oracle += Usage(slm_in=slm_in, slm_out=out)
        else:
            cut = m["content"].index(f"f({xs[hard[0]]:02d})=")
            llm_in = _tokens([{"role": "system", "content": prompts.completion_system}, *before], tools) + cut
            oracle += Usage(slm_in=slm_in, slm_out=cut + 1, llm_in=llm_in, llm_out=out - cut,
                            llm_cached_in=min(seen["oracle"], llm_in), llm_calls=1)  # fmt: skip
            seen["oracle"] = llm_in + out - cut
        first = len(ops) if last < 0 else last + 1
    return alone, oracle
