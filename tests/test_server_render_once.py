"""Issue 28.1: each prompt is rendered (chat template) at most once per request, and tokenized at most once unless
the conversation had to be trimmed to fit.

Drift bug: with in-process models the server rendered the SLM's chat template three times per request (the context
check's request, the check's own `render`, the engine's fitting of the same request) and once more in the backend,
and the LLM's check prompt twice. Now the server builds the request's Turn once (`engine.turn`), reads the prompt's
size from what the engine's fitting measured (`Fitted`), and hands the Turn to `engine.stream(turn=)`; the backend
gets the rendered prompt (`Fitted.wire`).

Both models run in process (HFBackend), so each side's renders and tokenizations are counted where they happen.
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager

import httpx
import pytest
from test_server import AUTH, UvicornThread, make_engine, serve_config, tiny_llm, tiny_slm

from pyrodash import conversation as conv
from pyrodash.server.app import build_app

Q = [{"role": "user", "content": "3+4="}]
CHAT = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"},
        {"role": "user", "content": "3+4="}]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)


class Counts:
    """Per model: chat-template renders keyed by the prompt (messages, assistant prefix), tokenizer calls keyed by
    text. Wraps each backend's `render` (which `prompt_ids` calls too) and its tokenizer's `encode`."""

    def __init__(self, backends: dict):
        self.renders = {name: Counter() for name in backends}
        self.encodes = {name: Counter() for name in backends}
        self.backends = backends

    @contextmanager
    def counting(self):
        for name, b in self.backends.items():
            render, encode = b.render, b.tokenizer.encode

            def counted_render(req, _render=render, _seen=self.renders[name]):
                if req.messages:  # a raw prompt (no messages) goes through no chat template
                    _seen[json.dumps(req.messages, sort_keys=True), req.prefix] += 1
                return _render(req)

            def counted_encode(text, *a, _encode=encode, _seen=self.encodes[name], **kw):
                _seen[text] += 1
                return _encode(text, *a, **kw)

            b.render, b.tokenizer.encode = counted_render, counted_encode
        try:
            yield self
        finally:
            for b in self.backends.values():
                del b.render, b.tokenizer.encode

    def clear(self) -> None:
        for c in (*self.renders.values(), *self.encodes.values()):
            c.clear()

    def most(self, kind: str) -> dict[str, int]:
        return {name: max(c.values(), default=0) for name, c in getattr(self, kind).items()}


@contextmanager
def served(models, context: dict | None = None, **config):
    slm, llm = models
    cfg = serve_config(**config)
    engine = make_engine(slm, llm, cfg)
    if context is None:  # no window to fit to: the server's check alone measures the prompt
        engine.context = conv.ContextLimits()
    elif context:
        engine.context = conv.ContextLimits(**context)
    with UvicornThread(build_app(cfg, engine=engine)) as srv:
        yield srv, engine


def chat(srv, messages, model: str, max_tokens: int | None = 8, stream: bool = False) -> dict:
    body = {"model": model, "messages": messages, "stream": stream}
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


def test_a_trimmed_conversation_renders_each_candidate_once(models):
    """A window so small that the history must go: every candidate message list is rendered once; the one kept is
    tokenized by the fitting and once more by the model (that is what measuring its exact length costs)."""
    slm, llm = models
    probe = make_engine(slm, llm, serve_config())
    t = probe.turn(CHAT, max_tokens=8, max_total_tokens=8)
    n_all = len(slm.prompt_ids(t.req))
    small = n_all + 8 - 1  # the whole conversation does not fit with 8 tokens to decode; the last question does
    counts = Counts({"slm": slm, "llm": llm})
    with served(models, {"slm": small, "llm": 100_000}) as (srv, _engine), counts.counting():
        for model in ("always-offload", "pyrodash"):
            counts.clear()
            p = chat(srv, CHAT, model, 8)
            assert p.get("trimmed", {}).get("slm", 0) >= 2, p
            assert counts.most("renders") == {"slm": 1, "llm": 1 if counts.renders["llm"] else 0}, counts.renders
            assert counts.most("encodes")["slm"] <= 2


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
