"""Issue 37: a chat request reaches the engine as one typed object (`EngineRequest`), immutable (it carries no engine
state), and only the engine writes its own state (`Turn`).

Before, the request crossed validation, the app and the budget as a kwargs dict with private keys (`_explicit_budget`,
`_param`), and the server wrote into the engine's state (`fit.text` in the context check, `f.tokens` in the LLM-only
estimate); later the frozen request carried the mutable Turn the context check had prepared. Both models run in
process (tiny HF models), so the context check, the engine's fitting and the LLM-only count all run.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import sys
from pathlib import Path

import httpx
import pytest
from test_server import AUTH, serve_config

from pyrodash.engine import CollaborateEngine, EngineRequest, FailurePolicy, Turn
from pyrodash.engine.conversation import ContextLimits
from pyrodash.prompts import get_prompts
from pyrodash.server.app import build_app

ROOT = Path(__file__).resolve().parent.parent
CHAT = [
    {"role": "user", "content": "1+1="},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "3+4="},
]


class Recording(CollaborateEngine):
    """TEST DOUBLE: the real engine, recording what each `stream` call was handed."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.got: list[tuple[object, dict]] = []

    def stream(self, question, **options):
        self.got.append((question, options))
        return super().stream(question, **options)


def served(models, prompts=None, windows: bool = True):
    """(app, engine) over the tiny models. `prompts`: another prompt set; `windows=False`: no context window to fit
    to (the server's check alone measures the prompts)."""
    config = serve_config()
    engine = Recording(
        *models,
        prompts or get_prompts(config.prompts),
        config.load_prices(),
        max_tokens=config.limits.default_max_tokens,
        failure=FailurePolicy(retries=0, backoff_s=0.0, timeout_s=10.0),
    )
    if not windows:
        engine.context = ContextLimits()
    return build_app(config, engine=engine), engine


@pytest.fixture(scope="module")
def app_and_engine(models):
    return served(models)


def post(app, body: dict, route: str = "/v1/chat/completions") -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.post(route, json=body, headers=AUTH)

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    return r


def test_a_chat_request_reaches_the_engine_as_one_typed_object(app_and_engine):
    app, engine = app_and_engine
    engine.got.clear()
    body = {"model": "always-offload", "messages": CHAT, "max_tokens": 12, "temperature": 0.5, "seed": 3}
    post(app, {**body, "stop": ["\n\n"], "max_tokens_per_model": 9})
    [(call, options)] = engine.got
    assert options == {} and isinstance(call, EngineRequest)  # no kwargs dict beside it, no private keys
    assert (call.mode, call.max_total_tokens, call.max_tokens, call.explicit_budget) == ("collab", 12, 9, True)
    assert (call.temperature, call.seed, call.stop, call.offload_bias) == (0.5, 3, ["\n\n"], 100.0)
    assert [m.content for m in call.question] == [m["content"] for m in CHAT]  # typed messages (`chat.Message`)
    # nothing the engine built for the context check travels in it: every field is the request's own
    assert not any(isinstance(getattr(call, f.name), Turn) for f in dataclasses.fields(call))
    assert {f.name for f in dataclasses.fields(EngineRequest)}.isdisjoint({"prepared", "turn", "fit"})

    engine.got.clear()
    post(app, {"model": "pyrodash", "messages": CHAT, "pyrodash": {"mode": "slm"}, "stream": True})
    [(call, options)] = engine.got
    assert options == {} and isinstance(call, EngineRequest)
    assert (call.mode, call.explicit_budget) == ("slm", False)  # default budget, may shrink
    assert call.max_total_tokens == app.state.config.limits.default_max_tokens


class Writes:
    """Every attribute write on an engine state object (Turn) after its construction, with the module of the code
    that made it."""

    TYPES = (Turn,)

    def __init__(self):
        self.by: list[tuple[str, str, str]] = []

    def __enter__(self):
        log = self.by

        def setattr_logged(obj, name, value):
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            log.append((type(obj).__name__, name, caller))
            object.__setattr__(obj, name, value)

        for t in self.TYPES:
            t.__setattr__ = setattr_logged
        return self

    def __exit__(self, *exc):
        for t in self.TYPES:
            del t.__setattr__

    def outside_engine(self) -> set[tuple[str, str, str]]:
        return {w for w in self.by if not w[2].startswith("pyrodash.engine.")}


@pytest.mark.parametrize("case", ["windows", "no LLM system prompt", "no windows"])
def test_no_module_outside_the_engine_writes_the_engines_state(models, case):
    """Sound for what it runs: every attribute write on a Turn (the dataclass's own `__init__` included: its code
    lives in the engine's modules) is logged with its caller's module while the server answers requests that take
    every path of the context check, the fitting and the LLM-only count (collab with and without handoff, each model
    alone, unary and stream, a conversation, an implicit budget; an LLM prompt that is the LLM-only request; no window
    to fit to); none may come from outside `pyrodash.engine`. The static half: no module outside `pyrodash/engine/`
    names the engine's state types (so none builds one or reads it by type)."""
    prompts = get_prompts(serve_config().prompts)
    if case == "no LLM system prompt":  # the LLM's check prompt is the LLM-only request: its count is reused
        prompts = dataclasses.replace(prompts, completion_system="")
    app, _engine = served(models, prompts, windows=case != "no windows")
    with Writes() as writes:
        for model, extra in [
            ("always-offload", {"max_tokens": 8}),
            ("slm-only", {}),
            ("pyrodash", {"pyrodash": {"mode": "slm"}}),
            ("pyrodash", {"pyrodash": {"mode": "llm"}, "max_tokens": 6}),
            ("always-offload", {"stream": True, "stream_options": {"include_usage": True}}),
        ]:
            post(app, {"model": model, "messages": CHAT, **extra})
        Turn.__new__(Turn).finish = "stop"  # the log catches a write from outside the engine (this test module)
    assert writes.by and writes.outside_engine() == {("Turn", "finish", __name__)}

    named = {}
    for path in sorted((ROOT / "pyrodash").rglob("*.py")):
        if "engine" in path.relative_to(ROOT / "pyrodash").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyrodash.engine"):
                hits = {a.name for a in node.names} & {"Turn", "PromptSize"}
                if hits:
                    named[str(path.relative_to(ROOT))] = sorted(hits)
    assert named == {}
