"""Markdown cells and tables of the report: percentages, normalized costs, pipe tables, code fences."""

from __future__ import annotations


def pct(x: float | None) -> str:
    return "--" if x is None else f"{100 * x:.2f}"


def norm(x: float | None) -> str:
    return "--" if x is None else f"{x:.4f}"


def md_row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header: list[str], rows: list[list]) -> list[str]:
    return [md_row(header), md_row(["---"] * len(header))] + [md_row(r) for r in rows]


def fence(text: str) -> list[str]:
    return ["```", text.replace("```", "ʼʼʼ"), "```"]
