"""Tool calls through the Collaborate Engine (no server): the SLM's segment ends in an answer, a tool call or
`<offload>` (one rule for both drivers), after a handoff the LLM gets the tools and may call one, a call's markup is
never streamed as text on any chunking, and the record says who wrote each call. Models: tests/tool_doubles.py."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tool_doubles import TASK, TOOL, ToolDouble, call_text, run_tool, tool_pair

from pyrodash.backends.base import BackendError, GenChunk
from pyrodash.backends.mesh import Member, MeshBackend
from pyrodash.chat import Message, TemplateRefused, ToolCall, ToolChoice, Tools, ToolSpec, render_chat
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, EngineRequest, FailurePolicy, tool_parser
from pyrodash.engine.conversation import fit_context
from pyrodash.engine.core import segment_outcome
from pyrodash.engine.requests import _hashed
from pyrodash.events import Done, LLMDelta, SLMDelta
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.server.budget.reserve import TOOLS_OVERHEAD, worst_case
from pyrodash.world.tokenizer import build_tokenizer

PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)
TOOLS = Tools.of([ToolSpec(TOOL["function"]["name"], TOOL["function"]["description"], TOOL["function"]["parameters"])])


def engine(piece: int = 3) -> CollaborateEngine:
    slm, llm = tool_pair(piece)
    return CollaborateEngine(slm, llm, get_prompts("world-v1"), PRICES, max_tokens=200)


async def streamed(e: CollaborateEngine, messages: list, **kw) -> tuple[str, Done]:
    text, done = "", None
    async for ev in e.stream(messages, tools=TOOLS, **kw):
        if isinstance(ev, (SLMDelta, LLMDelta)):
            text += ev.text
        elif isinstance(ev, Done):
            done = ev
    return text, done


def agent_loop(e: CollaborateEngine, stream: bool = True) -> list[Done]:
    """The task as an agent runs it: request, run the calls, send the results back, until an answer comes."""
    messages: list = [Message("user", TASK)]
    dones = []
    for _ in range(5):
        if stream:
            text, done = asyncio.run(streamed(e, messages))
            assert text == done.output  # the client saw the answer's text, and only it
        else:
            done = e.batch([messages], options=[{"tools": TOOLS}])[0]
        dones.append(done)
        if done.finish_reason != "tool_calls":
            return dones
        messages.append(Message("assistant", done.output, tool_calls=tuple(done.tool_calls)))
        messages += [Message("tool", run_tool(c.name, c.arguments), tool_call_id=c.id) for c in done.tool_calls]
    raise AssertionError("the loop did not end")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "batch"])
def test_the_task_runs_two_calls_one_after_a_handoff_then_answers(stream):
    e = engine()
    first, second, last = agent_loop(e, stream)
    assert first.finish_reason == "tool_calls" and first.handoff is None and first.usage.llm_calls == 0
    assert [(c.name, json.loads(c.arguments), c.by) for c in first.tool_calls] == [("lookup_g", {"x": 3}, "slm")]
    assert first.output == "First I need g(3).\n" and "<tool_call>" not in first.output
    # the second request: the SLM hands off, the LLM continues its trace and calls the tool
    assert second.handoff is not None and second.usage.llm_calls == 1 and second.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments), c.by) for c in second.tool_calls] == [("lookup_g", {"x": 4}, "llm")]
    assert [s["by"] for s in second.segments] == ["slm", "llm"] and "<tool_call>" not in second.output
    # the third starts with the SLM again, and it answers
    assert last.finish_reason == "stop" and last.output.endswith("\\boxed{41}") and last.handoff is None
    rec = Record.from_done(second).to_json()
    assert [c["by"] for c in rec["tool_calls"]] == ["llm"] and rec["finish_reason"] == "tool_calls"
    slm, llm = e.slm, e.llm
    assert all(r.tools == TOOLS.schemas() for r in slm.requests + llm.requests)  # both models were offered them
    assert any(m.get("role") == "tool" for m in llm.requests[0].messages)  # the LLM read the tool result


@pytest.mark.parametrize("piece", [1, 2, 5, 7, 64])
def test_no_chunking_streams_a_call_as_text(piece):
    e = engine(piece)
    for done in agent_loop(e, stream=True):
        assert "tool_call" not in done.output and "lookup_g" not in done.output


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(alphabet="ab <>/_lot", max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8),
    x=st.integers(0, 99),
)
def test_the_stream_parse_is_the_whole_parse_on_every_chunking(before, cuts, x):
    text = before + call_text(x) + "\n" + call_text(x + 1)
    p = tool_parser.ToolCallParser("hermes", "llm")
    bounds = sorted({min(c, len(text)) for c in cuts}) + [len(text)]
    shown, start = "", 0
    for b in bounds:
        shown += p.feed(text[start:b])
        start = b
    shown += p.finish()
    content, calls, errors = tool_parser.split(text, "hermes", "llm")
    assert shown == content and [c.arguments for c in p.calls] == [c.arguments for c in calls] and not errors
    assert [json.loads(c.arguments)["x"] for c in calls] == [x, x + 1] and "<tool_call" not in shown


@pytest.mark.parametrize(
    "text, errors",
    [
        ("ok <tool_call>{not json}</tool_call>", 1),
        ('ok <tool_call>{"arguments": {}}</tool_call>', 1),  # no name
        ('ok <tool_call>{"name": "f", "arguments": {"x"', 1),  # never closed (cut by the budget)
    ],
)
def test_a_malformed_call_is_dropped_and_named_never_content(text, errors):
    content, calls, errs = tool_parser.split(text, "hermes", "slm")
    assert content == "ok " and calls == [] and len(errs) == errors and errs[0].startswith("slm:")


def test_a_malformed_call_from_the_slm_is_recorded_in_the_done():
    slm = ToolDouble("bad-slm", lambda req: ('Let me see. <tool_call>{"name": "lookup_g"', False), offload=True)
    e = CollaborateEngine(slm, tool_pair()[1], get_prompts("world-v1"), PRICES, max_tokens=200)
    text, done = asyncio.run(streamed(e, [Message("user", TASK)]))
    assert text == done.output == "Let me see. " and done.tool_calls == [] and done.finish_reason == "stop"
    assert len(done.tool_call_errors) == 1 and "not closed" in done.tool_call_errors[0]
    assert Record.from_done(done).tool_call_errors == done.tool_call_errors


def test_the_json_family_reads_a_whole_answer_as_a_call():
    content, calls, _ = tool_parser.split(' {"name": "f", "arguments": {"a": 1}}', "json", "llm")
    assert content == "" and [(c.name, c.args()) for c in calls] == [("f", {"a": 1})]
    assert tool_parser.split("{ not a call", "json")[0] == "{ not a call"  # JSON-looking text stays text


def test_one_rule_ends_a_segment():
    call = [ToolCall("c", "f")]
    assert segment_outcome(True, call) == "tool_calls"  # complete calls, then <offload>: the calls are the answer
    assert segment_outcome(True, []) == "offload" and segment_outcome(False, []) == "answer"


def test_a_half_call_before_offload_is_not_packed_for_the_llm():
    slm = ToolDouble("half", lambda req: ('Step one. <tool_call>{"name": "look', True), offload=True)
    llm = ToolDouble("llm", lambda req: ("Done.", False), offload=False)
    e = CollaborateEngine(slm, llm, get_prompts("world-v1"), PRICES, max_tokens=200)
    text, done = asyncio.run(streamed(e, [Message("user", TASK)]))
    assert done.handoff is not None and llm.requests[0].prefix.rstrip() == "Step one."
    assert text == done.output == "Step one. Done." and len(done.tool_call_errors) == 1


def test_tool_choice_none_offers_no_tools_and_parallel_false_keeps_one_call():
    assert Tools.of([ToolSpec("f")], ToolChoice("none")) is None
    two = ToolDouble("two", lambda req: (call_text(1) + call_text(2), False), offload=True)
    e = CollaborateEngine(two, tool_pair()[1], get_prompts("world-v1"), PRICES, max_tokens=200)
    one = Tools.of([ToolSpec("lookup_g")], parallel=False)
    done = e.run([Message("user", TASK)], tools=one)
    assert len(done.tool_calls) == 1 and "parallel_tool_calls" in done.tool_call_errors[0]


def test_a_relay_request_with_tools_is_a_single_handoff_and_says_so():
    e = engine()
    messages = [Message("user", TASK), *_first_call_turn(e)]
    done = e.run(messages, tools=TOOLS, max_llm_calls=4)
    assert done.relay_fallback == "tools" and done.usage.llm_calls == 1 and done.finish_reason == "tool_calls"


def _first_call_turn(e: CollaborateEngine) -> list[Message]:
    first = e.run([Message("user", TASK)], tools=TOOLS)
    c = first.tool_calls[0]
    return [
        Message("assistant", first.output, tool_calls=(c,)),
        Message("tool", run_tool(c.name, c.arguments), tool_call_id=c.id),
    ]


class HalfCallThenFail(ToolDouble):
    """TEST DOUBLE endpoint: streams a step and half a tool call, then its connection breaks."""

    async def stream(self, req):
        self.requests.append(req)
        for piece in ("Looking it up.\n", '<tool_call>\n{"name": "look'):
            yield GenChunk(text=piece, token_ids=[1])
        raise BackendError("connection reset", kind="incomplete")


@pytest.mark.parametrize("through", ["mesh", "retry"])
def test_a_takeover_or_retry_writes_a_half_call_again_whole(through):
    """A mesh's next endpoint (or the engine's retry) continues the text before the open call, never the half call
    itself; the half is dropped and named, the whole call is the answer's."""
    broken = HalfCallThenFail("broken", lambda req: ("", False), offload=False)
    good = ToolDouble("good", lambda req: (call_text(4), False), offload=False)
    if through == "mesh":
        llm = MeshBackend([Member(broken, "broken"), Member(good, "good")])
        policy = FailurePolicy(retries=0)
    else:
        llm = Flaky(broken, good)
        policy = FailurePolicy(retries=1, backoff_s=0.0)
    e = CollaborateEngine(tool_pair()[0], llm, get_prompts("world-v1"), PRICES, max_tokens=200, failure=policy)
    messages = [Message("user", TASK), *_first_call_turn(e)]
    text, done = asyncio.run(streamed(e, messages))
    assert good.requests[0].prefix.endswith("Looking it up.\n")  # the half call is not continued
    assert [json.loads(c.arguments) for c in done.tool_calls] == [{"x": 4}] and "tool_call" not in text
    # the dropped half is named: in the broken endpoint's own segment (mesh), or where the retry began it again
    why = "was not closed" if through == "mesh" else "restarted before it closed"
    assert len(done.tool_call_errors) == 1 and why in done.tool_call_errors[0], done.tool_call_errors


