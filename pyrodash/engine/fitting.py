"""Fitting a request's prompt to its model's context window, and measuring it: the engine's own, and the one place
where a `Fitted` is written.

`fit` trims a request's messages by the rule of `pyrodash.engine.conversation` and keeps what it found (`Fitted`:
messages dropped, the prompt's size, for an in-process model the rendered prompt and maybe its token ids), so
neither the server's context check (`prompt_size`, via `CollaborateEngine.prepare`) nor the backend renders or
tokenizes that prompt again. The LLM-only estimate's prompt count (`llm_only_count`) reuses it too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from pyrodash.backends.base import GenRequest, KnowsWindow, Renders, Tokenized, Tokenizes
from pyrodash.engine import conversation as conv
from pyrodash.engine.turn import Candidate, Fitted, Turn


@dataclass(frozen=True)
class PromptSize:
    """One in-process model's prompt against its window, as `CollaborateEngine.prepare` measured it: `tokens` is its
    count, or an upper bound (its UTF-8 bytes) where that already fits with the whole budget."""

    side: str  # "SLM" or "LLM"
    tokens: int
    window: int


@dataclass(frozen=True)
class Prepared:
    """What `CollaborateEngine.prepare` found: the request's Turn (mode "collab", run as it is by `stream` when the
    request carries it as `prepared`), else None; and each counting model's prompt size."""

    turn: Turn | None
    sizes: list[PromptSize]


def fit(backend, limit: int | None, req: GenRequest, seen: list[Fitted] | None = None) -> Fitted:
    """Trim `req.messages` (in place) to `limit` (the window of `backend`) and return what was found. `seen`: the
    prompts this request rendered already (`Turn.seen`): a request fitted before (the same model, messages and
    prefix) shares its candidates (each message list rendered and tokenized once per request), and this one is
    added."""
    got = Fitted(
        budget=req.max_tokens,
        limit=limit,
        backend=backend,
        prefix=req.prefix,
        asked=req.messages,
        raw=issubclass(type(backend), Renders),  # (its class: a wrapper forwarding `render` gets messages)
    )
    if limit is None:  # nothing to fit to (the server's check may have rendered this prompt: sent as it is)
        known = next((f for f in seen or () if f.same_prompt(backend, req)), None)
        if known is not None:
            got.text, got.messages, got.tokenized = known.text, req.messages, known.tokenized
        return got
    # in-process: a prompt never has more tokens than UTF-8 bytes, so no tokenizing when it fits
    if isinstance(backend, Renders) and isinstance(backend, Tokenizes):
        return _fit_rendered(got, backend, limit, req, seen)
    if isinstance(backend, Renders):
        _share_candidates(got, backend, req, seen)
        whole = _Candidates(got, backend, req).get(req.messages, True)
        got.text, got.messages, got.tokenized = whole.text, req.messages, whole.tokenized
        got.prompt = len(whole.text.encode())
        if got.prompt + req.max_tokens <= limit:
            return got
    return _fit_counted(got, backend, limit, req)


def _fit_counted(got: Fitted, backend, limit: int, req: GenRequest) -> Fitted:
    """Fitting by the backend's own count (`prompt_ids`), else an estimate: nothing rendered is kept."""
    count = conv.token_counter(backend, req.prefix)[0]
    got.text = got.tokenized = None

    def counting(msgs: list[dict]) -> int:  # fit_context counts the message list it returns last
        got.prompt = count(msgs)
        return got.prompt

    req.messages, got.dropped = conv.fit_context(req.messages, counting, limit, req.max_tokens)
    got.counted = True
    return got


def _fit_rendered(got: Fitted, backend, limit: int, req: GenRequest, seen: list[Fitted] | None) -> Fitted:
    """Fitting an in-process model's prompt: rendered once; tokenized only when its bytes may not fit."""
    _share_candidates(got, backend, req, seen)
    cands = _Candidates(got, backend, req)
    full = req.messages
    whole = cands.get(full, True)
    got.text, got.messages, got.tokenized = whole.text, full, whole.tokenized
    got.prompt = len(whole.text.encode())
    if got.prompt + req.max_tokens <= limit:
        return got
    req.messages, got.dropped = conv.fit_context(full, lambda m: cands.get(m, False).n, limit, req.max_tokens)
    kept = cands.get(req.messages, True)  # (fit_context counted it last)
    if kept.tokenized is None or kept.tokenized.text is not kept.text:  # (its ids were let go: counted again)
        kept.n = None
        kept = cands.get(req.messages, False)
    got.prompt, got.text, got.messages, got.tokenized = kept.n, kept.text, req.messages, kept.tokenized
    got.counted = True
    for c in got.candidates.values():  # the request's own list and the one kept keep their text and ids
        if c is not kept and c is not whole:
            c.text = c.tokenized = None
    return got


