"""`pyrodash calibrate`: pick the offload_bias that gives a target LLM-call rate (or $ budget) on a question set.

    pyrodash calibrate --slm SLM --llm LLM --questions val.jsonl --target-rate 0.3
    pyrodash calibrate --slm SLM --llm LLM --benchmark world:val --path worlds/w --budget-usd 0.001 --json

    pyrodash calibrate --slm POLICY --llm LLM --benchmark world:multiturn6_val --path W --range --out range.json

`--range`: the range rule's max_turns from validation conversations (the policy and the LLM alone answer every
turn after its gold history; the last turn up to which the policy keeps >= --min-ratio of the LLM's accuracy and
at least its accuracy per dollar), written with the per-turn table to `--out` (docs/conversations.md).
Questions: `--questions FILE` (JSONL with a "question" field, or plain text, one question per line) or
`--benchmark NAME [--path P]` (pyrodash.data.benchmarks.load_benchmark). Prints the bias, the LLM-call rate (and
mean $ per question in budget mode) and every evaluated point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyrodash.backends import load_llm, load_slm
from pyrodash.backends.http.endpoint import add_llm_mode_argument
from pyrodash.cost import Prices
from pyrodash.data.benchmarks import load_benchmark
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.calibrate import calibrate_offload_bias
from pyrodash.eval.long import range_calibration
from pyrodash.prompts import get_prompts
from pyrodash.world.multiturn import ensure_long_split


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slm", required=True, help="SLM backend: model path / hub id or http(s)://host:port/v1#model")
    p.add_argument("--llm", required=True, help="LLM backend (used in --budget-usd mode)")
    add_llm_mode_argument(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--questions", help="JSONL with a 'question' field, or one question per line")
    src.add_argument("--benchmark", help="a benchmark name, e.g. world:val or gsm8k")
    p.add_argument("--path", default=None, help="benchmark file or world directory (with --benchmark)")
    p.add_argument("--limit", type=int, default=None, help="use at most this many questions")
    goal = p.add_mutually_exclusive_group(required=True)
    goal.add_argument("--target-rate", type=float, help="LLM calls per question, 0..1")
    goal.add_argument("--budget-usd", type=float, help="mean $ per question")
    goal.add_argument("--range", action="store_true", help="the range rule's max_turns, on conversation turns")
    p.add_argument("--min-ratio", type=float, default=0.9, help="with --range: share of the LLM's accuracy kept")
    p.add_argument("--out", default=None, help="with --range: write the calibration (JSON) here")
    p.add_argument("--prompts", default="qwen-math-v1", help="prompt set, e.g. world-v1")
    p.add_argument("--prices", default="paper", help="price sheet: a YAML path or a name in configs/prices/")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--lo", type=float, default=-20.0, help="lowest bias searched")
    p.add_argument("--hi", type=float, default=20.0, help="highest bias searched")
    p.add_argument("--iters", type=int, default=12, help="bisection steps")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_questions(path: str, limit: int | None = None) -> list[str]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"questions file {path} does not exist")
    out: list[str] = []
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            row = json.loads(line)
            if "question" not in row:
                raise ValueError(f"{path}:{i + 1}: a JSONL row needs a 'question' field")
            out.append(str(row["question"]))
        else:
            out.append(line)
    if not out:
        raise ValueError(f"{path} holds no questions")
    return out[:limit] if limit else out


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    if args.range:
        return run_range(args)
    if args.questions:
        questions = read_questions(args.questions, args.limit)
    else:
        questions = [ex.question for ex in load_benchmark(args.benchmark, path=args.path, limit=args.limit)]
    hf_logging.disable_progress_bar()  # no "Loading weights" bars around the answer
    slm = load_slm(args.slm)
    llm = slm if args.llm == args.slm and args.llm_mode is None else load_llm(args.llm, args.llm_mode)
    engine = CollaborateEngine(
        slm, llm, get_prompts(args.prompts), Prices.from_yaml(args.prices), max_tokens=args.max_tokens
    )
    cal = calibrate_offload_bias(
        engine,
        questions,
        target_rate=args.target_rate,
        budget_usd=args.budget_usd,
        lo=args.lo,
        hi=args.hi,
        iters=args.iters,
        concurrency=args.concurrency,
    )
    if args.json:
        print(json.dumps({**cal.to_dict(), "questions": len(questions)}))
        return 0
    for pt in cal.trace:
        cost = "" if pt["cost_usd"] is None else f"  ${pt['cost_usd']:.6f}/question"
        print(f"bias {pt['bias']:+9.4f}  LLM-call rate {pt['rate']:.3f}{cost}")
    cost = "" if cal.cost_usd is None else f", ${cal.cost_usd:.6f}/question"
    note = "" if cal.met else "  (target not reached in [--lo, --hi])"
    print(f"offload_bias={cal.bias:.4f} (rate {cal.rate:.3f}{cost}, {cal.target}, {len(questions)} questions){note}")
    return 0


def run_range(args: argparse.Namespace) -> int:
    """`--range`: measure the policy and the LLM per turn of a conversation benchmark and pick max_turns."""
    from transformers.utils import logging as hf_logging

    if not args.benchmark or args.out is None and not args.json:
        raise ValueError("--range needs --benchmark (a conversation split, e.g. world:multiturn6_val) and --out FILE")
    if args.benchmark.startswith("world:") and args.path:
        ensure_long_split(args.path, args.benchmark.split(":", 1)[1])
    exs = load_benchmark(args.benchmark, path=args.path, limit=args.limit)
    prompts = get_prompts(args.prompts)
    hf_logging.disable_progress_bar()
    slm = load_slm(args.slm)
    llm = load_llm(args.llm, args.llm_mode)
    engine = CollaborateEngine(slm, llm, prompts, Prices.from_yaml(args.prices), max_tokens=args.max_tokens)
    cal = range_calibration(
        engine, exs, prompts, min_ratio=args.min_ratio, batch_size=args.concurrency * 8, concurrency=args.concurrency
    )
    out = {**cal, "benchmark": args.benchmark, "policy": str(args.slm), "llm": str(args.llm)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
        return 0
    for r in cal["by_turn"]:
        if r["within"] is None:  # past the first turn out of range: neither model answers there
            print(f"turn {r['turn']}  n {r['n']:4d}  not measured (past the range)")
            continue
        llm = f"LLM {r['llm_acc']:6.1%} ${r['llm_cost_usd']:.6f}"
        print(
            f"turn {r['turn']}  n {r['n']:4d}  policy {r['policy_acc']:6.1%} ${r['policy_cost_usd']:.6f}  {llm}  "
            f"SLM prompt ~{r['slm_prompt_tokens']['mean']:.0f} tokens  {'within' if r['within'] else 'PAST'}"
        )
    print(f"range_rule max_turns={cal['max_turns']} ({len(exs)} turns of {args.benchmark}, min ratio {args.min_ratio})")
    return 0
