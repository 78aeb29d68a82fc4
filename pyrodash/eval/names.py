"""The method-name scheme of evaluation records (`RUN_DIR/records/<method>.jsonl`): parsing and report order.

    slm | slm+sft | oracle | relay_oracle | llm | routellm@<α> | glimprouter@<τ> | pyrodash@<λ>
    pyrodash@<λ>+bias<b> (an offload_bias sweep) | pyrodash@<λ>+share<s> (a handoff_share sweep)
    pyrodash@<λ>+relay<n> (relay, up to n LLM calls per answer)
    pyrodash@<λ>+bias<b>+relay<n> / pyrodash@<λ>+share<s>+relay<n> (a bias or share sweep point in relay mode)

    method_name("pyrodash", 0.1, "bias", 2)   # -> "pyrodash@0.1+bias2"
    method_name("pyrodash", 0, "bias", 2, relay=4)   # -> "pyrodash@0+bias2+relay4"
    parse_method("pyrodash@0.1+bias2")        # -> ("pyrodash", 0.1, 2.0)

Read by the report (`pyrodash.report`) and its figure (`pyrodash.report.plots`).
"""

from __future__ import annotations

import re

BASE_ORDER = ("slm", "slm+sft", "oracle", "relay_oracle", "llm")
FAMILY_ORDER = (
    "slm",
    "slm+sft",
    "routellm",
    "glimprouter",
    "pyrodash",
    "pyrodash-bias",
    "pyrodash-share",
    "pyrodash-relay",
    "pyrodash-bias+relay",
    "pyrodash-share+relay",
    "relay_oracle",
    "oracle",
    "llm",
)
_NUM = r"([0-9.eE+-]+?)"
_NAME_RE = re.compile(rf"^(routellm|glimprouter|pyrodash)@{_NUM}(?:\+(bias|share|relay){_NUM})?(?:\+relay([0-9]+))?$")
_SCHEME = (
    "slm | slm+sft | oracle | relay_oracle | llm | routellm@<alpha> | glimprouter@<tau> | pyrodash@<lambda> | "
    "pyrodash@<lambda>+bias<b> | pyrodash@<lambda>+share<s> | pyrodash@<lambda>+relay<n> | "
    "pyrodash@<lambda>+bias<b>+relay<n> | pyrodash@<lambda>+share<s>+relay<n>"
)


def _match(name: str) -> re.Match:
    m = _NAME_RE.match(name)
    if not m:
        raise ValueError(f"method name {name!r} does not follow the scheme {_SCHEME}; rename its records file")
    if m.group(3) is not None and m.group(1) != "pyrodash":
        raise ValueError(f"method name {name!r}: only pyrodash takes a +bias<b>, +share<s> or +relay<n> suffix")
    if m.group(5) is not None and m.group(3) not in ("bias", "share"):
        raise ValueError(f"method name {name!r}: a second +relay<n> follows only a +bias<b> or +share<s> sweep point")
    return m


def knob_text(x: float) -> str:
    """How a knob value appears in a method name: 4 significant digits (`pyrodash@0.1`, `routellm@0.4213`)."""
    return f"{float(x):.4g}"


def method_name(
    family: str,
    knob: float | None = None,
    sweep: str | None = None,
    value: float | None = None,
    relay: int | None = None,
) -> str:
    """The name of a method, the one `parse_method` reads: `slm` (a base method, no knob), `glimprouter@0.9`,
    `pyrodash@0.1+share0.5` (family `pyrodash`, λ 0.1, sweep "share" at 0.5); `relay=n` (n > 1) puts a bias or
    share sweep point in relay mode: `pyrodash@0+bias2+relay4`."""
    if family in BASE_ORDER and knob is None and sweep is None:
        return family
    if knob is None or (sweep is None) != (value is None):
        raise ValueError(
            f"method_name({family!r}, {knob!r}, {sweep!r}, {value!r}): a family with a knob, a sweep with a value"
        )
    name = f"{family}@{knob_text(knob)}" + ("" if sweep is None else f"+{sweep}{knob_text(value)}")
    if relay is not None:
        if int(relay) != relay or relay < 2:
            raise ValueError(f"method_name(..., relay={relay!r}): relay mode takes a whole number of calls above 1")
        name += f"+relay{int(relay)}"
    _match(name)
    return name


def parse_method(name: str) -> tuple[str, float | None, float | None]:
    """(family, knob, sweep value): `pyrodash@0.1+bias2` -> ("pyrodash", 0.1, 2.0), `pyrodash@0.6+share0.5` ->
    ("pyrodash", 0.6, 0.5); `slm` -> ("slm", None, None). `sweep_kind` says which knob a sweep value is."""
    if name in BASE_ORDER:
        return name, None, None
    m = _match(name)
    return m.group(1), float(m.group(2)), None if m.group(4) is None else float(m.group(4))


def sweep_kind(name: str) -> str | None:
    """ "bias" (an offload_bias sweep point), "share" (a handoff_share sweep point), "relay", "bias+relay" or
    "share+relay" (a bias or share sweep point in relay mode: its sweep value is the bias or share), or None."""
    if name in BASE_ORDER:
        return None
    m = _match(name)
    return m.group(3) if m.group(5) is None else f"{m.group(3)}+relay"


def relay_calls(name: str) -> int:
    """The most LLM calls per answer a method's name says: n for `...+relay<n>`, else 1 (single handoff)."""
    if name in BASE_ORDER:
        return 1
    m = _match(name)
    n = m.group(5) or (m.group(4) if m.group(3) == "relay" else None)
    return 1 if n is None else int(float(n))


def is_lambda_point(name: str) -> bool:
    """Whether `name` is a trained policy at its own operating point, `pyrodash@<λ>` (no bias/share sweep)."""
    return name not in BASE_ORDER and parse_method(name)[0] == "pyrodash" and sweep_kind(name) is None


def lambda_points(names) -> list[str]:
    """The `pyrodash@<λ>` names among `names`, by λ."""
    return sorted((n for n in names if is_lambda_point(n)), key=lambda n: parse_method(n)[1])


def sort_key(name: str) -> tuple:
    """The report's order: families as in FAMILY_ORDER, then by knob, then by sweep value."""
    fam, knob, value = parse_method(name)
    kind = sweep_kind(name)
    fam_i = FAMILY_ORDER.index(f"pyrodash-{kind}" if kind else fam)
    return fam_i, knob if knob is not None else 0.0, value if value is not None else 0.0
