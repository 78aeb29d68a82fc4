"""Fitting a request's prompt to its model's context window, and measuring it for the server's context check.

`fit` trims a request's messages by the rule of `pyrodash.engine.conversation` and says how many it dropped;
`prompt_size` measures a prompt against a window (`CollaborateEngine.prepare`). Neither keeps what it rendered or
counted: the model that renders keeps it (an in-process model's `PromptMemo`, `pyrodash.backends.hf.prompt_memo`), so
a prompt measured by the check, fitted again when the request runs and decoded by the model goes through its chat
template and its tokenizer once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrodash.backends.base import GenRequest, KnowsWindow, Renders, Tokenizes
from pyrodash.engine import conversation as conv


@dataclass(frozen=True)
class PromptSize:
    """One in-process model's prompt against its window, as `CollaborateEngine.prepare` measured it: `tokens` is its
    count, or an upper bound (its UTF-8 bytes) where that already fits with the whole budget."""

    side: str  # "SLM" or "LLM"
    tokens: int
    window: int


def fit(backend, limit: int | None, req: GenRequest) -> int:
    """Trim `req.messages` (in place) to `limit`, the window of `backend` (None: nothing to fit to), leaving room for
    `req.max_tokens`; the number of earlier messages dropped. A prompt the model renders itself never has more tokens
    than UTF-8 bytes, so one whose bytes fit is not tokenized."""
    if limit is None:
        return 0
    if isinstance(backend, Renders) and len(backend.render(req).encode()) + req.max_tokens <= limit:
        return 0
    count = conv.token_counter(backend, req.prefix, req.tools)[0]  # the backend's own count, else an estimate
    req.messages, dropped = conv.fit_context(req.messages, count, limit, req.max_tokens)
    return dropped


def counts_prompts(backend) -> bool:
    """Whether `backend` counts its prompts against a context window (an in-process model)."""
    return isinstance(backend, KnowsWindow) and isinstance(backend, Tokenizes)


def prompt_size(backend, req: GenRequest, total: int, window: int) -> int:
    """`req`'s prompt tokens against `window`, or its UTF-8 bytes when those fit with `total` (a prompt the model
    renders itself never has more tokens than bytes, so the check's outcome is the same)."""
    if isinstance(backend, Renders):
        n = len(backend.render(req).encode())
        if n + total <= window:
            return n
    return len(backend.prompt_ids(req))
