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


@dataclass(frozen=True)
class Prices:
    """USD per million tokens for each billed component."""

    slm_in: float
    slm_out: float
    llm_in: float
    llm_out: float
    llm_cached_in: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Usage:
    """Token counts per billed component, and how many times the LLM was called.

    `llm_in` counts all LLM input tokens; `llm_cached_in` is the part of them served from the provider's prompt
    cache (so `llm_cached_in <= llm_in`), billed at `Prices.llm_cached_in` when the sheet gives one.
    """

    slm_in: int = 0
    slm_out: int = 0
    llm_in: int = 0
    llm_out: int = 0
    llm_cached_in: int = 0
    llm_calls: int = 0

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
        cached_price = prices.llm_in if prices.llm_cached_in is None else prices.llm_cached_in
        uncached = self.llm_in - self.llm_cached_in
        return (
            self.slm_in * prices.slm_in
            + self.slm_out * prices.slm_out
            + uncached * prices.llm_in
            + self.llm_cached_in * cached_price
            + self.llm_out * prices.llm_out
        ) / MILLION

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
