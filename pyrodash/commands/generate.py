"""`pyrodash generate`: answer one question with the Collaborate Engine (Algorithm 1), streaming.

    pyrodash generate --slm worlds/w/slm --llm http://127.0.0.1:8001/v1#llm --offload-bias 2 "What is 17*23?"
    pyrodash generate --slm SLM --llm LLM --json "question"     # one JSON object: output, usage, cost_usd, handoff

SLM text is shown in cyan, LLM text in magenta, then token usage and dollars. A backend is a model path / hub id
(in-process transformers) or an OpenAI-compatible URL `http(s)://host:port/v1#model`.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("question", help="the question ('-' reads it from stdin)")
    p.add_argument("--slm", required=True, help="SLM backend: model path / hub id or http(s)://host:port/v1#model")
    p.add_argument("--llm", required=True, help="LLM backend: model path / hub id or http(s)://host:port/v1#model")
    from pyrodash.backends.endpoint import add_llm_mode_argument

    add_llm_mode_argument(p)
    p.add_argument("--offload-bias", type=float, default=0.0, help="added to the <offload> logit (+ hands off sooner)")
    p.add_argument("--handoff-style", choices=("continue", "instruct"), default="continue")
    p.add_argument("--prompts", default="qwen-math-v1", help="prompt set (pyrodash.prompts), e.g. world-v1")
    p.add_argument("--prices", default="paper", help="price sheet: a YAML path or a name in configs/prices/")
    p.add_argument("--max-tokens", type=int, default=512, help="decode budget of each model")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--on-error", choices=("fallback", "raise"), default="fallback", help="after LLM retries fail")
    p.add_argument("--retries", type=int, default=2, help="LLM retries after a failed call")
    p.add_argument("--timeout-s", type=float, default=60.0, help="longest wait for the LLM's next chunk")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the coloured stream")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from transformers.utils import logging as hf_logging

    from pyrodash.backends.endpoint import load_llm, load_slm
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine, EngineError, FailurePolicy
    from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
    from pyrodash.prompts import get_prompts

    question = sys.stdin.read() if args.question == "-" else args.question
    if not question.strip():
        raise ValueError("the question is empty")
    prices = Prices.from_yaml(args.prices)
    prompts = get_prompts(args.prompts)
    failure = FailurePolicy(retries=args.retries, timeout_s=args.timeout_s, on_error=args.on_error)
    hf_logging.disable_progress_bar()  # no "Loading weights" bars around the answer
    slm = load_slm(args.slm)
    llm = slm if args.llm == args.slm and args.llm_mode is None else load_llm(args.llm, args.llm_mode)
    engine = CollaborateEngine(slm, llm, prompts, prices, handoff_style=args.handoff_style,
                               offload_bias=args.offload_bias, max_tokens=args.max_tokens, failure=failure)
    kw = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}

    async def main() -> Done:
        if args.json:
            try:
                return await engine.arun(question, **kw)
            finally:
                await engine.aclose()
        from rich.console import Console

        out = Console(highlight=False, soft_wrap=True)
        rep = getattr(llm, "report", None)
        if rep is not None and rep.mode:
            out.print(f"[LLM {llm.name}: continuation mode {rep.mode}]", style="dim", markup=False)
        done = None
        try:
            async for ev in engine.stream(question, **kw):
                if isinstance(ev, SLMDelta):
                    out.print(ev.text, style="cyan", end="", markup=False)
                elif isinstance(ev, Handoff):
                    out.print(f" ⟶ LLM (after {ev.slm_tokens} SLM tokens) ", style="bold yellow", end="")
                elif isinstance(ev, LLMDelta):
                    out.print(ev.text, style="magenta", end="", markup=False)
                elif isinstance(ev, Done):
                    done = ev
        finally:
            await engine.aclose()
        u = done.usage
        out.print()
        if done.fallback:
            out.print(f"[LLM failed, the SLM finished the answer: {done.errors[-1]}]", style="red", markup=False)
        elif done.errors:
            out.print(f"[LLM retried after: {'; '.join(done.errors)}]", style="yellow", markup=False)
        if done.usage_estimated:
            out.print("[some token counts were not reported by a server: counted locally or estimated]",
                      style="yellow", markup=False)
        handoff = "no handoff" if done.handoff is None else f"handoff after {done.handoff} SLM tokens"
        out.print(f"{handoff} · SLM in/out {u.slm_in}/{u.slm_out} · LLM in/out {u.llm_in}/{u.llm_out} "
                  f"(cached {u.llm_cached_in}, calls {u.llm_calls}) · ${done.cost_usd:.6f} · {done.finish_reason}",
                  style="dim", markup=False)
        return done

    try:
        done = asyncio.run(main())
    except EngineError as e:
        if args.json:
            print(json.dumps({**e.done.to_dict(), "error": str(e)}))
        print(f"pyrodash generate: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(done.to_dict()))
    return 0