def _share_candidates(got: Fitted, backend, req: GenRequest, seen: list[Fitted] | None) -> None:
    """`got.candidates`: those of the same request fitted before in this turn, else new ones (seeded with the
    same prompt's rendering if one was made), and `got` joins `seen`."""
    known = next((f for f in seen or () if f.same_request(backend, req)), None)
    got.candidates = known.candidates if known is not None else {}
    if known is not None:
        return
    same = next((f for f in seen or () if f.same_prompt(backend, req)), None)  # (its text is this one)
    if same is not None:
        tok = same.tokenized if same.tokenized is not None and same.tokenized.text is same.text else None
        n = None if tok is None else len(tok.ids)
        got.candidates[len(req.messages)] = Candidate(req.messages, same.text, tok, n)
    if seen is not None:
        seen.append(got)


class _Candidates:
    """The message lists fitting considered (by length), each rendered and counted at most once."""

    def __init__(self, got: Fitted, backend, req: GenRequest) -> None:
        self.cands, self.backend, self.req = got.candidates, backend, req
        self.full = req.messages

    def get(self, msgs: list[dict], text: bool) -> Candidate:
        """`msgs`'s candidate, rendered (`text`) or counted (else) now if it was not before."""
        c = self.cands.get(len(msgs))
        if c is None or (c.messages is not msgs and c.messages != msgs):
            c = self.cands[len(msgs)] = Candidate(msgs)
        if c.text is None and (text or c.n is None):
            req = self.req if msgs is self.full else GenRequest(messages=msgs, prefix=self.req.prefix)
            c.text = self.backend.render(req)
        if not text and c.n is None:  # tokenized as the rendered raw prompt: the ids the backend would make
            ids = self.backend.prompt_ids(GenRequest(messages=[], prefix=c.text))
            c.tokenized = Tokenized(c.text, tuple(ids), self.backend)
            c.n = len(c.tokenized.ids)
        return c


def counts_prompts(backend) -> bool:
    """Whether `backend` counts its prompts against a context window (an in-process model)."""
    return isinstance(backend, KnowsWindow) and isinstance(backend, Tokenizes)


def prompt_size(backend, req: GenRequest, got: Fitted | None, total: int, window: int) -> int:
    """`req`'s prompt tokens against `window`, or its UTF-8 bytes when those fit with `total` (an in-process prompt
    never has more tokens than bytes): from the fitting (`got`) when it measured this prompt, rendering or
    tokenizing only what it did not."""
    text = None
    if got is not None and got.backend is backend and got.prompt is not None:
        if got.counted or got.prompt + total <= window:
            return got.prompt
        if got.text is not None and got.messages is req.messages and got.prefix == req.prefix:
            text = got.text
    if text is None and isinstance(backend, Renders):
        text = backend.render(req)
        if got is not None and got.backend is backend and got.text is None:  # (no window to fit to when it was
            got.text, got.messages, got.prefix = text, req.messages, req.prefix  # fitted): it sends this text as is
        if len(text.encode()) + total <= window:
            return len(text.encode())
    if text is not None:  # tokenized as the rendered raw prompt: the same ids, no second chat-template pass
        return len(backend.prompt_ids(GenRequest(messages=[], prefix=text)))
    return len(backend.prompt_ids(req))


def keep_count(seen: list[Fitted], fit: Fitted, sent: GenRequest, tokens: int | None) -> None:
    """The prompt tokens a model reported for `sent` (its rendered prompt `fit.text`, as `Fitted.wire` sent it),
    kept on every fitting of that prompt in `seen` (the request's `Turn.seen`), so `recount` needs no tokenizer."""
    if fit.text is None or sent.prefix is not fit.text:
        return
    for f in seen:
        if f.text is fit.text:
            f.tokens = tokens


def recount(turn: Turn, backend, want: GenRequest) -> int | None:
    """The tokens of `want`'s prompt for `backend` from what `turn` measured (a count made to fit it, or the model's
    own usage when it ran), else counted once from its rendered text and kept on every fitting of it; None when the
    turn never rendered that prompt."""
    same = [f for f in turn.seen if f.same_prompt(backend, want)]
    for f in same:
        if f.tokens is not None or f.counted:  # (a count made to fit it to the window is of this text too)
            return f.tokens if f.tokens is not None else f.prompt
    if same:
        with contextlib.suppress(Exception):
            n = len(backend.prompt_ids(GenRequest(messages=[], prefix=same[0].text)))  # the same tokens
            for f in same:
                f.tokens = n
            return n
    return None
