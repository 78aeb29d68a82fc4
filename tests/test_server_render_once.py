"""Issue 28.1: each prompt is rendered (chat template) at most once per request, and tokenized at most once, also
when the conversation had to be trimmed to a model's context window.

Drift bug: with in-process models the server rendered the SLM's chat template three times per request (the context
check's request, the check's own `render`, the engine's fitting of the same request) and once more in the backend,
and the LLM's check prompt twice. Second drift bug: a prompt that had to be counted to fit its window (trimmed, or
fitting by its tokens only) was tokenized by the fitting and again by the model, and the LLM's handoff request,
fitted once by the context check and once by the engine, was rendered twice and tokenized three times.

Now the model that renders keeps what it made (`HFBackend.prompts`, a `PromptMemo`: templates keyed by the messages
and the template, ids keyed by the prompt text), so the check, the engine's fitting, the LLM-only estimate and the
decode ask for the same prompt at the cost of a lookup: 1 chat-template pass and 1 tokenization per prompt. Each
test starts every request with the models' memos empty, so the counts are per request.

Both models run in process (HFBackend), so each side's chat-template passes and tokenizations are counted where they
happen (except in the test of the SLM answering alone beside an LLM endpoint).
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager

import httpx
import pytest
from test_server import AUTH, UvicornThread, llm_server, make_engine, remote, serve_config

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.prompt_memo import PromptMemo
from pyrodash.engine import conversation as conv
from pyrodash.server.app import build_app

Q = [{"role": "user", "content": "3+4="}]
CHAT = [
    {"role": "user", "content": "1+1="},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+3="},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "3+4="},
]


class Counts:
    """Per model: chat-template passes keyed by the messages, tokenizer calls keyed by text. Wraps each backend's
    tokenizer (`apply_chat_template`, `encode`); `clear` also empties the models' memos (a request starts cold)."""

    def __init__(self, backends: dict):
        self.renders = {name: Counter() for name in backends}
        self.encodes = {name: Counter() for name in backends}
        self.backends = backends

    @contextmanager
    def counting(self):
        self.clear()
        for name, b in self.backends.items():
            tok = b.tokenizer
            apply, encode = tok.apply_chat_template, tok.encode

            def counted_apply(messages, *a, _apply=apply, _seen=self.renders[name], **kw):
                _seen[json.dumps(messages, sort_keys=True)] += 1
                return _apply(messages, *a, **kw)

            def counted_encode(text, *a, _encode=encode, _seen=self.encodes[name], **kw):
                _seen[text] += 1
                return _encode(text, *a, **kw)

            tok.apply_chat_template, tok.encode = counted_apply, counted_encode
        try:
            yield self
        finally:
            for b in self.backends.values():
                del b.tokenizer.apply_chat_template, b.tokenizer.encode

    def clear(self) -> None:
        for c in (*self.renders.values(), *self.encodes.values()):
            c.clear()
        for b in self.backends.values():
            b.prompts.clear()

    def most(self, kind: str) -> dict[str, int]:
        return {name: max(c.values(), default=0) for name, c in getattr(self, kind).items()}


@contextmanager
def served(models, context: dict | None = None, llm=None, **config):
    slm, own_llm = models
    cfg = serve_config(**config)
    engine = make_engine(slm, own_llm if llm is None else llm, cfg)
    if context is None:  # no window to fit to: the server's check alone measures the prompt
        engine.context = conv.ContextLimits()
    elif context:
        engine.context = conv.ContextLimits(**context)
    with UvicornThread(build_app(cfg, engine=engine)) as srv:
        yield srv, engine


def chat(srv, messages, model: str, max_tokens: int | None = 8, stream: bool = False, mode: str | None = None) -> dict:
    body = {"model": model, "messages": messages, "stream": stream}
    if mode is not None:
        body["pyrodash"] = {"mode": mode}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["pyrodash"]
    last = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")][-1]
    return last.get("pyrodash") or {}


@pytest.mark.parametrize("context", ["model window", "none", "wide"])
@pytest.mark.parametrize("messages", [Q, CHAT], ids=["question", "conversation"])
def test_each_prompt_is_rendered_and_tokenized_once_per_request(models, context, messages):
    ctx = {"model window": {}, "none": None, "wide": {"slm": 100_000, "llm": 100_000}}[context]
    counts = Counts({"slm": models[0], "llm": models[1]})
    with served(models, ctx) as (srv, _engine), counts.counting():
        for model, max_tokens, stream in [
            ("always-offload", 8, False),
            ("pyrodash", 8, True),
            ("slm-only", None, False),
            ("always-offload", None, True),
        ]:
            counts.clear()
            p = chat(srv, messages, model, max_tokens, stream)
            assert counts.renders["slm"], "the SLM's prompt was rendered"
            if model == "always-offload":
                assert p["handoff"] is not None and counts.renders["llm"]
            assert not any(p.get("trimmed", {}).values())
            assert counts.most("renders") == {"slm": 1, "llm": 1 if counts.renders["llm"] else 0}, (
                model,
                {k: {p[-1]: n for p, n in v.items() if n > 1} for k, v in counts.renders.items()},
            )
            assert max(counts.most("encodes").values()) == 1, (
                model,
                {k: {t[-60:]: n for t, n in v.items() if n > 1} for k, v in counts.encodes.items()},
            )