class Flaky:
    """TEST DOUBLE LLM: its first request goes to `first` (which breaks), every later one to `then`."""

    def __init__(self, first, then) -> None:
        self.first, self.then, self.name, self.n = first, then, "flaky", 0

    def token_id(self, token: str):
        return None

    def stream(self, req):
        self.n += 1
        return (self.first if self.n == 1 else self.then).stream(req)

    async def aclose(self) -> None:
        return None


def test_the_handoff_share_hashes_tool_turns_and_keeps_plain_ones_as_they_were():
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    old = json.dumps([[m.get("role"), m.get("content")] for m in plain])  # the key before tool turns existed
    assert json.dumps([_hashed(m) for m in plain]) == old  # a plain conversation's share decision does not move
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    a = [
        *plain,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ]
    b = [*a[:-1], {"role": "tool", "tool_call_id": "c2", "content": "1"}]
    keys = {hashlib.sha256(json.dumps([_hashed(m) for m in x]).encode()).hexdigest() for x in (a, b)}
    assert len(keys) == 2  # the call id (and the call) are part of what is hashed


def test_fitting_drops_a_call_and_its_result_together():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "old question " * 20},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "old result " * 20},
        {"role": "user", "content": "new"},
    ]
    kept, dropped = fit_context(msgs, lambda ms: sum(len(str(m.get("content"))) for m in ms), 60)
    assert dropped == 3 and [m["role"] for m in kept] == ["system", "user"]  # never a result without its call


