"""Conversations through the Collaborate Engine: one engine request per user turn, history kept plain and in bounds.

    msgs = clean_history(messages)                    # `<offload>` removed from every earlier message
    msgs, dropped = fit_context(msgs, count, limit)   # oldest turns dropped until prompt + budget fits the window

Earlier assistant turns are plain history whoever wrote them; `<offload>` is stripped from every earlier message
(the current one is the server's literal marking's). Each model's request is trimmed to its own window: when prompt
tokens + decode budget exceed it, whole earlier turns (a user message and the replies up to the next one) are
dropped, oldest first, never a system message nor the current user message; a prompt that alone exceeds the window
is a `ContextLengthError` (the server's 400). Dropped messages are reported (`Done.trimmed`), never silent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyrodash.backends.base import GenRequest, KnowsWindow, Tokenizes
from pyrodash.backends.base import estimate_tokens as base_estimate
from pyrodash.backends.literal import CLOSE, OPEN
from pyrodash.prompts import OFFLOAD_TOKEN


@dataclass(frozen=True)
class ContextLimits:
    """Context windows (tokens) of the two models; None = do not trim for that model."""

    slm: int | None = None  # the SLM's context window in tokens (None: no trimming)
    llm: int | None = None  # the LLM's

    def __post_init__(self) -> None:
        for side in ("slm", "llm"):
            v = getattr(self, side)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"context.{side}={v!r} must be a positive integer (tokens) or null (no trimming)")


class ContextLengthError(ValueError):
    """The current message (with the system prompt) alone does not fit a model's context window."""

    def __init__(self, message: str, prompt_tokens: int, window: int):
        super().__init__(message)
        self.prompt_tokens, self.window = prompt_tokens, window


def strip_offload(text: str) -> str:
    """`text` without `<offload>`, also in the literal-marked form `pyrodash serve` gives client text
    (`pyrodash.backends.literal`), so no empty marker pair is left behind."""
    return text.replace(f"{OPEN}{OFFLOAD_TOKEN}{CLOSE}", "").replace(OFFLOAD_TOKEN, "")


def clean_history(messages: list[dict]) -> list[dict]:
    """The messages with `<offload>` removed from every earlier message (history is plain text for both models).
    The current user message is left as sent: `pyrodash serve` marks special-token text there as plain characters
    (`pyrodash.backends.literal`), so a client's `<offload>` can never fire the handoff token."""
    cur = current_turn_index(messages)
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if i < cur and isinstance(content, str) and OFFLOAD_TOKEN in content:
            m = {**m, "content": strip_offload(content)}
        out.append(m)
    return out


def current_turn_index(messages: list[dict]) -> int:
    """Index of the current user message (the last one); -1 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return -1


def turn_number(messages: list[dict]) -> int:
    """1-based number of the current user turn (the count of user messages)."""
    return sum(1 for m in messages if m.get("role") == "user")


def earlier_turns(messages: list[dict]) -> list[list[int]]:
    """Indices of each droppable earlier turn, oldest first (a user message + the non-system messages after it,
    up to the next user message; non-system messages before the first user message form a turn of their own)."""
    cur = current_turn_index(messages)
    turns: list[list[int]] = []
    for i in range(max(cur, 0)):
        role = messages[i].get("role")
        if role == "system":
            continue
        if role == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return turns


def fit_context(
    messages: list[dict], count: Callable[[list[dict]], int], limit: int | None, budget: int = 0
) -> tuple[list[dict], int]:
    """(messages, dropped): `messages` with the oldest earlier turns removed until `count(messages) + budget <=
    limit` (see the module docstring for the rule). `count` gives the prompt tokens of a message list."""
    if limit is None:
        return messages, 0
    need = count(messages) + budget
    if need <= limit:
        return messages, 0
    drop: set[int] = set()
    kept = messages
    for turn in earlier_turns(messages):
        drop.update(turn)
        kept = [m for i, m in enumerate(messages) if i not in drop]
        need = count(kept) + budget
        if need <= limit:
            return kept, len(drop)
    if need - budget < limit:  # no history left: the decode budget is what the window leaves (ends by "length")
        return kept, len(drop)
    raise ContextLengthError(
        f"the prompt needs {need - budget} tokens even with every earlier turn dropped, but the context window is "
        f"{limit}: shorten the current message or the system prompt",
        need - budget,
        limit,
    )


def estimate_tokens(messages: list[dict], prefix: str = "", tools: list[dict] | None = None) -> int:
    """A conservative token estimate (characters / 3, plus a few per message) for backends that cannot count: the
    backends' own (`pyrodash.backends.base.estimate_tokens`, tool calls and schemas included)."""
    return base_estimate(messages, prefix, tools)


def token_counter(
    backend, prefix: str = "", tools: list[dict] | None = None
) -> tuple[Callable[[list[dict]], int], bool]:
    """(count(messages) -> prompt tokens of a request with `prefix` and `tools`, estimated?): the backend's own
    tokenizer when it has one (`prompt_ids`), else `estimate_tokens`."""
    if isinstance(backend, Tokenizes):
        return (lambda msgs: len(backend.prompt_ids(GenRequest(messages=msgs, prefix=prefix, tools=tools)))), False
    return (lambda msgs: estimate_tokens(msgs, prefix, tools)), True


def backend_context(backend) -> int | None:
    """A backend's context window when it knows one (`KnowsWindow`: an in-process model's
    `max_position_embeddings`); None otherwise."""
    n = backend.context_window() if isinstance(backend, KnowsWindow) else None
    return n if isinstance(n, int) and n > 0 else None


def example_messages(prompts, question: str, history: list[dict] | None = None) -> list[dict]:
    """The chat of an evaluation example: its earlier turns (`Example.meta["history"]`, verbatim) and the question
    under the prompt set's template, as every method puts it to a model."""
    return [dict(m) for m in history or []] + prompts.plain_messages(question)
