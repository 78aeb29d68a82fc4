"""The requests of Algorithm 1 and the knobs that shape them: the SLM's request (P_s + the query, `<offload>` as a
stop id with `offload_bias` on its logit), the single handoff request to the LLM (Line 6), the handoff share and the
joint token budget (the failure policy is `pyrodash.backends.retry.FailurePolicy`). Pure functions of their inputs:
the engine (`pyrodash.engine.core`) is their only caller outside tests."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

from pyrodash.backends.base import GenRequest
from pyrodash.backends.retry import FailurePolicy  # noqa: F401 - the one failure policy, importable from here too
from pyrodash.chat import Message, Tools
from pyrodash.engine import conversation as conv
from pyrodash.engine.range_rule import RangeRule
from pyrodash.engine.turn import MODES
from pyrodash.prompts import Prompts

BAN = float("-inf")


def check_share(share: float) -> float:
    """A handoff share as a float in [0, 1], or a ValueError naming the range."""
    if not 0.0 <= float(share) <= 1.0:
        raise ValueError(f"handoff_share={share} must be in [0, 1] (the share of requests that may hand off)")
    return float(share)


def handoff_admitted(messages: list[dict], share: float) -> bool:
    """Whether a request may hand off under a handoff share: a fixed hash of its non-system messages, uniform in
    [0, 1), is below `share`. Deterministic (a request and its retries agree), and a share s admits about s of any
    set of distinct requests."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    key = json.dumps([_hashed(m) for m in messages if m.get("role") != "system"])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 < share


def _hashed(m: dict) -> list:
    """What of a message the handoff share hashes: role and content, and a tool turn's calls or call id."""
    key = [m.get("role"), m.get("content")]
    if m.get("tool_calls"):
        key.append(m["tool_calls"])
    if m.get("tool_call_id") is not None:
        key.append(m["tool_call_id"])
    return key