def test_a_budgets_worst_case_counts_the_tools_and_the_tool_turns():
    """The hard cap's reservation bounds what the provider bills: the tools' schemas and every tool call and result in
    the history are input the LLM reads, so they are in the worst case (a revert that drops them reserves less than
    the double bills for that prompt)."""
    e = engine()
    history = [Message("user", TASK), *_first_call_turn(e)]
    plain = worst_case(e, EngineRequest(history, max_tokens=50, max_total_tokens=50), "llm")
    offered = worst_case(e, EngineRequest(history, max_tokens=50, max_total_tokens=50, tools=TOOLS), "llm")
    schema_bytes = len(json.dumps(TOOLS.schemas()).encode()) + TOOLS_OVERHEAD
    assert offered.collab - plain.collab >= schema_bytes * PRICES.llm_in / 1e6 * 0.999
    user, called, result = history
    same_text = [user, Message("assistant", called.content), Message("user", result.content)]  # no call, no id
    a = worst_case(e, EngineRequest(same_text, max_tokens=50, max_total_tokens=50), "llm").llm
    b = worst_case(e, EngineRequest(history, max_tokens=50, max_total_tokens=50), "llm").llm
    sent = [m.to_dict() for m in history]
    extra = sum(len(json.dumps([m.get("tool_calls"), m.get("tool_call_id")]).encode()) for m in sent[1:])
    assert b - a >= extra * PRICES.llm_in / 1e6 * 0.999  # the call's JSON and its result's id are counted


def test_a_template_that_shows_no_tools_refuses_them_by_name():
    """A model whose chat template has no place for tools (or for a tool turn) is never offered them silently: the
    renderer raises `TemplateRefused` naming the field (the server's 400 `unsupported_for_model`)."""
    tok = build_tokenizer()
    tok.chat_template = (  # a template that knows no tools and refuses a tool turn
        "{%- for m in messages -%}{%- if m['role'] == 'tool' -%}{{ raise_exception('no tool turns') }}{%- endif -%}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor -%}"
    )
    with pytest.raises(TemplateRefused) as e:
        render_chat(tok, [{"role": "user", "content": "q"}], TOOLS.schemas())
    assert e.value.param == "tools"
    with pytest.raises(TemplateRefused) as e:
        render_chat(tok, [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c", "content": "1"}])
    assert e.value.param == "messages"
