"""The `budgets` section of a serve config: what it accepts, and one line naming the fix for each mistake."""

from __future__ import annotations

import json

import pytest
import yaml

from pyrodash.server.budget.config import BudgetsConfig
from pyrodash.server.config import ServeConfig

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_a_full_section_parses(monkeypatch, tmp_path):
    monkeypatch.setenv("TEAM_A_KEY", "a-secret")
    curve = tmp_path / "curve.json"
    curve.write_text(
        json.dumps({"trace": [{"bias": -20, "rate": 0, "cost_usd": 1e-5}, {"bias": 0, "rate": 0.8, "cost_usd": 3e-4}]})
    )
    cfg = BudgetsConfig.parse(
        {
            "default": {"usd_per_hour": 2.0, "dollars": "all", "cap_usd": 3.0, "at_cap": "refuse"},
            "keys": {"team-a": {"key_env": "TEAM_A_KEY", "usd_per_day": 24}},
            "redis_url": "redis://127.0.0.1:6379/0",
            "curve": str(curve),
            "knob": "offload_bias",
            "time_compression": 60,
            "controller": {"integral_s": 600, "cost_window": 20},
        }
    )
    assert [b.name for b in cfg.budgets] == ["default", "team-a"]
    assert cfg.default.usd_per_hour == 2.0 and cfg.default.period_s == 3600 and cfg.default.at_cap == "refuse"
    team = cfg.keys[0]
    assert team.period == "day" and team.usd_per_hour == pytest.approx(1.0) and team.dollars == "llm"
    assert "a-secret" not in repr(cfg) and b"a-secret" not in (team.key_digest or b"")
    assert cfg.curve is not None and cfg.controller.cost_window == 20


def test_the_shipped_example_config_loads(monkeypatch):
    monkeypatch.setenv("TEAM_A_KEY", "k1")
    monkeypatch.setenv("TEAM_B_KEY", "k2")
    raw = yaml.safe_load((ROOT / "configs" / "serve" / "budget.yaml").read_text())
    cfg = ServeConfig(**{k: v for k, v in raw.items() if k not in ("slm", "llm")})
    assert cfg.budgets is not None and cfg.budgets.default.usd_per_hour > 0


def test_no_budgets_section_is_none():
    assert ServeConfig(prompts="world-v1").budgets is None


BAD = [
    ({"default": {"usd_per_hour": 2, "usd_per_day": 40}}, "give usd_per_hour or usd_per_day, not both"),
    ({"default": {"dollars": "llm"}}, "no target rate: set usd_per_hour"),
    ({"default": {"usd_per_hour": -1}}, "budgets.default.usd_per_hour=-1 must be a positive number"),
    ({"default": {"usd_per_hour": "2"}}, "must be a positive number"),
    ({"default": {"usd_per_hr": 2}}, "unknown key 'usd_per_hr'; use usd_per_hour or usd_per_day"),
    ({"usd_per_hour": 2}, "a budget's settings go under budgets.default"),
    ({"default": {"usd_per_hour": 2, "dollars": "tokens"}}, "use llm (LLM dollars only) or all"),
    ({"default": {"usd_per_hour": 2, "cap_usd": 1}}, "is below the target for one hour (2): raise cap_usd"),
    ({"default": {"usd_per_hour": 2, "at_cap": "slm"}}, "at_cap needs cap_usd"),
    ({"default": {"usd_per_hour": 2, "cap_usd": 3, "at_cap": "block"}}, "use slm (the SLM alone until the hour ends)"),
    ({"default": {"usd_per_hour": 2, "key_env": "K"}}, "the default budget has no key; put keyed budgets under"),
    ({"keys": {"a": {"usd_per_hour": 1}}}, "set key_env to the environment variable"),
    (
        {"keys": {"a": {"usd_per_hour": 1, "key_env": "PYRODASH_TEST_UNSET_KEY"}}},
        "the environment variable PYRODASH_TEST_UNSET_KEY is not set: export it",
    ),
    ({"keys": {"bad name": {"usd_per_hour": 1, "key_env": "K1"}}}, "a budget name is 1-64 letters"),
    (
        {"keys": {"a": {"usd_per_hour": 1, "key_env": "K1"}, "b": {"usd_per_hour": 1, "key_env": "K1"}}},
        "two budgets share one API key",
    ),
    ({}, "no budget: add default"),
    ("2.0", "budgets must be a mapping"),
    ({"default": {"usd_per_hour": 2}, "redis_url": "localhost:6379"}, "use redis://host:port/db"),
    ({"default": {"usd_per_hour": 2}, "knob": "temperature"}, "use handoff_share"),
    ({"default": {"usd_per_hour": 2}, "knob": "offload_bias"}, "needs a curve: run `pyrodash calibrate"),
    ({"default": {"usd_per_hour": 2}, "curve": "/nonexistent/curve.json"}, "no such file: run `pyrodash calibrate"),
    ({"default": {"usd_per_hour": 2}, "replicas": 0}, "must be a positive integer"),
    ({"default": {"usd_per_hour": 2}, "time_compression": 0}, "budgets.time_compression=0 must be a positive"),
    ({"default": {"usd_per_hour": 2}, "controller": {"tau": 3}}, "budgets.controller: expected a mapping"),
]


@pytest.mark.parametrize("raw,fix", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_configs_get_one_line_errors_naming_the_fix(raw, fix, monkeypatch):
    monkeypatch.setenv("K1", "same-key")
    monkeypatch.delenv("PYRODASH_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError) as e:
        BudgetsConfig.parse(raw)
    msg = str(e.value)
    assert fix in msg and "\n" not in msg, msg


def test_a_budget_key_must_differ_from_the_server_key(monkeypatch):
    monkeypatch.setenv("K1", "server-key")
    with pytest.raises(ValueError, match="a budget's key is the server's api_key"):
        ServeConfig(
            prompts="world-v1", api_key="server-key", budgets={"keys": {"a": {"usd_per_hour": 1, "key_env": "K1"}}}
        )


def test_bad_curve_files(tmp_path):
    for text, fix in (
        ("not json", "is not JSON"),
        (json.dumps({"trace": [{"x": 1}]}), "expected `pyrodash calibrate"),
        (json.dumps({"trace": [{"bias": 0, "rate": 0.5, "cost_usd": None}]}), "--target-rate mode"),
    ):
        p = tmp_path / "c.json"
        p.write_text(text)
        with pytest.raises(ValueError, match="budgets.curve=") as e:
            BudgetsConfig.parse({"default": {"usd_per_hour": 1}, "curve": str(p)})
        assert fix in str(e.value), str(e.value)


def test_the_yaml_route_and_the_serve_command_report_it(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("prompts: world-v1\nbudgets: {default: {usd_per_hour: 1, cap_usd: 0.5}}\n")
    with pytest.raises(ValueError, match="cap_usd=0.5 is below the target"):
        ServeConfig.from_yaml(cfg)


def test_the_compose_deployment_holds_one_budget_through_its_redis():
    services = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    assert "redis" in services and "redis" in services["pyrodash"]["depends_on"]
    assert "--appendonly" in services["redis"]["command"]  # a Redis restart keeps the period's spend
    assert "deploy/serve.yaml" in services["pyrodash"]["command"]
    b = ServeConfig.from_yaml(ROOT / "deploy" / "serve.yaml").budgets  # the loader of `pyrodash serve --config`
    assert b is not None and b.redis_url == "redis://redis:6379/0" and b.default.cap_usd is not None
