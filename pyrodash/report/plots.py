"""The Pareto figure of a run: total dollars (x) vs average accuracy (y), one marker per method, each knob sweep
(RouteLLM α, GlimpRouter τ, PyroDash λ, one PyroDash policy across offload_bias or handoff_share) drawn as connected
points. The report (`pyrodash.report.render.write_report`) draws it from its metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pyrodash.eval.names import parse_method, sweep_kind


class Metrics(Protocol):
    """What the figure reads of a method's metrics (`pyrodash.report.metrics.Metrics`)."""

    accuracy: float  # in [0, 1]
    cost_usd: float


STYLE = {
    "slm": ("tab:gray", "s"),
    "slm+sft": ("tab:brown", "s"),
    "llm": ("black", "*"),
    "oracle": ("tab:purple", "P"),
    "routellm": ("tab:blue", "o"),
    "glimprouter": ("tab:green", "^"),
    "pyrodash": ("tab:red", "D"),
    "pyrodash-bias": ("tab:orange", "v"),
    "pyrodash-share": ("tab:pink", "<"),
    "pyrodash-relay": ("tab:cyan", ">"),
    "relay_oracle": ("tab:purple", "X"),
}


def series(ms: dict[str, Metrics]) -> dict[str, list[tuple[float, Metrics]]]:
    """{series label: [(knob, metrics)] sorted by knob}; single methods are one-point series."""
    out: dict[str, list[tuple[float, Metrics]]] = {}
    for name, m in ms.items():
        fam, knob, value = parse_method(name)
        if value is not None:
            out.setdefault(f"pyrodash@{knob:g} {sweep_kind(name)} sweep", []).append((value, m))
        elif knob is not None:
            out.setdefault(
                {"routellm": "RouteLLM-MF (α)", "glimprouter": "GlimpRouter (τ)", "pyrodash": "PyroDash (λ)"}[fam], []
            ).append((knob, m))
        else:
            out[name] = [(0.0, m)]
    for name, m in ms.items():  # a bias sweep starts from its policy at bias 0, a share sweep ends at share 1
        fam, knob, value = parse_method(name)
        if fam == "pyrodash" and value is None:
            for kind, at in (("bias", 0.0), ("share", 1.0), ("relay", 1.0)):
                if f"pyrodash@{knob:g} {kind} sweep" in out:
                    out[f"pyrodash@{knob:g} {kind} sweep"].append((at, m))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in out.items()}


def _style(label: str) -> tuple[str, str]:
    for kind in ("bias", "share", "relay"):
        if f"{kind} sweep" in label:
            return STYLE[f"pyrodash-{kind}"]
    for key in ("RouteLLM", "GlimpRouter", "PyroDash"):
        if label.startswith(key):
            return STYLE[key.lower().replace("-mf", "")]
    return STYLE.get(label, ("tab:purple", "x"))


def pareto_png(ms: dict[str, Metrics], path: str | Path, picked: dict[str, str] | None = None) -> Path:
    """The figure; `picked` ({kind: method}: the operating points picked on val, `pyrodash.report.select`) are ringed
    and labelled with their test figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    costs = [m.cost_usd for m in ms.values() if m.cost_usd > 0]
    for label, pts in series(ms).items():
        color, marker = _style(label)
        xs, ys = [m.cost_usd for _, m in pts], [100 * m.accuracy for _, m in pts]
        ax.plot(xs, ys, marker=marker, color=color, label=label, linestyle="-" if len(pts) > 1 else "none")
        if len(pts) > 1:
            for knob, m in pts:
                ax.annotate(
                    f"{knob:g}",
                    (m.cost_usd, 100 * m.accuracy),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                    color=color,
                )
    for kind, name in (picked or {}).items():
        if name in ms:
            m = ms[name]
            ax.plot([m.cost_usd], [100 * m.accuracy], "o", ms=14, mfc="none", mec="black", mew=1.5, label=None)
            ax.annotate(
                f"picked on val ({kind}): {name}",
                (m.cost_usd, 100 * m.accuracy),
                fontsize=7,
                xytext=(-10, -14),
                textcoords="offset points",
                ha="right",
            )
    if costs and max(costs) / min(costs) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("total cost ($)")
    ax.set_ylabel("average accuracy (%)")
    ax.set_title("Cost vs accuracy (knob values annotated)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


def range_png(calibration: dict, path: str | Path) -> Path:
    """The range rule's calibration (`pyrodash calibrate --range`): accuracy (top) and mean $ (bottom) per turn of the
    validation conversations, policy vs LLM alone, x = turn (the SLM prompt's mean tokens under it), the calibrated
    max_turns marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = calibration["by_turn"]
    xs = [r["turn"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for key, label, (color, marker) in (
        ("policy", "PyroDash (rule off)", STYLE["pyrodash"]),
        ("llm", "LLM", STYLE["llm"]),
    ):
        kept = [r for r in rows if r[f"{key}_acc"] is not None]  # up to the first turn out of range
        top.plot(
            [r["turn"] for r in kept], [100 * r[f"{key}_acc"] for r in kept], marker=marker, color=color, label=label
        )
        bottom.plot([r["turn"] for r in kept], [r[f"{key}_cost_usd"] for r in kept], marker=marker, color=color,
                    label=label)  # fmt: skip
    limit = calibration.get("max_turns")
    for ax in (top, bottom):
        if limit is not None:
            ax.axvline(limit + 0.5, color="tab:blue", linestyle="--", label=f"range: max_turns={limit}")
        ax.grid(alpha=0.3)
    top.set_ylabel("accuracy (%)")
    bottom.set_ylabel("$ per turn")
    ticks = [f"\n~{r['slm_prompt_tokens']['mean']:.0f} tok" if r["slm_prompt_tokens"] else "" for r in rows]
    bottom.set_xticks(xs, [f"{r['turn']}{tick}" for r, tick in zip(rows, ticks)])
    bottom.set_xlabel("turn (SLM prompt tokens, mean)")
    top.set_title("Accuracy and cost by context length (past the range: the LLM alone)")
    top.legend(fontsize=7, loc="best")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Lay out, write and close `fig`; its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
