"""Training-time LLM calls against a real model server on 127.0.0.1: the batch call policy (retries for 5xx/429, none
for other 4xx, failures returned not raised), the call journal (appended as results arrive, resumed after a kill),
Cost_base and Stage 3 rewards with failing calls. Faults come from a TEST DOUBLE wrapping the real server."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_model, tiny_model_dir

from pyrodash.backends import load_backend
from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.retry import FailurePolicy
from pyrodash.cost import Prices
from pyrodash.prompts import get_prompts
from pyrodash.server.model_server import build_model_app, serve_in_thread
from pyrodash.train.models import FrozenLLM

PROMPTS = get_prompts("world-v1")
PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)


class Faults:
    """TEST DOUBLE: an ASGI wrapper failing generation requests with `status` while `fail(n_seen)` is true (an
    OpenAI-style error body), passing everything else to the real model server; counts generation requests."""

    def __init__(self, inner, status: int = 500, fail=lambda n: False):
        self.inner, self.status, self.fail, self.seen = inner, status, fail, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("completions"):
            self.seen += 1
            if self.fail(self.seen):
                body = json.dumps(
                    {"error": {"message": "injected", "type": "x", "param": None, "code": self.status}}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": self.status,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.inner(scope, receive, send)


@pytest.fixture(scope="module")
def llm_model(tmp_path_factory):
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=1, offload=False), name="llm")


def _reqs(n: int) -> list[GenRequest]:
    return [GenRequest(messages=PROMPTS.plain_messages(f"Start {i}: +1, f."), max_tokens=6) for i in range(n)]


def test_retries_5xx_not_4xx_and_failures_are_values(llm_model):
    fast = FailurePolicy(retries=2, backoff_s=0.0)
    flaky = Faults(build_model_app(llm_model, "llm"), 500, fail=lambda n: n % 2 == 1)  # every other call fails
    with serve_in_thread(flaky) as url:
        llm = FrozenLLM(load_backend(url + "#llm"), concurrency=1, policy=fast)
        gens = llm.generate(_reqs(3))
    ref = [llm_model.generate(r).text for r in _reqs(3)]
    assert [g.text for g in gens] == ref and llm.failures == 0 and flaky.seen == 6
    bad = Faults(build_model_app(llm_model, "llm"), 400, fail=lambda n: True)
    with serve_in_thread(bad) as url:
        llm = FrozenLLM(load_backend(url + "#llm"), concurrency=2, policy=fast)
        gens = llm.generate(_reqs(2))
    assert bad.seen == 2, "a 400 must not be retried"
    assert all(g.finish_reason == "error" and "HTTP 400" in g.error for g in gens) and llm.failures == 2


def test_call_journal_resumes_after_a_kill(llm_model, tmp_path):
    journal = tmp_path / "calls.jsonl"
    server = Faults(build_model_app(llm_model, "llm"))
    with serve_in_thread(server) as url:
        llm = FrozenLLM(load_backend(url + "#llm"), concurrency=4, key="tiny")
        first = llm.generate(_reqs(3), cache=journal)
        assert len(journal.read_text().splitlines()) == 3  # appended as they arrived
        with journal.open("a") as f:
            f.write('{"key": "torn')  # the run was killed mid-write
        seen = server.seen
        llm2 = FrozenLLM(load_backend(url + "#llm"), concurrency=4, key="tiny")
        again = llm2.generate(_reqs(5), cache=journal)
    assert server.seen - seen == 2 and llm2.reused == 3 and llm2.calls == 2
    assert [g.text for g in again[:3]] == [g.text for g in first]


def test_cost_base_and_rewards_with_failing_llm_calls(llm_model, tmp_path):
    from pyrodash.train.reward import BaselineCache, CollaborativeReward
    from pyrodash.train.stage3 import collaboration_engine

    qs, golds = [f"Start {i}: +1, f." for i in range(4)], ["1", "2", "3", "4"]
    state = {"fail": True}
    server = Faults(build_model_app(llm_model, "llm"), 503, fail=lambda n: state["fail"] and n % 2 == 0)
    with serve_in_thread(server) as url:
        llm = FrozenLLM(
            load_backend(url + "#llm"), concurrency=1, policy=FailurePolicy(retries=0, backoff_s=0), key="tiny"
        )
        cache = BaselineCache(tmp_path / "cost_base.json", "tiny", PROMPTS, PRICES, max_tokens=6)
        with pytest.raises(ValueError, match="2 of 4 .* failed .* run the same command again to resume"):
            cache.fill(llm, qs, golds)
        state["fail"] = False
        seen = server.seen
        assert cache.fill(llm, qs, golds) == 4 and server.seen - seen == 2  # the 2 journaled calls are reused
        state["fail"] = True
        slm, slm_tok = tiny_model(seed=2)  # the policy being trained: its <offload> id ends a rollout
        engine = collaboration_engine(HFBackend(slm, slm_tok), llm, PROMPTS, PRICES, 6, 6)
        off = engine.offload_id
        reward = CollaborativeReward(engine, cache, lam=0.1)
        rewards = reward(
            prompts=[None] * 4,
            completions=["1", "2", "3", "4"],
            completion_ids=[[5, off]] * 4,
            question=[qs[0]] * 4,
            gold=[golds[0]] * 4,
        )
    failed = [d["llm_failed"] for d in reward.last]
    assert sum(failed) == 2 and reward.totals["llm_failures"] == 2 and len(rewards) == 4
    ok = [r for r, f in zip(rewards, failed) if not f]
    assert all(r == pytest.approx(sum(ok) / len(ok)) for r, f in zip(rewards, failed) if f)
    assert reward.pop_stats()["pyrodash/llm_failures"] == 2


def test_stage3_lambda_has_one_route_and_one_default(tmp_path):
    """λ reaches Stage 3 one way: `Recipe.stage3_lambda` (a --lambda, else the recipe's, else Stage3Config's own
    default) names the run's directory and goes into its config, whose `lam` the reward reads; the config checks it."""
    import dataclasses

    import yaml

    from pyrodash.train.config import Stage3Config, load_recipe

    recipe = load_recipe("configs/world/quick.yaml")
    assert recipe.stage3_lambda() == recipe.stage3["lam"] and recipe.stage3_lambda(0.6) == 0.6
    cfg = recipe.stage_config("stage3", tmp_path, validate_only=True, lam=recipe.stage3_lambda(2))
    assert cfg.lam == 2.0
    raw = yaml.safe_load(open("configs/world/quick.yaml"))
    del raw["stage3"]["lam"]
    path = tmp_path / "nolam.yaml"
    path.write_text(yaml.safe_dump(raw))
    default = next(f.default for f in dataclasses.fields(Stage3Config) if f.name == "lam")
    assert load_recipe(path).stage3_lambda() == default
    with pytest.raises(ValueError, match="stage3.lam=-1.0 must be >= 0"):
        recipe.stage_config("stage3", tmp_path, validate_only=True, lam=recipe.stage3_lambda(-1))
