"""The world's tool task (`pyrodash.world.tool_task`): gold agent loops that a client can run (a `lookup_g` call
per `g` lookup, the tool's result as the next request's start), written in the world's template as the Hermes-style
blocks the engine's parser reads, and splits that never share a question."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
from doc_blocks import ROOT, blocks_run_by, commands

from pyrodash.chat import ToolCall, Tools, to_dicts
from pyrodash.engine.tool_parser import split
from pyrodash.prompts import get_prompts
from pyrodash.world.task import make_known, make_table
from pyrodash.world.tokenizer import render_chat
from pyrodash.world.tool_task import (
    TOOL,
    ToolProblem,
    answer,
    make_g_table,
    make_tool_split,
    requests,
    run_tool,
    task_usage,
    to_example,
    trajectory,
)

F, G = make_table(0), make_g_table(0)


def test_g_is_its_own_table():
    assert sorted(G) == list(range(100)) and G != F and G == make_g_table(0) and G != make_g_table(1)


@pytest.mark.parametrize("ops", ["g", "f", "fg", "gf", "gg", "fgf"])
def test_a_loop_asks_the_tool_once_per_g_and_ends_in_the_answer(ops):
    p = ToolProblem(47, 7, 2, ops)
    loop = trajectory(p, F, G)
    reqs = requests(loop)
    assert len(reqs) == ops.count("g") + 1 and [m.role for m in loop].count("tool") == ops.count("g")
    for (before, said), nxt in zip(reqs, reqs[1:]):
        (call,) = said.tool_calls
        result = run_tool(G, call)
        assert before[-1].role in ("user", "tool") and nxt[0][-1].content == result  # the tool's answer comes back
        assert nxt[1].content.startswith(result)  # and the next request's text starts from it
    last = reqs[-1][1]
    assert not last.tool_calls and last.content.endswith(f"\\boxed{{{answer(p, F, G):02d}}}")


def test_the_worlds_template_writes_calls_the_engine_reads():
    loop = trajectory(ToolProblem(12, 3, 1, "fg"), F, G)
    text = render_chat(to_dicts(loop), tools=Tools.of([TOOL]).schemas())
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls, errors = split(assistant, "hermes", "slm")
    assert not errors and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("lookup_g", json.loads(loop[1].tool_calls[0].arguments))
    ]
    assert content == loop[1].content


def test_the_tool_answers_a_bad_call_with_an_error_text():
    assert run_tool(G, ToolCall("c", "lookup_g", '{"x": 5}')) == f"g(05)={G[5]:02d}"
    assert run_tool(G, ToolCall("c", "lookup_f", '{"x": 5}')).startswith("error:")
    assert run_tool(G, ToolCall("c", "lookup_g", '{"x": "5"}')).startswith("error:")
    assert run_tool(G, ToolCall("c", "lookup_g", '{"x": 500}')).startswith("error:")


def test_splits_are_distinct_deterministic_and_say_what_each_lookup_needs():
    known = make_known(0.65)
    seen: set[str] = set()
    dev = make_tool_split(0, "dev", 60, [1, 2, 3], known, exclude=seen)
    val = make_tool_split(0, "val", 150, [1, 2, 3], known, exclude=seen)
    assert len({e.question for e in dev + val}) == 210 and [e.question for e in dev] == [
        e.question for e in make_tool_split(0, "dev", 60, [1, 2, 3], known)
    ]
    for e in dev + val:
        ops, needs = e.meta["ops"], e.meta["needs"]
        assert len(ops) == e.meta["tier"] and [n == "tool" for n in needs] == [o == "g" for o in ops]
        assert e.meta["loop"][-1]["content"].endswith(f"\\boxed{{{int(e.gold):02d}}}")
    multi = [e for e in val if e.meta["tier"] > 1]
    assert all(set(e.meta["ops"]) == {"f", "g"} for e in multi)  # both kinds where the tier allows
    assert any("llm" in e.meta["needs"] for e in val) and any("slm" in e.meta["needs"] for e in val)


def test_the_economics_bill_a_handoff_only_where_an_untaught_lookup_is():
    prompts, tools, known = get_prompts("world-v1"), Tools.of([TOOL]).schemas(), make_known(0.65)
    # f(x) for an x the SLM was taught (x < 65) and one it was not: the first needs no LLM, the second one call
    taught = next(
        ToolProblem(s, 1, 1, "gf") for s in range(100) if (s + 1) % 100 < 65 and (G[(s + 1) % 100] + 1) % 100 < 65
    )
    untaught = next(ToolProblem(s, 1, 1, "gf") for s in range(100) if (G[(s + 1) % 100] + 1) % 100 >= 65)
    for p, llm_calls in ((taught, 0), (untaught, 1)):
        ex = to_example(p, F, G, known, "x", 0)
        alone, oracle = task_usage(ex, prompts, tools)
        assert alone.llm_calls == 2 and oracle.llm_calls == llm_calls  # two requests: before and after the tool
        assert alone.llm_cached_in > 0 and alone.llm_cached_in <= alone.llm_in  # the second request re-reads the first
        assert oracle.slm_out > 0 and (oracle.llm_out > 0) == bool(llm_calls)


def test_the_docs_economics_command_runs_as_written():
    """docs/world.md's tool-task block (marked for this file) runs, and prints a row per tier whose oracle is cheaper
    than the LLM alone at both sheets."""
    [block] = blocks_run_by("tests/test_world_tools.py")
    [cmd] = commands(block.text, "python ")
    run = subprocess.run(shlex.split(cmd.replace("python ", f"{sys.executable} ", 1)), cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^t[123] ", line)]
    assert len(rows) == 3 and all(0 < float(r[4]) < 1 and 0 < float(r[6]) < 1 for r in rows), run.stdout
