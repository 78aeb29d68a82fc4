"""The routing baselines: GlimpRouter's entropy rule and step loop on real tiny models, RouteLLM-MF's training,
calibration and request-level routing."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from tiny_models import tiny_model_dir

from pyrodash.cost import Prices
from pyrodash.data.example import Example
from pyrodash.eval.routing.glimprouter import first_token_entropy, run_glimprouter
from pyrodash.eval.routing.routellm_mf import MFRouter, calibrate_alpha, embed_texts, make_labels, train_mf
from pyrodash.prompts import get_prompts
from pyrodash.record import usage_of

GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": None}
PROMPTS = get_prompts("world-v1")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from pyrodash.backends.hf.backend import HFBackend

    d = tmp_path_factory.mktemp("models")
    return HFBackend(tiny_model_dir(d / "slm", seed=3)), HFBackend(tiny_model_dir(d / "llm", seed=4))


def env(max_tokens=24):
    from pyrodash.eval.methods import Env

    return Env(PROMPTS, Prices.from_yaml("paper"), max_tokens=max_tokens, batch_size=8)


EXS = [Example(id=str(i), benchmark="toy", question=f"Start {i}: +{3 * i}, f.", gold="0") for i in range(4)]


def test_entropy():
    assert first_token_entropy({str(i): -5.0 for i in range(20)}) == pytest.approx(math.log(20))
    assert first_token_entropy({"a": 0.0, "b": -50.0}) == pytest.approx(0.0, abs=1e-18)
    top = {"a": -0.1, "b": -2.5, "c": -4.0}
    assert first_token_entropy(top) == pytest.approx(first_token_entropy({k: v - 3 for k, v in top.items()}))
    with pytest.raises(ValueError, match="top_logprobs"):
        first_token_entropy({})


def _glimp(models, items, tau, boundary):
    from pyrodash.backends.retry import run_requests
    from pyrodash.eval.methods import _ban_offload

    slm, llm = models

    def gen(role, reqs):
        return run_requests(slm if role == "slm" else llm, reqs, 8)

    return run_glimprouter(items, tau, gen, 24, boundary=boundary, slm_logit_bias=_ban_offload(slm))


def test_glimprouter_extremes_equal_solo(models):
    """τ=∞: the SLM writes every step, so the answer and its bill equal SLM-only decoding; τ=0: the LLM writes
    every step (one call per step, each billed with its growing prompt) and the answer equals LLM-only decoding."""
    from pyrodash.eval.methods import Solo

    slm, llm = models
    items = [(ex, GREEDY) for ex in EXS]
    s_solo, l_solo = Solo("slm", slm, "slm", env())(items), Solo("llm", llm, "llm", env())(items)
    text = "".join(r["output"] for r in s_solo + l_solo)
    boundary = Counter(text).most_common(1)[0][0]  # a step boundary these random models actually write
    msgs = [(PROMPTS.plain_messages(ex.question), GREEDY) for ex in EXS]
    alone = _glimp(models, msgs, float("inf"), boundary)
    for r, s in zip(alone, s_solo):
        assert r["output"] == s["output"] and r["llm_calls"] == 0
        assert usage_of(r) == usage_of(s)
    assert any(len(r["entropies"]) > 1 for r in alone), "the test needs multi-step answers"
    lead = _glimp(models, msgs, 0.0, boundary)
    for r, lsolo in zip(lead, l_solo):
        assert r["output"] == lsolo["output"]
        steps = len(r["entropies"])
        u = usage_of(r)
        assert u.llm_calls == steps and u.slm_out == steps and u.llm_out == usage_of(lsolo).llm_out
        base = usage_of(lsolo).llm_in
        assert u.llm_in >= steps * base  # every call pays the question again, plus what was written so far
        assert r["segments"] == [{"by": "llm", "text": r["output"]}] and r["handoff"] == 0


def test_glimprouter_mixed(models):
    msgs = [(PROMPTS.plain_messages(ex.question), GREEDY) for ex in EXS]
    probe = _glimp(models, msgs, float("inf"), " ")
    ents = sorted(h for r in probe for h in r["entropies"])
    tau = ents[len(ents) // 2]
    mixed = _glimp(models, msgs, tau, " ")
    models_used = {s["by"] for r in mixed for s in r["segments"]}
    assert models_used == {"slm", "llm"}
    for r in mixed:
        assert r["output"] == "".join(s["text"] for s in r["segments"])
        assert r["llm_calls"] == sum(h >= tau for h in r["entropies"])


def test_mf_learns_and_calibrates(tmp_path):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(200, 8, generator=g) * 3 + 1
    labels = [int(x[0] + 0.5 * x[1] > 1.5) for x in emb.tolist()]
    router = train_mf(emb, labels, dim=4, epochs=400)
    assert router.meta["train_acc"] >= 0.9
    wins = router.win_rate(emb)
    assert sum(w >= 0.5 for w, y in zip(wins, labels) if y) > 0.85 * sum(labels)
    for share in (0.1, 0.5, 0.9):
        a = calibrate_alpha(wins, share)
        assert sum(w >= a for w in wins) == round(share * len(wins))
    assert sum(w >= calibrate_alpha(wins, 0.0) for w in wins) == 0
    router.save(tmp_path / "r")
    assert MFRouter.load(tmp_path / "r").win_rate(emb) == pytest.approx(wins)
    with pytest.raises(ValueError, match="both"):
        train_mf(emb[:5], [1] * 5)


def test_labels():
    s = [True, True, False, False]
    g = [True, False, True, False]
    assert make_labels(s, g) == ([1, 2], [0, 1])
    assert make_labels(s, g, ties="prefer_slm") == ([0, 1, 2], [0, 0, 1])
    with pytest.raises(ValueError, match="ties"):
        make_labels(s, g, ties="coin")


def test_embeddings_ignore_padding(models):
    slm, _ = models
    one = embed_texts(slm.model, slm.tokenizer, ["ab"])
    two = embed_texts(slm.model, slm.tokenizer, ["ab", "a much longer text"])
    assert two.shape == (2, slm.model.config.hidden_size)
    assert torch.allclose(one[0], two[0], atol=1e-5)


def test_routellm_routes_whole_queries(models):
    from pyrodash.eval.methods import RouteLLM, Solo

    slm, llm = models
    e = env()
    s, l_ = Solo("slm", slm, "slm", e), Solo("llm", llm, "llm", e)
    emb = torch.randn(40, slm.model.config.hidden_size)
    router = train_mf(emb, [i % 2 for i in range(40)], epochs=5)

    def embed(qs):
        return embed_texts(slm.model, slm.tokenizer, qs)

    items = [(ex, GREEDY) for ex in EXS]
    wins = router.win_rate(embed([ex.question for ex in EXS]))
    alpha = sorted(wins)[len(wins) // 2]
    out = RouteLLM("routellm@x", router, alpha, embed, s, l_)(items)
    fresh = env()  # answers generated anew, not taken from the memo the router's models filled
    solo = {"slm": Solo("slm", slm, "slm", fresh)(items), "llm": Solo("llm", llm, "llm", fresh)(items)}
    for i, (r, w) in enumerate(zip(out, wins)):
        route = "llm" if w >= alpha else "slm"
        assert r["route"] == route and r["output"] == solo[route][i]["output"]
        assert usage_of(r) == usage_of(solo[route][i]) and r["llm_calls"] == (route == "llm")
    assert {r["route"] for r in out} == {"slm", "llm"}
    # the SLM-only method run after the router reuses the answers the router's SLM share already produced
    again = s(items)
    assert [r.get("reused_answer", False) for r in again] == [w < alpha for w in wins]
    assert [r["output"] for r in again] == [r["output"] for r in solo["slm"]]


def test_glimprouter_tau_calibrated_to_step_shares(models, tmp_path):
    from types import SimpleNamespace

    from pyrodash.eval.build import Backends, build_methods

    slm, llm = models
    be = Backends()
    be._cache = {repr("s"): slm, repr("l"): llm}
    cfg = SimpleNamespace(
        models={"slm": "s", "llm": "l"},
        run_dir=str(tmp_path),
        methods=[{"glimprouter": {"taus": [0.9], "train": "pool", "step_shares": [0.5]}}],
    )
    ms = build_methods(cfg, env(), be, load_examples=lambda name, limit: EXS)
    taus = sorted(m.tau for m in ms.values())
    assert len(ms) == 2 and 0.9 in taus
    tau = next(t for t in taus if t != 0.9)
    probe = _glimp(models, [(PROMPTS.plain_messages(ex.question), GREEDY) for ex in EXS], float("inf"), "\n\n")
    ents = [h for r in probe for h in r["entropies"]]
    assert sum(h >= tau for h in ents) == round(0.5 * len(ents))
    assert (tmp_path / "glimprouter" / "taus.json").exists()


def test_routellm_needs_decided_pairs(models, tmp_path):
    from types import SimpleNamespace

    from pyrodash.eval.build import Backends, build_methods

    slm, llm = models
    be = Backends()
    be._cache = {repr("s"): slm, repr("l"): llm}
    cfg = SimpleNamespace(
        models={"slm": "s", "llm": "l"},
        run_dir=str(tmp_path),
        methods=[{"routellm": {"train": "pool", "shares": [0.5]}}],
    )
    with pytest.raises(ValueError, match="both LLM wins and SLM wins"):  # random models: every pair is a tie
        build_methods(cfg, env(), be, load_examples=lambda name, limit: EXS)
