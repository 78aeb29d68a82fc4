"""Token accounting and dollar cost: the paper's cost model.

Four token components are billed, each at a price in USD per million tokens (`eq:cost`):

    C = n_in^slm p_in^slm + n_out^slm p_out^slm + n_in^llm p_in^llm + n_out^llm p_out^llm

plus, when a price sheet gives one, a discounted price for cached LLM input (prompt-cache hits).
`Usage` holds the counts, `Prices` the sheet; the functions below are the metrics and the
training-reward accounting of Stage 3 (`eq:grpo-baseline`, `eq:grpo-cost-actual`, `eq:grpo-eff`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

PRICES_DIR = Path(__file__).resolve().parent.parent / "configs" / "prices"
MILLION = 1_000_000
COMPONENTS = ("slm_in", "slm_out", "llm_in", "llm_out")  # the billed components of an answer's cost


@dataclass(frozen=True)
class Prices:
    """USD per million tokens for each billed component."""

    slm_in: float
    slm_out: float
    llm_in: float
    llm_out: float
    llm_cached_in: float | None = None
    # the LLM endpoint caches prompt prefixes: input an earlier call of the same answer sent is billed at
    # llm_cached_in when the provider reported no cached tokens (an estimate, marked so)
    llm_prefix_cache: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.llm_prefix_cache, bool):
            raise ValueError(f"llm_prefix_cache={self.llm_prefix_cache!r} must be true or false")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "llm_prefix_cache":
                continue
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"price {f.name}={value!r} must be a non-negative number (USD per million tokens)")

    @classmethod
    def from_yaml(cls, path: str | Path) -> Prices:
        """Load a price sheet. `path` is a YAML file or the name of a sheet in configs/prices/ (e.g. "paper")."""
        p = Path(path)
        if not p.exists() and (PRICES_DIR / f"{path}.yaml").exists():
            p = PRICES_DIR / f"{path}.yaml"
        if not p.exists():
            sheets = ", ".join(sorted(x.stem for x in PRICES_DIR.glob("*.yaml")))
            raise ValueError(f"price sheet {path!r} not found: give a YAML path or one of: {sheets}")
        data = yaml.safe_load(p.read_text()) or {}
        data = data.get("prices", data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"price sheet {p}: unknown keys {sorted(unknown)}; expected {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_litellm(cls, llm: dict, slm: dict | None = None) -> Prices:
        """Prices from LiteLLM `model_prices_and_context_window.json` entries (USD per token: `input_cost_per_token`,
        `output_cost_per_token`, optional `cache_read_input_token_cost`); the SLM side is free when not given."""
        lin, lout, lcached = _litellm_entry(llm)
        sin, sout, _ = _litellm_entry(slm) if slm is not None else (0.0, 0.0, None)
        return cls(slm_in=sin, slm_out=sout, llm_in=lin, llm_out=lout, llm_cached_in=lcached)

    @classmethod
    def load(cls, spec: str | Path | dict) -> Prices:
        """Any price sheet: a name in configs/prices/ or a YAML path (`from_yaml`); `FILE.json#MODEL` (a LiteLLM
        price file and the model's key in it: the LLM side, SLM free); an inline dict in our keys; one LiteLLM entry
        (the LLM side); or `{slm: ..., llm: ...}` with a LiteLLM entry or `FILE.json#MODEL` on each side."""
        if isinstance(spec, (str, Path)):
            if "#" in str(spec) and str(spec).split("#", 1)[0].endswith(".json"):
                return cls.from_litellm(_litellm_file_entry(str(spec)))
            return cls.from_yaml(spec)
        if not isinstance(spec, dict):
            raise ValueError(f"price sheet {spec!r}: give a sheet name, a YAML path, FILE.json#MODEL or a mapping")
        if set(spec) & set(LITELLM_KEYS):
            return cls.from_litellm(spec)
        if set(spec) and set(spec) <= {"slm", "llm"}:
            sides = {k: _litellm_file_entry(v) if isinstance(v, str) else v for k, v in spec.items()}
            if "llm" not in sides:
                raise ValueError("price sheet {slm: ..., llm: ...}: the llm side is required")
            return cls.from_litellm(sides["llm"], sides.get("slm"))
        known = {f.name for f in fields(cls)}
        if set(spec) - known:
            raise ValueError(
                f"price sheet: unknown keys {sorted(set(spec) - known)}; expected {sorted(known)}, "
                f"LiteLLM's {sorted(LITELLM_KEYS)}, or {{slm: ..., llm: ...}}"
            )
        return cls(**spec)

    def to_dict(self) -> dict:
        return asdict(self)


LITELLM_KEYS = ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost")


def _litellm_entry(entry: dict) -> tuple[float, float, float | None]:
    """(input, output, cached input) in USD per million tokens from one LiteLLM entry (USD per token)."""
    if not isinstance(entry, dict) or "input_cost_per_token" not in entry or "output_cost_per_token" not in entry:
        raise ValueError("a LiteLLM price entry needs input_cost_per_token and output_cost_per_token (USD per token)")
    vals = []
    for key in LITELLM_KEYS:
        v = entry.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            raise ValueError(f"LiteLLM price {key}={v!r} must be a non-negative number (USD per token)")
        vals.append(None if v is None else float(v) * MILLION)
    return vals[0], vals[1], vals[2]


def _litellm_file_entry(ref: str) -> dict:
    """The entry `MODEL` of a LiteLLM price file, from `FILE.json#MODEL`."""
    import json

    path, _, model = ref.partition("#")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"LiteLLM price file {path} not found (give FILE.json#MODEL)")
    try:
        table = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"LiteLLM price file {path} is not JSON: {e}") from e
    if model not in table:
        raise ValueError(f"{path} has no entry {model!r}: use the model's key in that file after '#'")
    return table[model]


def endpoint_bill(calls: Iterable[dict], default: Prices) -> list[dict]:
    """Per-endpoint totals of LLM calls (`Done.llm_endpoints`): each call entry has endpoint, calls, llm_in,
    llm_out, llm_cached_in, text and its endpoint's `prices` (a Prices dict, or None = `default`); each endpoint is
    billed at its own LLM prices."""
    out: dict[str, dict] = {}
    for c in calls:
        sheet = Prices(**c["prices"]) if c.get("prices") else default
        e = out.setdefault(
            c["endpoint"],
            {
                "endpoint": c["endpoint"],
                "calls": 0,
                "llm_in": 0,
                "llm_out": 0,
                "llm_cached_in": 0,
                "chars": 0,
                "errors": 0,
                "estimated": False,
                "price": {"llm_in": sheet.llm_in, "llm_out": sheet.llm_out, "llm_cached_in": sheet.llm_cached_in},
                "own_price": bool(c.get("prices")),  # False: billed at `default` (a report may re-price it)
                "cost_usd": 0.0,
            },
        )
        u = Usage(
            llm_in=c.get("llm_in", 0),
            llm_out=c.get("llm_out", 0),
            llm_cached_in=c.get("llm_cached_in", 0),
            llm_prior_in=0 if c.get("cache_reported") else c.get("llm_prior_in", 0),  # a reported figure wins
        )
        e["calls"] += c.get("calls", 0)
        e["llm_in"] += u.llm_in
        e["llm_out"] += u.llm_out
        e["llm_cached_in"] += u.llm_cached_in
        e["chars"] += len(c.get("text") or "")
        e["errors"] += bool(c.get("error"))
        e["estimated"] = e["estimated"] or bool(c.get("estimated"))  # counts of a broken call: as delivered
        parts = u.components(sheet)
        e["cost_usd"] += parts["llm_in"] + parts["llm_out"]
        split = e.setdefault("cost_usd_by_component", {"llm_in": 0.0, "llm_out": 0.0})
        split["llm_in"] += parts["llm_in"]
        split["llm_out"] += parts["llm_out"]
        e["llm_prior_in"] = e.get("llm_prior_in", 0) + c.get("llm_prior_in", 0)  # input an earlier call sent
        if c.get("cache_reported"):
            e["cache_reported"] = True
        if c.get("client_stop"):  # calls the client closed at a stop string the server wrote past
            e["client_stops"] = e.get("client_stops", 0) + 1
        if u.cache_estimated(sheet):  # billed as cached from that split, not from a reported figure
            e["cache_estimated"] = True
    return list(out.values())


@dataclass(frozen=True)
class Usage:
    """Token counts per billed component, and how many times the LLM was called.

    `llm_in` counts all LLM input tokens; `llm_cached_in` is the part of them served from the provider's prompt
    cache (so `llm_cached_in <= llm_in`), billed at `Prices.llm_cached_in` when the sheet gives one. `slm_in` counts
    all the SLM's prompt tokens; `slm_cached_in` is the part its backend served from its own prefix cache (the KV of
    an earlier call it continues: a relay's resumes), never prefilled again and not billed.
    """

    slm_in: int = 0
    slm_out: int = 0
    llm_in: int = 0
    llm_out: int = 0
    llm_cached_in: int = 0
    llm_calls: int = 0
    llm_prior_in: int = 0  # the part of llm_in an earlier LLM call of the same answer already sent (relay)
    slm_cached_in: int = 0  # the part of slm_in the SLM's backend served from its prefix cache (not billed)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __radd__(self, other: object) -> Usage:
        if other == 0:  # lets the builtin sum() start from 0
            return self
        return self.__add__(other)  # type: ignore[arg-type]

    def cost(self, prices: Prices) -> float:
        """Dollar cost of this usage under `prices` (`eq:cost`, with cached input billed separately)."""
        return sum(self.components(prices).values())

    def components(self, prices: Prices) -> dict[str, float]:
        """`cost` by billed component (`COMPONENTS`; cached LLM input is part of llm_in, at its own price): the
        terms of `eq:cost`, which `cost` sums."""
        cached_price = prices.llm_in if prices.llm_cached_in is None else prices.llm_cached_in
        cached = self.llm_prior_in if self.cache_estimated(prices) else self.llm_cached_in
        cached = min(cached, self.llm_in)  # a provider reporting more cached than input tokens: never a negative bill
        return {
            "slm_in": (self.slm_in - self.slm_cached_in) * prices.slm_in / MILLION,  # its prefix cache's: not billed
            "slm_out": self.slm_out * prices.slm_out / MILLION,
            "llm_in": ((self.llm_in - cached) * prices.llm_in + cached * cached_price) / MILLION,
            "llm_out": self.llm_out * prices.llm_out / MILLION,
        }

    def cache_estimated(self, prices: Prices) -> bool:
        """Whether `cost` bills the prior part of the input as cached: the sheet says the endpoint caches prefixes
        and the provider reported no cached tokens (a reported figure always wins)."""
        return prices.llm_prefix_cache and not self.llm_cached_in and self.llm_prior_in > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Usage:
        return cls(**{f.name: int(d.get(f.name, 0)) for f in fields(cls)})


def total_usage(usages: Iterable[Usage]) -> Usage:
    return sum(usages, Usage())


def llm_token_ratio(usages: Iterable[Usage]) -> float:
    """Share of decoded tokens produced by the LLM (`eq:llm-token-ratio`):
    sum n_out^llm / (sum n_out^slm + sum n_out^llm). 0.0 when nothing was decoded."""
    total = total_usage(usages)
    decoded = total.slm_out + total.llm_out
    return total.llm_out / decoded if decoded else 0.0


def normalized_cost(usages: Iterable[Usage], llm_only_usages: Iterable[Usage], prices: Prices) -> float:
    """Total dollar cost of a method divided by the total cost of LLM-only inference on the same examples."""
    base = total_usage(llm_only_usages).cost(prices)
    if base <= 0:
        raise ValueError("the LLM-only baseline has zero cost; cannot normalise")
    return total_usage(usages).cost(prices) / base


# --- Stage 3 reward accounting (per token prices, so the ratio does not depend on the unit) ---------------------


def grpo_cost_base(t_in: int, t_llm_dec: int, prices: Prices) -> float:
    """Cost of LLM-only inference on one prompt (`eq:grpo-baseline`): C_pre * T_in + C_dec * T_l,dec."""
    return (prices.llm_in * t_in + prices.llm_out * t_llm_dec) / MILLION


def grpo_cost_actual(
    t_slm: int, t_llm_dec: int, prices: Prices, handoff: bool = True, slm_price: float | None = None
) -> float:
    """Compact collaborative cost of one rollout (`eq:grpo-cost-actual`): (C_s + C_pre) * T_s + C_dec * T_l,dec.

    T_s is the number of SLM tokens before `<offload>`: they are decoded by the SLM and prefilled by the LLM. With no
    handoff (`handoff=False`) no LLM call happens, so the C_pre term and T_l,dec are zero. C_s is the unified SLM
    per-token price; by default the SLM output price.
    """
    if not handoff and t_llm_dec:
        raise ValueError("a rollout without a handoff cannot have LLM decode tokens")
    c_s = prices.slm_out if slm_price is None else slm_price
    c_pre = prices.llm_in if handoff else 0.0
    return ((c_s + c_pre) * t_slm + prices.llm_out * t_llm_dec) / MILLION


def grpo_efficiency(cost_actual: float, cost_base: float) -> float:
    """Normalised efficiency penalty (`eq:grpo-eff`): R_eff = Cost_act / Cost_base."""
    if cost_base <= 0:
        raise ValueError("Cost_base must be positive (run the LLM-only baseline on this prompt first)")
    return cost_actual / cost_base


def grpo_total_reward(r_acc: float, r_eff: float, lam: float) -> float:
    """Total GRPO reward (`eq:grpo-total`): R_total = R_acc - lambda * R_eff."""
    return r_acc - lam * r_eff
