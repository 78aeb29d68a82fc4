"""Where one request's time goes: SLM decode, the handoff, the LLM — the Collaborate Engine on real models.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/request_breakdown.py --slm runs/q/stage3-lambda0.1 \
        --llm WORLD/llm --world WORLD [--split tier3] [--n 40] [--prompts world-v1]

Each question goes through `CollaborateEngine.stream` alone. Per request: SLM = start to `Handoff` (or `Done`);
handoff = `Handoff` to the first LLM token; LLM = first LLM token to `Done`. `--slm`/`--llm`: model directories (in
process; tiny models want OMP_NUM_THREADS=1) or http(s)://host:port/v1#model URLs. The last line is exactly:
`n=<n> handoff_rate=<h> slm_ms_p50=<a> handoff_ms_p50=<b> llm_ms_p50=<c> slm_ms_per_token=<d> llm_ms_per_token=<e>
slm_in_mean=<k> slm_tokens_mean=<f> llm_in_mean=<g> llm_out_mean=<i> total_ms_p50=<j>` (one line; p50s over the
requests that handed off, per-token times over all).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def one(engine, question: str) -> dict:
    from pyrodash.events import Done, Handoff, LLMDelta

    t0 = time.perf_counter()
    t_handoff = t_llm = None
    done = None
    async for ev in engine.stream(question):
        now = time.perf_counter()
        if isinstance(ev, Handoff):
            t_handoff = now
        elif isinstance(ev, LLMDelta) and ev.text and t_llm is None:
            t_llm = now
        elif isinstance(ev, Done):
            done = ev
    end = time.perf_counter()
    u = done.usage
    rec = {
        "total": end - t0,
        "handoff": done.handoff is not None,
        "slm_in": u.slm_in,
        "slm_out": u.slm_out,
        "llm_in": u.llm_in,
        "llm_out": u.llm_out,
    }
    if t_handoff is None:
        rec.update(slm=end - t0, hand=0.0, llm=0.0)
    else:
        t_llm = t_llm or end
        rec.update(slm=t_handoff - t0, hand=t_llm - t_handoff, llm=end - t_llm)
    return rec


async def run(args) -> list[dict]:
    from pyrodash.backends import load_llm, load_slm
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine
    from pyrodash.prompts import get_prompts
    from pyrodash.world.build import load_world_split

    engine = CollaborateEngine(
        load_slm(args.slm),
        load_llm(args.llm),
        get_prompts(args.prompts),
        Prices.from_yaml("paper"),
        max_tokens=args.max_tokens,
    )
    questions = [ex.question for ex in load_world_split(args.world, args.split)[: args.n]]
    await one(engine, questions[0])  # warm-up, not counted
    out = [await one(engine, q) for q in questions]
    await engine.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slm", required=True)
    p.add_argument("--llm", required=True)
    p.add_argument("--world", required=True, help="a built world (its test split supplies the questions)")
    p.add_argument("--split", default="tier3")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--prompts", default="world-v1")
    p.add_argument("--max-tokens", type=int, default=256)
    a = p.parse_args(argv)
    recs = asyncio.run(run(a))
    off = [r for r in recs if r["handoff"]] or recs

    def p50(key: str, rows=off) -> float:
        return statistics.median(r[key] for r in rows) * 1e3

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in recs)

    slm_tok = sum(r["slm_out"] for r in recs)
    llm_tok = sum(r["llm_out"] for r in recs)
    slm_ms_tok = sum(r["slm"] for r in recs) * 1e3 / max(1, slm_tok)
    llm_ms_tok = sum(r["llm"] for r in recs) * 1e3 / max(1, llm_tok)
    for name, key in (
        ("SLM (prefill + decode)", "slm"),
        ("handoff (pack, request, LLM prefill)", "hand"),
        ("LLM decode", "llm"),
    ):
        share = sum(r[key] for r in off) / sum(r["total"] for r in off)
        print(f"{name:38s} p50 {p50(key):8.1f} ms   share of a handed-off request's time {share:6.1%}")
    print(
        f"n={len(recs)} handoff_rate={sum(r['handoff'] for r in recs) / len(recs):.3f} "
        f"slm_ms_p50={p50('slm'):.1f} handoff_ms_p50={p50('hand'):.1f} llm_ms_p50={p50('llm'):.1f} "
        f"slm_ms_per_token={slm_ms_tok:.2f} llm_ms_per_token={llm_ms_tok:.2f} slm_in_mean={mean('slm_in'):.1f} "
        f"slm_tokens_mean={mean('slm_out'):.1f} "
        f"llm_in_mean={mean('llm_in'):.1f} llm_out_mean={mean('llm_out'):.1f} total_ms_p50={p50('total'):.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
