"""TEST DOUBLES of an SLM and an LLM that call tools, for the tool-loop tests (tests/test_tools*.py), until the
built-in world's models learn a tool-call format: both speak the Backend protocol and write Hermes-style
`<tool_call>{json}</tool_call>` blocks, streamed in small pieces so that a call is split across chunks.

The task: "What is g(3) + g(4)?", where only the tool `lookup_g` knows g. Request by request:
1. no tool result yet: the SLM writes a step and calls `lookup_g(x=3)` itself;
2. one result: the SLM writes a step and emits `<offload>`; the LLM (after the handoff) calls `lookup_g(x=4)`;
3. two results: the SLM writes the final answer, `\\boxed{g(3) + g(4)}`.
`G` is the table the tool (the test's own function) reads.
"""

from __future__ import annotations

import asyncio
import json
import re

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.prompts import OFFLOAD_TOKEN

OFFLOAD_ID = 7
G = {3: 11, 4: 30}
TASK = "What is g(3) + g(4)? Use the tool lookup_g."
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_g",
        "description": "The value of g at x.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}


def lookup_g(x: int) -> str:
    """The tool itself (what an agent runs between two requests)."""
    return f"g({x}) = {G[int(x)]}"


def call_text(x: int) -> str:
    return '<tool_call>\n{"name": "lookup_g", "arguments": {"x": ' + str(x) + "}}\n</tool_call>"


def results(req: GenRequest) -> list[int]:
    """The g values the conversation's tool results hold, in order."""
    found = []
    for m in req.messages:
        if m.get("role") == "tool":
            found += [int(v) for v in re.findall(r"= (\d+)", str(m.get("content")))]
    return found


class ToolDouble:
    """TEST DOUBLE backend: writes `script(req)`'s text in pieces of `piece` characters (one token id each), then
    stops; `(text, True)` ends in `<offload>` when the request lists its id as a stop token and does not ban it.
    Records every request (`requests`), so a test can see the tools reach the model."""

    def __init__(self, name: str, script, offload: bool, piece: int = 3) -> None:
        self.name, self.script, self.offload, self.piece = name, script, offload, piece
        self.requests: list[GenRequest] = []

    def token_id(self, token: str) -> int | None:
        return OFFLOAD_ID if token == OFFLOAD_TOKEN and self.offload else None

    async def stream(self, req: GenRequest):
        self.requests.append(req)
        text, hand_off = self.script(req)
        hands_off = hand_off and OFFLOAD_ID in req.stop_token_ids and req.logit_bias.get(OFFLOAD_ID, 0) > -100
        pieces = [text[i : i + self.piece] for i in range(0, len(text), self.piece)][: req.max_tokens]
        for i, p in enumerate(pieces):
            await asyncio.sleep(0)
            yield GenChunk(text=p, token_ids=[100 + i])
        yield GenChunk(
            finish_reason="stop" if len(pieces) < req.max_tokens or hands_off else "length",
            stop_token_id=OFFLOAD_ID if hands_off else None,
            prompt_tokens=20 + sum(len(str(m.get("content") or "")) for m in req.messages) // 4,
            completion_tokens=len(pieces) + int(hands_off),
        )

    async def aclose(self) -> None:
        return None


def slm_script(req: GenRequest) -> tuple[str, bool]:
    got = results(req)
    if not req.tools:
        return "I cannot look g up without the tool.", False
    if not got:
        return "First I need g(3).\n" + call_text(3), False
    if len(got) == 1:
        return f"So g(3) = {got[0]}. Next, g(4): ", True
    return f"g(3) + g(4) = {got[0]} + {got[1]} = \\boxed{{{got[0] + got[1]}}}", False


def llm_script(req: GenRequest) -> tuple[str, bool]:
    if req.tools and len(results(req)) == 1:
        return "I will look it up.\n" + call_text(4), False
    return "I have no tool to call.", False


def tool_pair(piece: int = 3) -> tuple[ToolDouble, ToolDouble]:
    """(the SLM double, the LLM double) of the task."""
    return ToolDouble("tool-slm", slm_script, offload=True, piece=piece), ToolDouble(
        "tool-llm", llm_script, offload=False, piece=piece
    )


def run_tool(name: str, arguments: str) -> str:
    assert name == "lookup_g", name
    return lookup_g(json.loads(arguments)["x"])
