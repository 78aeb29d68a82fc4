"""The `budgets` section of a serve config: dollar budgets that `pyrodash serve` holds by moving the operating point.

    budgets:
      default: {usd_per_hour: 2.00, dollars: llm, cap_usd: 2.50, at_cap: slm}   # requests without a budget key
      keys: {team-a: {key_env: TEAM_A_KEY, usd_per_day: 20}}                     # optional: one budget per API key

Every mistake is a one-line ValueError that names the key and the fix. Keys are read from the environment
(`key_env`) and never stored in the config, logs or responses: budgets are named by their names. Every key of the
section, commented: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyrodash.server.budget.pacer import BIAS, SHARE, Curve

DOLLARS = ("llm", "all")
AT_CAP = ("slm", "refuse")
KNOBS = (SHARE, BIAS)
PERIODS = {"usd_per_hour": ("hour", 3600.0), "usd_per_day": ("day", 86400.0)}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BUDGET_KEYS = {"usd_per_hour", "usd_per_day", "dollars", "cap_usd", "at_cap", "key_env"}
_TOP_KEYS = {
    "default",
    "keys",
    "redis_url",
    "redis_prefix",
    "replicas",
    "curve",
    "knob",
    "time_compression",
    "period_origin",
    "controller",
    "reservation_ttl_s",
    "redis_timeout_s",
    "state_dir",
    "redis_eviction",
}
EVICTION = ("refuse", "warn")  # a Redis whose maxmemory-policy may evict the ledger: refuse it at start-up, or warn
_CONTROLLER_KEYS = {"integral_s", "rate_window_s", "bank_s", "debt_s", "cost_window", "head_start_s"}


def _number(where: str, v: object, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"{where}={v!r} must be a {'positive ' if positive else ''}number")
    return float(v)


@dataclass(frozen=True)
class Budget:
    """One budget: a target rate (dollars per period), which dollars count, an optional hard cap."""

    name: str
    usd_per_period: float
    period: str  # "hour" | "day"
    period_s: float  # in budget seconds
    dollars: str = "llm"
    cap_usd: float | None = None
    at_cap: str = "slm"
    key_digest: bytes | None = field(default=None, repr=False)  # sha256 of the key (keys budgets only)

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_period * 3600.0 / self.period_s

    @classmethod
    def parse(cls, where: str, name: str, raw: object, keyed: bool) -> Budget:
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be a mapping, e.g. {{usd_per_hour: 2.0, dollars: llm}}")
        unknown = set(raw) - _BUDGET_KEYS
        if unknown:
            raise ValueError(
                f"{where}: unknown key {sorted(unknown)[0]!r}; use usd_per_hour or usd_per_day (the "
                "target), dollars (llm|all), cap_usd, at_cap (slm|refuse)" + (", key_env" if keyed else "")
            )
        rates = [k for k in PERIODS if k in raw]
        if not rates:
            raise ValueError(f"{where}: no target rate: set usd_per_hour (e.g. 2.0) or usd_per_day")
        if len(rates) > 1:
            raise ValueError(f"{where}: give usd_per_hour or usd_per_day, not both")
        period, period_s = PERIODS[rates[0]]
        target = _number(f"{where}.{rates[0]}", raw[rates[0]])
        dollars = raw.get("dollars", "llm")
        if dollars not in DOLLARS:
            raise ValueError(f"{where}.dollars={dollars!r}: use llm (LLM dollars only) or all (SLM + LLM dollars)")
        cap = raw.get("cap_usd")
        if cap is not None:
            cap = _number(f"{where}.cap_usd", cap)
            if cap < target:
                raise ValueError(
                    f"{where}.cap_usd={cap:g} is below the target for one {period} ({target:g}): raise "
                    f"cap_usd or lower {rates[0]} (the cap is a hard limit above the target)"
                )
        at_cap = raw.get("at_cap", "slm")
        if at_cap not in AT_CAP:
            raise ValueError(
                f"{where}.at_cap={at_cap!r}: use slm (the SLM alone until the {period} ends) or refuse (429)"
            )
        if "at_cap" in raw and cap is None:
            raise ValueError(f"{where}.at_cap needs cap_usd (the hard cap per {period}): set cap_usd or remove at_cap")
        digest = None
        if keyed:
            env = raw.get("key_env")
            if not isinstance(env, str) or not env:
                raise ValueError(f"{where}: set key_env to the environment variable holding this budget's API key")
            key = os.environ.get(env)
            if not key:
                raise ValueError(
                    f"{where}: the environment variable {env} is not set: export it (the API key the "
                    "clients of this budget send as 'Authorization: Bearer <key>')"
                )
            digest = hashlib.sha256(key.encode()).digest()
        elif "key_env" in raw:
            raise ValueError(f"{where}.key_env: the default budget has no key; put keyed budgets under budgets.keys")
        return cls(name, target, period, period_s, dollars, cap, at_cap, digest)


@dataclass(frozen=True)
class Controller:
    """Pacer settings in the budget's seconds; None: the period's defaults
    (`pyrodash.server.budget.pacer.PacerSpec`)."""

    integral_s: float | None = None
    rate_window_s: float = 600.0
    bank_s: float | None = None
    debt_s: float | None = None
    cost_window: int = 50
    head_start_s: float | None = None


@dataclass(frozen=True)
class BudgetsConfig:
    default: Budget | None = None
    keys: tuple[Budget, ...] = ()
    redis_url: str | None = None
    redis_prefix: str = "pyrodash:budget:"
    replicas: int | None = None  # the share a replica falls back to without Redis is 1/replicas (else last seen)
    curve: Curve | None = None
    curve_path: str | None = None
    knob: str = SHARE
    time_compression: float = 1.0  # budget seconds per wall-clock second (benchmarks and tests: 60 = an hour a minute)
    period_origin: float = 0.0  # unix time at which periods start (0: calendar hours and UTC days)
    controller: Controller = field(default_factory=Controller)
    reservation_ttl_s: float = 600.0  # wall seconds: a dead replica's reservations are released after this long
    redis_timeout_s: float = 0.25  # a Redis call slower than this counts as Redis down (the replica's own share)
    state_dir: str | None = None  # the hard caps' ledger without Redis (None: $PYRODASH_CACHE/budgets)
    redis_eviction: str = "refuse"  # a Redis that may evict the ledger's keys (maxmemory-policy allkeys-*): or warn

    @property
    def budgets(self) -> list[Budget]:
        return ([self.default] if self.default else []) + list(self.keys)

    @classmethod
    def parse(cls, raw: object, api_key: str | None = None) -> BudgetsConfig | None:
        """The section as given in YAML (a mapping), or None when it is absent."""
        if raw is None or isinstance(raw, BudgetsConfig):
            return raw
        if not isinstance(raw, dict):
            raise ValueError("budgets must be a mapping: budgets: {default: {usd_per_hour: 2.0}}")
        unknown = set(raw) - _TOP_KEYS
        if unknown:
            bad = sorted(unknown)[0]
            hint = " (a budget's settings go under budgets.default)" if bad in _BUDGET_KEYS else ""
            raise ValueError(f"budgets: unknown key {bad!r}{hint}; expected some of {sorted(_TOP_KEYS)}")
        default = None
        if raw.get("default") is not None:
            default = Budget.parse("budgets.default", "default", raw["default"], keyed=False)
        keys = _keyed_budgets(raw.get("keys") or {}, api_key)
        if default is None and not keys:
            raise ValueError(
                "budgets: no budget: add default: {usd_per_hour: 2.0} or keys: {NAME: {key_env: VAR, "
                "usd_per_hour: 2.0}}"
            )
        redis_url, prefix, replicas = _redis_settings(raw)
        knob, curve, curve_path = _knob_and_curve(raw)
        return cls(
            default,
            tuple(keys),
            redis_url,
            prefix,
            replicas,
            curve,
            curve_path and str(curve_path),
            knob,
            _number("budgets.time_compression", raw.get("time_compression", 1.0)),
            _number("budgets.period_origin", raw.get("period_origin", 0.0), positive=False),
            _controller(raw.get("controller") or {}),
            _number("budgets.reservation_ttl_s", raw.get("reservation_ttl_s", 600.0)),
            _number("budgets.redis_timeout_s", raw.get("redis_timeout_s", 0.25)),
            _state_dir(raw.get("state_dir")),
            _eviction(raw.get("redis_eviction", "refuse")),
        )


def _keyed_budgets(keys_raw: object, api_key: str | None) -> list[Budget]:
    """`budgets.keys`: one budget per API key, each key its own and none the server's `api_key`."""
    if not isinstance(keys_raw, dict):
        raise ValueError(
            "budgets.keys must map budget names to budgets: {team-a: {key_env: TEAM_A_KEY, usd_per_day: 20}}"
        )
    keys = []
    for name, spec in keys_raw.items():
        name = str(name)
        if not _NAME.fullmatch(name) or name == "default":
            raise ValueError(
                f"budgets.keys.{name}: a budget name is 1-64 letters, digits, '.', '_' or '-' (not "
                "'default'); it names the budget in responses, metrics and logs"
            )
        keys.append(Budget.parse(f"budgets.keys.{name}", name, spec, keyed=True))
    digests = [b.key_digest for b in keys]
    if len(set(digests)) < len(digests):
        raise ValueError("budgets.keys: two budgets share one API key: give each budget its own key")
    if api_key and hashlib.sha256(api_key.encode()).digest() in digests:
        raise ValueError(
            "budgets.keys: a budget's key is the server's api_key: give the budget a key of its own "
            "(requests with the server's key draw on budgets.default)"
        )
    return keys