@dataclass(frozen=True)
class EngineRequest:
    """One request as the engine runs it, typed once: the server builds it from the wire request and hands this
    object to `CollaborateEngine.stream`; the kwargs form (`engine.stream(question, **options)`, eval and training)
    becomes one in `EngineRequest.of`. Unset knobs (None) take the engine's defaults."""

    # a question, or a conversation (`chat.Message`s or their dicts) whose last user turn is answered
    question: str | list[dict] | list[Message]
    mode: str = "collab"  # one of MODES: the Collaborate Engine, or the SLM / the LLM alone
    offload_bias: float | None = None  # added to `<offload>`'s logit (a budget may move it)
    handoff_share: float | None = None  # the share of requests that may hand off (a budget may move it)
    max_tokens: int | None = None  # each model's decode limit (the wire's max_tokens_per_model, else the total)
    max_total_tokens: int | None = None  # the joint budget: SLM + LLM output tokens (the wire's max_tokens)
    explicit_budget: bool = False  # the client asked for that joint budget: refused, never shrunk, when too long
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    max_llm_calls: int | None = None  # LLM calls per answer (>1: relay, pyrodash.engine.relay); None: the engine's
    step_sep: str | None = None  # a relay step's end (the LLM's stop sequence); None: the engine's RelayConfig
    step_max_tokens: int | None = None  # a relay step's cap; None: the engine's RelayConfig
    range_rule: RangeRule | None = None  # the SLM's range (past it: the LLM alone); None: the engine's rule
    # asked before each LLM call with the call's request (a budget's reservation on its hard cap): False, and the
    # call is not made (the SLM finishes, as after a failed call; the LLM alone fails); None: every call is made
    gate: Callable[[GenRequest], Awaitable[bool]] | None = None
    # the functions both models may call (the SLM first; after a handoff, the LLM); None: no tools (or tool_choice
    # "none"). With tools an answer is a single handoff (a relay's steps would cut a call in two)
    tools: Tools | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: use one of {', '.join(MODES)}")

    @classmethod
    def of(cls, question: str | list[dict], **options) -> EngineRequest:
        """The request of `engine.stream(question, **options)` (a TypeError names an unknown option)."""
        if isinstance(question, cls):
            return dataclasses.replace(question, **options) if options else question
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unexpected engine option(s): {', '.join(unknown)}")
        return cls(question, **options)

    def options(self) -> dict:
        """The knobs as `engine.stream`'s keyword arguments (no question, no gate)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("question", "gate")}


@dataclass(frozen=True)
class LLMCall:
    """One LLM call of a turn: what it continues (`written`; None: Pack of the SLM's text, the single handoff), its
    cap (None: what is left of the LLM's budget) and its stop strings (None: the request's). A relay step continues
    the trace so far, capped at `step_max_tokens`, with the step separator added to the stop strings."""

    written: str | None = None
    cap: int | None = None
    stop: tuple[str, ...] | None = None


TO_THE_END = LLMCall()  # the single handoff's call: the LLM writes the rest of the answer


def with_system(system: str, messages: list[dict]) -> list[dict]:
    """Put `system` first; a caller's own system message is kept after it in the same system turn."""
    if not system:
        return list(messages)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{system}\n\n{messages[0]['content']}"}] + list(messages[1:])
    return [{"role": "system", "content": system}] + list(messages)


def slm_chat(prompts: Prompts, messages: list[dict]) -> list[dict]:
    """The SLM's chat under P_s (Lines 1-2): P_s first, the conversation's history plain (`<offload>` stripped from
    earlier messages). The engine's SLM request and every training row that teaches it (Corpus B, Stage 3's
    prompts) are built here, so the SLM is trained on the chats it is served."""
    return with_system(prompts.offload_system, conv.clean_history(messages))


def sampling_fields(temperature: float | None, top_p: float | None, seed: int | None, stop: list[str] | None) -> dict:
    """The sampling fields of a `GenRequest` from a caller's options (unset temperature/top_p: the backend default)."""
    sampling: dict = {"seed": seed, "stop": list(stop or [])}
    if temperature is not None:
        sampling["temperature"] = float(temperature)
    if top_p is not None:
        sampling["top_p"] = float(top_p)
    return sampling


def handoff_request(
    prompts: Prompts,
    style: str,
    messages: list[dict],
    partial: str,
    max_tokens: int,
    sampling: dict | None = None,
    tools: list[dict] | None = None,
) -> GenRequest:
    """The LLM request of a handoff (Line 6): "continue" = [P_l] + messages with Pack(O_s) as the assistant prefix;
    "instruct" = [P_l] + one user message `handoff_template` with the last user question and the partial text (in a
    tool loop, after the tool turns that follow that question). `tools`: the functions the LLM may call."""
    sampling = sampling or {}
    if style == "continue":
        msgs = with_system(prompts.completion_system, messages)
        return GenRequest(messages=msgs, prefix=partial, max_tokens=max_tokens, tools=tools, **sampling)
    if style != "instruct":
        raise ValueError(f"handoff style {style!r}: use 'continue' or 'instruct'")
    cur = conv.current_turn_index(messages)
    question = messages[cur]["content"] if cur >= 0 else ""
    user = {"role": "user", "content": prompts.handoff_template.format(question=question, partial=partial)}
    if cur >= 0 and cur < len(messages) - 1:  # a tool loop: the calls and results so far stay in their order
        history = list(messages)
    else:
        history = list(messages[:cur]) if cur >= 0 else []  # earlier turns (and the caller's system text) stay
    msgs = with_system(prompts.completion_system, history + [user])
    return GenRequest(messages=msgs, max_tokens=max_tokens, tools=tools, **sampling)


def total_budget(max_total_tokens: int | None) -> int | None:
    if max_total_tokens is None:
        return None
    if isinstance(max_total_tokens, bool) or not isinstance(max_total_tokens, int) or max_total_tokens <= 0:
        raise ValueError(f"max_total_tokens={max_total_tokens!r} must be a positive integer (or None: no joint limit)")
    return max_total_tokens
