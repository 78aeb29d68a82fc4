"""Conversations through the Collaborate Engine: one request per user turn, plain history, per-model trimming.

The end-to-end test runs a 3-turn chat through `pyrodash serve`'s app (uvicorn on 127.0.0.1) with the official
`openai` SDK over real tiny transformers: the SLM in process, the LLM behind `pyrodash serve-model`'s app. Both
backends are wrapped in `RecordingBackend`, a pass-through that keeps every request it forwards to the real
backend, so the test can assert exactly what history each model received.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from test_server import KEY, UvicornThread, llm_server, make_engine, remote, serve_config, tiny_llm, tiny_slm
from tiny_models import HANDOFF_SLM_SEED

from pyrodash.backends.base import GenRequest
from pyrodash.engine.conversation import ContextLimits, clean_history, earlier_turns, fit_context
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.server.app import build_app

PROMPTS = get_prompts("world-v1")


class RecordingBackend:
    """Pass-through wrapper around a real backend that records every GenRequest it forwards (a copy)."""

    def __init__(self, inner):
        self.inner, self.name, self.requests = inner, inner.name, []

    def stream(self, req: GenRequest):
        self.requests.append(GenRequest(**{**req.__dict__, "messages": [dict(m) for m in req.messages]}))
        return self.inner.stream(req)

    def __getattr__(self, name):  # token_id, prompt_ids, model, aclose, ...
        return getattr(self.inner, name)


# ---------------------------------------------------------------- the trimming rule (pure functions)


def _chat(n_turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "S"}]
    for i in range(n_turns):
        msgs += [{"role": "user", "content": f"q{i}" * 5}, {"role": "assistant", "content": f"a{i}" * 5}]
    return msgs + [{"role": "user", "content": "now"}]


def test_offload_is_stripped_from_history():
    msgs = [{"role": "assistant", "content": f"2+2{OFFLOAD_TOKEN}=4"}, {"role": "user", "content": "x"}]
    assert clean_history(msgs)[0]["content"] == "2+2=4" and msgs[0]["content"] == f"2+2{OFFLOAD_TOKEN}=4"


def test_fit_context_drops_oldest_turns_keeps_system_and_current():
    msgs = _chat(3)
    assert earlier_turns(msgs) == [[1, 2], [3, 4], [5, 6]]

    def count(m: list[dict]) -> int:
        return sum(len(x["content"]) for x in m)

    full = count(msgs)
    assert fit_context(msgs, count, full + 5, budget=5) == (msgs, 0)
    kept, dropped = fit_context(msgs, count, full + 4, budget=5)  # one token short: the oldest turn goes
    assert dropped == 2 and kept == [msgs[0]] + msgs[3:]
    kept, dropped = fit_context(msgs, count, count([msgs[0], msgs[-1]]) + 1, budget=1)
    assert dropped == 6 and kept == [msgs[0], msgs[-1]]
    with pytest.raises(ValueError, match="context window"):
        fit_context(msgs, count, count([msgs[0], msgs[-1]]), budget=1)
    with pytest.raises(ValueError, match="positive integer"):
        ContextLimits(slm=0)


# ---------------------------------------------------------------- 3 turns through the server


@pytest.fixture(scope="module")
def chat_stack(tmp_path_factory):
    """(server, SLM recorder, LLM recorder, engine) over real tiny models, the LLM behind its own HTTP server."""
    slm = RecordingBackend(tiny_slm(tmp_path_factory, seed=HANDOFF_SLM_SEED))
    config = serve_config()
    with llm_server(tiny_llm(tmp_path_factory)) as lsrv:
        llm = RecordingBackend(remote(lsrv.url))
        engine = make_engine(slm, llm, config)
        with UvicornThread(build_app(config, engine=engine)) as srv:
            yield srv, slm, llm, engine


def _mid_handoff_bias(engine, messages: list[dict]) -> float:
    """An offload_bias at which this random tiny SLM writes a few tokens of the turn before handing off."""
    for i in range(80):
        done = engine.run(messages, offload_bias=i * 0.1, max_tokens=16)
        if done.handoff is not None and 2 <= done.handoff <= 12:
            return i * 0.1
    raise AssertionError("no bias in [0, 8) gives a mid-turn handoff for this tiny SLM")


def test_three_turns_handoff_in_turn_two_only(chat_stack):
    srv, slm, llm, engine = chat_stack
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4="}]

    r1 = client.chat.completions.create(
        model="pyrodash", messages=history, max_tokens=16, extra_body={"offload_bias": -100.0}
    )
    p1 = r1.model_extra["pyrodash"]
    assert p1["turn"] == 1 and p1["handoff"] is None and p1["llm_calls"] == 0
    assert p1["segments"] == [{"by": "slm", "text": r1.choices[0].message.content}]
    history += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "+2?"}]

    bias = _mid_handoff_bias(engine, history)
    slm.requests.clear()
    llm.requests.clear()
    chunks = list(
        client.chat.completions.create(
            model="pyrodash",
            messages=history,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"offload_bias": bias},
        )
    )
    answer2 = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    p2 = chunks[-1].model_extra["pyrodash"]
    assert p2["turn"] == 2 and p2["handoff"] >= 2 and p2["llm_calls"] == 1 and not p2["fallback"]
    by = [s["by"] for s in p2["segments"]]
    assert by == ["slm", "llm"] and "".join(s["text"] for s in p2["segments"]) == answer2
    slm_part, llm_part = p2["segments"][0]["text"], p2["segments"][1]["text"]
    assert p2["segments"][1]["endpoint"] == llm.name and p2["llm_endpoints"][0]["endpoint"] == llm.name
    assert p2["cost_usd"] == pytest.approx(
        sum(e["cost_usd"] for e in p2["llm_endpoints"]) + (p2["slm_in"] * 1.0 + p2["slm_out"] * 2.0) / 1e6
    )

    # the SLM saw the whole history under P_s; the LLM got the history + the SLM's partial turn as its prefix
    (s2,) = slm.requests
    assert s2.messages == [{"role": "system", "content": f"{PROMPTS.offload_system}\n\nbe brief"}] + history[1:]
    (l2,) = llm.requests
    assert l2.messages == [{"role": "system", "content": f"{PROMPTS.completion_system}\n\nbe brief"}] + history[1:]
    assert l2.prefix == slm_part != "" and answer2 == slm_part + llm_part

    # a client that marks the handoff in its history: <offload> never reaches either model
    history += [
        {"role": "assistant", "content": slm_part + OFFLOAD_TOKEN + llm_part},
        {"role": "user", "content": "and *3?"},
    ]
    slm.requests.clear()
    r3 = client.chat.completions.create(
        model="pyrodash", messages=history, max_tokens=16, extra_body={"offload_bias": -100.0}
    )
    p3 = r3.model_extra["pyrodash"]
    assert p3["turn"] == 3 and p3["handoff"] is None and p3["llm_calls"] == 0 and llm.requests == [l2]
    (s3,) = slm.requests
    assert s3.messages[1:] == history[1:4] + [{"role": "assistant", "content": answer2}, history[-1]]
    assert all(
        OFFLOAD_TOKEN not in m["content"]  # (P_s itself names the token: system text is not history)
        for r in slm.requests + llm.requests
        for m in r.messages[1:]
    )
    assert p3["trimmed"] == {"slm": 0, "llm": 0}
    client.close()


def test_long_history_is_trimmed_per_model_and_counted(chat_stack, tmp_path_factory):
    _, slm, llm, _ = chat_stack
    config = serve_config()
    engine = make_engine(slm, llm, config)
    count = len(
        slm.prompt_ids(GenRequest(messages=[{"role": "system", "content": PROMPTS.offload_system}] + _chat(4)[1:]))
    )
    engine.context = ContextLimits(slm=count + 16 - 10, llm=None)  # the SLM's window misses the oldest turn
    with UvicornThread(build_app(config, engine=engine)) as srv:
        slm.requests.clear()
        msgs = _chat(4)
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"messages": msgs, "max_tokens": 16, "offload_bias": -100.0},
            timeout=60,
        )
        p = r.json()["pyrodash"]
        assert r.status_code == 200 and p["trimmed"] == {"slm": 2, "llm": 0} and p["turn"] == 5
        (s,) = slm.requests
        assert [m["content"] for m in s.messages[1:]] == [m["content"] for m in msgs[3:]]
        assert s.messages[0]["content"].endswith("\n\nS")  # the caller's system text stays
        metrics = httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        assert 'pyrodash_history_trimmed_messages_total{side="slm"} 2' in metrics
        assert 'pyrodash_history_trimmed_requests_total{side="slm"} 1' in metrics


# ---------------------------------------------------------------- pyrodash generate: --history, --turn, --llm x2


def test_generate_conversation_and_mesh_flags(tmp_path, capsys):
    import json
    import socket

    from tiny_models import tiny_model_dir

    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.cli import main
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine

    slm_dir = str(tiny_model_dir(tmp_path / "slm", seed=HANDOFF_SLM_SEED))
    llm_dir = str(tiny_model_dir(tmp_path / "llm", seed=1, offload=False))
    hist = tmp_path / "h.json"
    hist.write_text(
        json.dumps([{"role": "user", "content": "1+1="}, {"role": "assistant", "content": f"2{OFFLOAD_TOKEN}"}])
    )
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1#tiny-llm"
    s.close()  # nothing listens: the first mesh endpoint refuses the connection
    saved = tmp_path / "saved.json"
    argv = [
        "generate",
        "--slm",
        slm_dir,
        "--llm",
        dead,
        "--llm",
        llm_dir,
        "--prompts",
        "world-v1",
        "--max-tokens",
        "12",
        "--offload-bias",
        "100",
        "--history",
        str(hist),
        "--turn",
        "+2?",
        "--save-history",
        str(saved),
        "--json",
        "3+4=",
    ]
    assert main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines() if x.startswith("{")]
    assert [d["turn"] for d in lines] == [2, 3]
    ref = CollaborateEngine(HFBackend(slm_dir), HFBackend(llm_dir), PROMPTS, Prices.from_yaml("paper"), max_tokens=12)
    convo = [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3+4="},
    ]
    want = ref.run(convo, offload_bias=100.0)
    assert lines[0]["output"] == want.output and lines[0]["llm_calls"] == 1
    refused, used = lines[0]["llm_endpoints"]
    assert (refused["calls"], refused["errors"], used["calls"], used["errors"]) == (0, 1, 1, 0)
    convo += [{"role": "assistant", "content": want.output}, {"role": "user", "content": "+2?"}]
    assert lines[1]["output"] == ref.run(convo, offload_bias=100.0).output
    assert json.loads(saved.read_text())[-1] == {"role": "assistant", "content": lines[1]["output"]}
    assert len(json.loads(saved.read_text())) == 6
    hist.write_text('{"role": "user"}')
    assert main(argv) == 2 and "--history" in capsys.readouterr().err


def test_a_conversation_longer_than_the_window_is_trimmed_not_refused(chat_stack):
    """The tiny models have 2,048 positions: 6 turns of 400 characters do not fit, so the server (its context check
    counts the requests as the engine builds them) answers with the oldest turns dropped; a current message that
    alone is too long is a 400 context_length_exceeded."""
    srv = chat_stack[0]
    msgs = []
    for i in range(6):
        msgs += [{"role": "user", "content": f"{i}" * 400}, {"role": "assistant", "content": "ok"}]
    msgs.append({"role": "user", "content": "3+4="})
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=auth,
        timeout=60,
        json={"messages": msgs, "max_tokens": 16, "offload_bias": -100.0},
    )
    p = r.json()["pyrodash"]
    assert r.status_code == 200 and p["trimmed"]["slm"] >= 2 and p["turn"] == 7
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=auth,
        timeout=60,
        json={"messages": msgs[:-1] + [{"role": "user", "content": "9" * 2100}], "max_tokens": 16},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