def _redis_settings(raw: dict) -> tuple[str | None, str, int | None]:
    """(redis_url, redis_prefix, replicas): where replicas share the budget, and how many share it."""
    redis_url = raw.get("redis_url")
    if redis_url is not None:
        _check_redis_url(redis_url)
    prefix = raw.get("redis_prefix", "pyrodash:budget:")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError("budgets.redis_prefix must be a non-empty string (the Redis key prefix)")
    replicas = raw.get("replicas")
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
        raise ValueError(
            f"budgets.replicas={replicas!r} must be a positive integer (how many replicas share the "
            "budget when Redis is unreachable)"
        )
    return redis_url, prefix, replicas


def _knob_and_curve(raw: dict) -> tuple[str, Curve | None, object]:
    """(knob, curve, the curve's path): what the pacer moves, and the calibration curve offload_bias needs."""
    knob = raw.get("knob", SHARE)
    if knob not in KNOBS:
        raise ValueError(
            f"budgets.knob={knob!r}: use handoff_share (the share of requests that may hand off) or "
            "offload_bias (along the calibration curve)"
        )
    curve, curve_path = None, raw.get("curve")
    if curve_path is not None:
        curve = load_curve(curve_path)
    if knob == BIAS and curve is None:
        raise ValueError(
            "budgets.knob=offload_bias needs a curve: run `pyrodash calibrate ... --budget-usd X "
            "--json > curve.json` on a traffic sample and set budgets.curve: curve.json"
        )
    return knob, curve, curve_path