def _windows(models) -> dict[str, dict[str, int]]:
    """Context windows for CHAT with 8 tokens to decode: "trimmed" (the whole conversation does not fit, the last
    question does), "counted" (the prompt fits by its tokens, not by its UTF-8 bytes: counted, nothing dropped)."""
    slm, llm = models
    probe = make_engine(slm, llm, serve_config())
    probe.context = conv.ContextLimits()
    n_slm = len(slm.prompt_ids(probe.turn(CHAT, max_tokens=8).req))
    n_llm = len(llm.prompt_ids(probe.llm_request(CHAT, "", 8, {})))
    return {"trimmed": {"slm": n_slm + 8 - 1, "llm": n_llm}, "counted": {"slm": n_slm + 8, "llm": n_llm + 8}}


def _fresh_count(backend, req: GenRequest) -> int:
    """`req`'s prompt tokens, rendered and tokenized from scratch (the model's memo emptied first)."""
    backend.prompts.clear()
    return len(backend.prompt_ids(req))


@pytest.mark.parametrize("fit", ["trimmed", "counted"])
@pytest.mark.parametrize("side", ["slm", "llm", "both"])
def test_a_fitted_prompt_is_rendered_and_tokenized_once(models, side, fit):
    """A window that the prompt fits only by its token count (or not at all with its history): each candidate message
    list is rendered once and tokenized once; the model runs on the ids the fitting counted (its memo has them), so
    the prompt it keeps is not tokenized a second time. Before: the kept SLM prompt tokenized 2 times; the LLM's
    handoff prompt rendered 2 times (trimmed) and tokenized 3 times."""
    slm, llm = models
    w = _windows(models)[fit]
    window = {s: w[s] if side in (s, "both") else 100_000 for s in ("slm", "llm")}
    probe = make_engine(slm, llm, serve_config())
    probe.context = conv.ContextLimits(**window)
    slm_req = probe.turn(CHAT, max_tokens=8, max_total_tokens=8).req  # the SLM's request as fitted (collab)
    slm_in = _fresh_count(slm, slm_req)
    counts = Counts({"slm": slm, "llm": llm})
    with served(models, window) as (srv, _engine), counts.counting():
        for model, stream in [
            ("always-offload", False),
            ("always-offload", True),
            ("pyrodash", False),
            ("slm-only", False),
        ]:
            counts.clear()
            p = chat(srv, CHAT, model, 8, stream)
            trimmed = p.get("trimmed", {})
            assert bool(trimmed.get("slm")) == (fit == "trimmed" and side in ("slm", "both")), (model, p)
            if p["handoff"] is not None:
                assert bool(trimmed.get("llm")) == (fit == "trimmed" and side in ("llm", "both")), (model, p)
            assert counts.most("renders") == {"slm": 1, "llm": 1 if counts.renders["llm"] else 0}, (
                model,
                counts.renders,
            )
            assert counts.most("encodes") == {"slm": 1, "llm": 1 if counts.encodes["llm"] else 0}, (
                model,
                {k: {t[-60:]: n for t, n in v.items() if n > 1} for k, v in counts.encodes.items()},
            )
            assert p["slm_in"] == slm_in, "the SLM ran on the ids of its fitted prompt"
            if model == "always-offload":
                assert p["handoff"] is not None and counts.encodes["llm"], "the LLM ran"


def test_a_batch_runs_on_the_ids_its_fitting_counted(models):
    """`abatch` (evaluation): a trimmed SLM prompt is tokenized once, by the fitting; `generate_batch` decodes from
    those ids (the model's memo), and they are the ids of the prompt it was given."""
    slm, llm = models
    engine = make_engine(slm, llm, serve_config())
    engine.context = conv.ContextLimits(slm=_fresh_count(slm, GenRequest(messages=CHAT)) + 8 - 1, llm=100_000)
    counts = Counts({"slm": slm, "llm": llm})
    with counts.counting():
        t = engine.turn(CHAT, mode="slm", max_tokens=8)
        (done,) = engine.batch([CHAT], mode="slm", options=[{"max_tokens": 8}])
    assert t.trimmed["slm"] >= 2 and done.trimmed["slm"] == t.trimmed["slm"]
    assert done.usage.slm_in == _fresh_count(slm, t.req), "the decode ran on the ids of its fitted prompt"
    assert counts.most("renders")["slm"] == 1 and counts.most("encodes")["slm"] == 1, counts.encodes


