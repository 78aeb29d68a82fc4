"""`ServeConfig`: everything `pyrodash serve` needs, from a YAML recipe (`configs/serve/*.yaml`) plus CLI flags.
Every key, with an example of each: docs/serving.md ("The serve config"). Relative paths in `slm`/`llm`/`prices`
resolve against the YAML file's folder, then the working directory.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from urllib.parse import urlparse

import yaml

from pyrodash.backends.retry import FailurePolicy
from pyrodash.cost import Prices
from pyrodash.engine import check_share
from pyrodash.engine.conversation import ContextLimits
from pyrodash.engine.range_rule import RangeRule
from pyrodash.engine.relay import check_calls
from pyrodash.prompts import get_prompts
from pyrodash.server.budget.config import BudgetsConfig


@dataclass(frozen=True)
class OperatingPoint:
    """What a model name promises: the `<offload>` bias, and the share of requests that may hand off (the others are
    answered by the SLM alone, `handoff_admitted: false` in the response)."""

    offload_bias: float = 0.0  # added to the <offload> logit: + hands off sooner and more often
    handoff_share: float = 1.0  # share of requests that may hand off (a fixed hash of each), in [0, 1]
    range_rule: RangeRule = RangeRule()  # past the SLM's range the LLM answers alone (off: no limit set)
    max_llm_calls: int | None = None  # LLM calls per answer (>1: relay, pyrodash.engine.relay); None: the engine's
    relay: dict = field(default_factory=dict)  # {step_sep, step_max_tokens} of its relay steps (unset: the engine's)

    @classmethod
    def parse(cls, name: str, value) -> OperatingPoint:
        """A number (an offload_bias) or a mapping with offload_bias, handoff_share, range_rule, max_llm_calls and/or
        relay ({step_sep, step_max_tokens})."""
        if isinstance(value, OperatingPoint):
            return value
        rule = None
        if isinstance(value, dict):
            unknown = set(value) - {"offload_bias", "handoff_share", "range_rule", "max_llm_calls", "relay"}
            if unknown:
                raise ValueError(
                    f"operating_points.{name}: unknown keys {sorted(unknown)}; use offload_bias, handoff_share, "
                    "range_rule, max_llm_calls and relay"
                )
            bias, share, rule = value.get("offload_bias", 0.0), value.get("handoff_share", 1.0), value.get("range_rule")
        else:
            bias, share = value, 1.0
        calls = value.get("max_llm_calls") if isinstance(value, dict) else None
        for key, v in (("offload_bias", bias), ("handoff_share", share)):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ValueError(f"operating_points.{name}.{key}={v!r} must be a number")
        try:
            relay = _relay_keys(value.get("relay") if isinstance(value, dict) else None)
            return cls(
                float(bias),
                check_share(share),
                RangeRule.of(rule),
                None if calls is None else check_calls(calls),
                relay,
            )
        except ValueError as e:
            raise ValueError(f"operating_points.{name}: {e}") from None


def _relay_keys(relay: object) -> dict:
    """An operating point's `relay:` mapping, checked: step_sep and/or step_max_tokens (left out: the engine's)."""
    if relay is None:
        return {}
    if not isinstance(relay, dict) or set(relay) - {"step_sep", "step_max_tokens"}:
        raise ValueError(f"relay={relay!r} must be a mapping with step_sep and/or step_max_tokens")
    sep, cap = relay.get("step_sep"), relay.get("step_max_tokens")
    if sep is not None and (not isinstance(sep, str) or not sep):
        raise ValueError(f"relay.step_sep={sep!r} must be a non-empty string (the end of a step)")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise ValueError(f"relay.step_max_tokens={cap!r} must be a positive integer")
    return dict(relay)


@dataclass
class Limits:
    max_body_bytes: int = 1 << 20  # larger request bodies get a 413
    max_tokens: int = 4096  # a request asking for more gets a 400
    default_max_tokens: int = 512  # used when a request gives no max_tokens
    max_concurrency: int = 256  # engine requests running at once; more wait their turn

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"limits.{f.name}={v!r} must be a positive integer")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"limits.default_max_tokens={self.default_max_tokens} exceeds limits.max_tokens={self.max_tokens}"
            )


@dataclass
class ServeConfig:
    slm: str | dict | None = None  # the trained SLM: a model directory, hub id, DIR#file.gguf or URL#model
    llm: str | dict | list | None = None  # the LLM: URL#model, a model directory, a spec mapping or a list (mesh)
    base_slm: str | dict | None = None  # answers mode "slm" alone (None: the served SLM with <offload> banned)
    prices: str | dict = "paper"  # the price sheet of the cost figures (configs/prices/, a path or a mapping)
    prompts: str = "qwen-math-v1"  # the prompt set the SLM was trained with (world-v1 for the world)
    handoff_style: str = "continue"  # how the LLM is asked to go on from the SLM's partial trace
    llm_mode: str | None = None  # None: the llm spec's mode (default auto: detected at start-up)
    # Model name -> OperatingPoint (YAML: a number, the offload_bias, or {offload_bias, handoff_share})
    operating_points: dict[str, OperatingPoint] = field(default_factory=lambda: {"pyrodash": OperatingPoint()})
    failure: FailurePolicy = field(default_factory=FailurePolicy)  # the LLM side's retries and fallback (below)
    limits: Limits = field(default_factory=Limits)  # request size limits (below)
    context: ContextLimits = field(default_factory=ContextLimits)  # the models' context windows (below)
    host: str = "127.0.0.1"  # the address to listen on
    port: int = 8000  # and its port
    api_key: str | None = None  # set directly (--api-key) or read from `api_key_env`
    api_key_env: str | None = "PYRODASH_API_KEY"  # the environment variable holding the key
    cors_origins: list[str] = field(default_factory=list)  # browser origins allowed to call the API
    log_level: str = "info"  # uvicorn's log level
    metrics_public: bool = False  # GET /metrics without the key (auth on): for a scraper that cannot send one
    allow_unknown_fields: bool = False  # top-level request fields outside OpenAI's API: ignored, not a 400
    budgets: BudgetsConfig | None = None  # dollar budgets (pyrodash.server.budget.config); YAML: a mapping

    def __post_init__(self) -> None:
        if isinstance(self.failure, dict):
            unknown = set(self.failure) - {f.name for f in fields(FailurePolicy)}
            if unknown:
                raise ValueError(
                    f"failure: unknown keys {sorted(unknown)}; use {', '.join(f.name for f in fields(FailurePolicy))}"
                )
            self.failure = FailurePolicy(**self.failure)
        if isinstance(self.limits, dict):
            self.limits = Limits(**self.limits)
        if isinstance(self.context, dict):
            unknown = set(self.context) - {"slm", "llm"}
            if unknown:
                raise ValueError(f"context: unknown keys {sorted(unknown)}; use slm and llm (tokens)")
            self.context = ContextLimits(**self.context)
        if not isinstance(self.operating_points, dict) or not self.operating_points:
            raise ValueError(
                "operating_points must map at least one model name to an offload_bias, e.g. "
                "{pyrodash: 0.0, pyrodash-half: {offload_bias: 0.0, handoff_share: 0.5}}"
            )
        self.operating_points = {str(k): OperatingPoint.parse(str(k), v) for k, v in self.operating_points.items()}
        get_prompts(self.prompts)  # raises a ValueError naming the known sets
        if not 0 < int(self.port) < 65536:
            raise ValueError(f"port={self.port} must be in 1..65535")
        self.budgets = BudgetsConfig.parse(self.budgets, self.resolved_api_key())

    @property
    def default_model(self) -> str:
        return next(iter(self.operating_points))

    def resolved_api_key(self) -> str | None:
        """The bearer token clients must send, or None (auth off)."""
        if self.api_key:
            return self.api_key
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def check_models(self) -> None:
        """Fail early, with a message, when an SLM/LLM spec names a local directory that is not there (a string with
        one slash and no leading . or / is taken as a hub id; URLs are checked when the server starts)."""
        specs = [("slm", self.slm)] + [("llm", s) for s in _members(self.llm)]
        if self.base_slm is not None:
            specs.append(("base-slm", self.base_slm))
        for side, spec in specs:
            if spec is None:
                raise ValueError(f"no {side.upper()} given: set {side} in the config or pass --{side}")
            path = spec.get("path") if isinstance(spec, dict) else spec
            if not isinstance(path, str) or "://" in path or Path(path.partition("#")[0]).exists():  # DIR#file.gguf
                continue
            if path.count("/") == 1 and not path.startswith((".", "/")):
                continue  # a hub id such as Qwen/Qwen3.5-4B
            raise ValueError(
                f"{side} model directory {path} does not exist: build or train it first, or pass "
                f"--{side} with a model directory, hub id or http(s)://host:port/v1#model URL"
            )

    def private_strings(self) -> list[str]:
        """What a client must never see: the model specs' local paths (as given and resolved), endpoint URLs and
        their host:port (`pyrodash.server.protocol.protect` hides them in every message the server sends)."""
        out: list[str] = []
        specs = [self.slm, self.base_slm, *_members(self.llm)]
        for spec in specs:
            if isinstance(spec, dict):
                out += [str(spec[k]) for k in ("url", "path", "tokenizer") if isinstance(spec.get(k), str)]
            elif isinstance(spec, str):
                out.append(spec.partition("#")[0] if "://" in spec else spec)
        found: list[str] = []
        for text in out:
            if "://" in text:
                host = urlparse(text).netloc.rpartition("@")[2]
                found += [text.rstrip("/"), host] if ":" in host else [text.rstrip("/")]
            elif text:
                # a bare name ("tiny-llm") is no path and may be a public model name; a/b or its absolute form is
                found += [text] if "/" in text or "\\" in text else []
                with contextlib.suppress(OSError, ValueError):
                    found.append(str(Path(text).expanduser().resolve()))
        return [t for t in dict.fromkeys(found) if t]

    def load_prices(self) -> Prices:
        return Prices.load(self.prices)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["api_key"] = "***" if self.api_key else None  # never echo a secret
        return d

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: object) -> ServeConfig:
        """Load a recipe; `overrides` (CLI flags) win over the file where they are not None."""
        p = Path(path)
        if not p.exists():
            raise ValueError(f"serve config {path} not found")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"serve config {p}: expected a mapping at top level")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"serve config {p}: unknown keys {sorted(unknown)}; expected some of {sorted(known)}")
        for key in ("slm", "base_slm", "llm", "prices"):
            data[key] = _resolve_paths(data.get(key), p.parent)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**{k: v for k, v in data.items() if v is not None})


def _members(spec: object) -> list:
    """The endpoint specs of an LLM spec (one, or a mesh's members)."""
    if isinstance(spec, list):
        return spec or [None]
    if isinstance(spec, dict) and "endpoints" in spec:
        return list(spec["endpoints"] or [None])
    return [spec]


def _resolve_paths(spec: object, base: Path) -> object:
    """A relative local path in a spec is taken relative to the YAML file when it exists there."""
    if isinstance(spec, list):
        return [_resolve_paths(s, base) for s in spec]
    if isinstance(spec, dict) and "endpoints" in spec:
        return {**spec, "endpoints": _resolve_paths(spec["endpoints"], base)}
    if isinstance(spec, dict) and isinstance(spec.get("prices"), str):
        spec = {**spec, "prices": _resolve_paths(spec["prices"], base)}
    if isinstance(spec, dict) and isinstance(spec.get("chat_template"), str) and "{" not in spec["chat_template"]:
        spec = {**spec, "chat_template": _resolve_paths(spec["chat_template"], base)}  # a template file
    if isinstance(spec, dict) and "path" in spec:
        return {**spec, "path": _resolve_paths(spec["path"], base)}
    if isinstance(spec, str) and "://" not in spec and not Path(spec).is_absolute():
        candidate = base / spec
        if candidate.exists() and not Path(spec).exists():
            return str(candidate.resolve())
    return spec