def _controller(ctl: object) -> Controller:
    """`budgets.controller`: the pacer's settings in the budget's seconds."""
    if not isinstance(ctl, dict) or set(ctl) - _CONTROLLER_KEYS:
        raise ValueError(f"budgets.controller: expected a mapping with some of {sorted(_CONTROLLER_KEYS)}")
    vals = {k: _number(f"budgets.controller.{k}", v, positive=k != "head_start_s") for k, v in ctl.items()}
    if vals.get("head_start_s", 0.0) < 0:
        raise ValueError("budgets.controller.head_start_s must be >= 0 (0: no head start)")
    if "cost_window" in vals:
        if vals["cost_window"] != int(vals["cost_window"]):
            raise ValueError("budgets.controller.cost_window must be a whole number of requests")
        vals["cost_window"] = int(vals["cost_window"])
    return Controller(**vals)


def _eviction(value: object) -> str:
    if value not in EVICTION:
        raise ValueError(
            f"budgets.redis_eviction={value!r}: use refuse (a Redis whose maxmemory-policy may evict the ledger stops "
            "the server at start-up) or warn (it serves, and says so)"
        )
    return str(value)


def _state_dir(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"budgets.state_dir={value!r} must be a directory path (the hard caps' ledger file)")
    return value


def _check_redis_url(url: object) -> None:
    if not isinstance(url, str) or not re.match(r"(redis|rediss|unix)://", url):
        raise ValueError(f"budgets.redis_url={url!r}: use redis://host:port/db (or rediss://, unix:///path.sock)")
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ValueError("budgets.redis_url needs the redis package: pip install 'pyrodash[budget]'") from None


def load_curve(path: object) -> Curve:
    """A calibration curve: `pyrodash calibrate --budget-usd X --json` output (its `trace`), or a bare list of
    {bias, cost_usd} points."""
    p = Path(str(path))
    if not p.is_file():
        raise ValueError(
            f"budgets.curve={path}: no such file: run `pyrodash calibrate ... --budget-usd X --json > "
            f"{path}` on a sample of your traffic"
        )
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(
            f"budgets.curve={path} is not JSON ({e}): use the output of `pyrodash calibrate --json`"
        ) from None
    trace = data.get("trace") if isinstance(data, dict) else data
    if not isinstance(trace, list) or not all(isinstance(t, dict) and "bias" in t for t in trace):
        raise ValueError(
            f"budgets.curve={path}: expected `pyrodash calibrate --json` output (a `trace` of {{bias, "
            "rate, cost_usd}} points)"
        )
    try:
        return Curve.from_trace(trace)
    except ValueError as e:
        raise ValueError(f"budgets.curve={path}: {e}") from None