def test_the_memo_serves_only_what_decides_it(models):
    """The ids the memo serves are those of a fresh tokenization of the same text; a changed chat template or another
    assistant prefix is rendered anew, never served stale."""
    slm, _llm = models
    req = GenRequest(messages=CHAT)
    fresh = _fresh_count(slm, req)
    assert len(slm.prompt_ids(req)) == fresh and slm.prompt_ids(req) is not slm.prompt_ids(req)  # (copies)
    longer = GenRequest(messages=CHAT, prefix="4")
    assert slm.render(longer) == slm.render(req) + "4" and slm.prompt_ids(longer) != slm.prompt_ids(req)
    template = slm.tokenizer.chat_template
    try:
        slm.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
        assert slm.render(req) == "1+1=|2|2+3=|5|3+4=|"
    finally:
        slm.tokenizer.chat_template = template
    assert slm.render(req) != "1+1=|2|2+3=|5|3+4=|" and len(slm.prompt_ids(req)) == fresh


def test_the_memo_is_bounded():
    """Least recently used out first once the sizes it holds pass its bound; a value larger than the bound is
    returned, not kept."""
    memo, made = PromptMemo(max_size=10), []

    def make(v: str):
        return lambda: made.append(v) or v

    for k in "abc":
        memo.get(k, make(k * 4))
    assert len(memo) == 2 and memo.size == 8 and made == ["aaaa", "bbbb", "cccc"]
    assert memo.get("b", make("x")) == "bbbb" and made[-1] == "cccc"  # kept: not made again
    memo.get("d", make("dddd"))  # "c" was used less recently than "b"
    assert memo.get("b", make("y")) == "bbbb" and memo.get("c", make("cc")) == "cc"
    assert memo.get("e", make("e" * 11)) == "e" * 11 and "e" not in memo._items


@pytest.mark.parametrize("window", ["model window", "trimmed"])
def test_the_slm_alone_beside_an_llm_endpoint(models, window):
    """Mode "slm" with an LLM behind HTTP: the LLM-only estimate counts the conversation with the SLM's tokenizer,
    which is the SLM's own prompt in this mode. Untrimmed, the SLM's billed input is that count: 1 render and 1
    tokenization (before: 2 and 2, the server's LLM-only count rendered and tokenized it again). Trimmed, the estimate
    counts the whole conversation while the SLM ran on its tail: the whole one was rendered by the fitting already,
    and is not rendered again for the estimate (before: 2)."""
    slm, llm = models
    solo = GenRequest(messages=CHAT)  # the SLM's prompt in mode "slm", and the LLM-only request
    n_solo = _fresh_count(slm, solo)
    ctx = {} if window == "model window" else {"slm": n_solo + 8 - 1, "llm": 100_000}
    counts = Counts({"slm": slm})
    with llm_server(llm) as lsrv, served(models, ctx, llm=remote(lsrv.url)) as (srv, _e), counts.counting():
        for stream in (False, True):
            counts.clear()
            p = chat(srv, CHAT, "pyrodash", 8, stream, mode="slm")
            est = p["llm_only_estimate"]
            assert est["prompt_tokens"] == n_solo and "SLM's tokenizer" in est["method"], est
            key = json.dumps(CHAT, sort_keys=True)
            if window == "model window":
                assert not p["trimmed"]["slm"] and p["slm_in"] == n_solo
                assert counts.renders["slm"][key] == 1 and counts.most("encodes")["slm"] == 1, counts.encodes
            else:
                assert p["trimmed"]["slm"] >= 2 and p["slm_in"] < n_solo
                assert counts.renders["slm"][key] == 1, "the fitting's render, which the estimate reuses"


def test_the_context_error_is_unchanged(models):
    """A prompt too long for the window is still a 400 with the body it always had."""
    slm, llm = models
    probe = make_engine(slm, llm, serve_config())
    probe.context = conv.ContextLimits()  # (no window: the whole prompt, to count it)
    window = slm.context_window()
    long_q = [{"role": "user", "content": "1+" * window + "1="}]
    n = len(slm.prompt_ids(probe.turn(long_q).req))
    with served(models, {}) as (srv, _engine):
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", json={"model": "pyrodash", "messages": long_q}, headers=AUTH, timeout=60
        )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert err["message"] == (
        f"This model's maximum context length is {window} tokens; the prompt needs {n} tokens "
        f"even with every earlier turn dropped, but the context window is {window}: shorten "
        "the current message or the system prompt."
    )
