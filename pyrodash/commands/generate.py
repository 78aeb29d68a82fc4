"""`pyrodash generate`: answer one question with the Collaborate Engine (Algorithm 1), streaming.

    pyrodash generate --slm worlds/w/slm --llm http://127.0.0.1:8001/v1#llm --offload-bias 2 "What is 17*23?"
    pyrodash generate --slm SLM --llm LLM --json "question"     # the answer's record (pyrodash.record), one line
    pyrodash generate --slm SLM --llm LLM --max-llm-calls 4 "question"   # relay: the LLM writes one step per handoff

SLM text is shown in cyan, LLM text in magenta, then token usage and dollars. A backend is a model path / hub id
(in-process transformers) or an OpenAI-compatible URL `http(s)://host:port/v1#model`. Conversations (`--history`,
`--turn`, `--save-history`) and an LLM mesh (a repeated `--llm`): docs/internals.md; relay: docs/relay.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from pyrodash.backends import load_llm, load_slm
from pyrodash.backends.hf.chat_template import add_chat_template_argument
from pyrodash.backends.http.endpoint import add_llm_mode_argument
from pyrodash.backends.loader import with_chat_template
from pyrodash.backends.mesh import spec_from_flags
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, EngineError, FailurePolicy
from pyrodash.engine.relay import RelayConfig, check_calls
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import get_prompts
from pyrodash.record import Record


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("question", help="the question ('-' reads it from stdin)")
    p.add_argument("--slm", required=True, help="SLM backend: model path / hub id or http(s)://host:port/v1#model")
    p.add_argument(
        "--llm",
        required=True,
        action="append",
        help="LLM backend: model path / hub id or http(s)://host:port/v1#model; repeat it for an LLM mesh",
    )
    p.add_argument("--llm-policy", choices=("fallback", "cheapest"), help="mesh policy (default: fallback, in order)")
    p.add_argument(
        "--llm-prices",
        action="append",
        metavar="SHEET",
        help="price sheet of the i-th --llm (repeatable; YAML, name, or LiteLLM FILE.json#MODEL)",
    )
    p.add_argument("--llm-cooldown", type=float, metavar="S", help="seconds a failed mesh endpoint sits out (30)")
    p.add_argument("--llm-timeout", type=float, metavar="S", help="mesh: longest wait for an endpoint's next chunk")
    p.add_argument("--history", metavar="FILE.json", help="earlier messages of the conversation (OpenAI format)")
    p.add_argument(
        "--turn",
        action="append",
        default=[],
        metavar="TEXT",
        help="a follow-up user turn after the question (repeatable, asked in order)",
    )
    p.add_argument("--save-history", metavar="FILE.json", help="write the whole conversation here afterwards")
    add_llm_mode_argument(p)
    p.add_argument("--offload-bias", type=float, default=0.0, help="added to the <offload> logit (+ hands off sooner)")
    p.add_argument(
        "--handoff-share",
        type=float,
        default=1.0,
        help="share of requests that may hand off, by a fixed hash of each request (others: the SLM alone)",
    )
    p.add_argument("--handoff-style", choices=("continue", "instruct"), default="continue")
    add_relay_arguments(p)
    add_chat_template_argument(p)
    p.add_argument("--prompts", default="qwen-math-v1", help="prompt set (pyrodash.prompts), e.g. world-v1")
    p.add_argument("--prices", default="paper", help="price sheet: a YAML path or a name in configs/prices/")
    p.add_argument("--max-tokens", type=int, default=512, help="decode budget of each model")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--on-error", choices=("fallback", "raise"), default="fallback", help="after LLM retries fail")
    p.add_argument("--retries", type=int, default=2, help="LLM retries after a failed call")
    p.add_argument("--timeout-s", type=float, default=60.0, help="longest wait for the LLM's next chunk")
    p.add_argument(
        "--json",
        action="store_true",
        help="print each answer's record (pyrodash.record) instead of the coloured stream",
    )


def add_relay_arguments(p: argparse.ArgumentParser) -> None:
    """Relay's flags (docs/relay.md): `--max-llm-calls`, `--step-sep`, `--step-max-tokens`."""
    p.add_argument(
        "--max-llm-calls",
        default="1",
        metavar="N",
        help="LLM calls per answer: above 1 the LLM writes one step per handoff and the SLM resumes (relay, "
        "docs/relay.md); 1 (the default) is the single handoff",
    )
    p.add_argument(
        "--step-sep",
        default=RelayConfig.step_sep,
        metavar="TEXT",
        help="relay: the end of a step, sent as the LLM's stop sequence (default: a blank line; \\n and \\t are "
        "read as newline and tab)",
    )
    p.add_argument(
        "--step-max-tokens",
        type=int,
        default=RelayConfig.step_max_tokens,
        metavar="N",
        help="relay: the cap of one LLM step",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    question = sys.stdin.read() if args.question == "-" else args.question
    if not question.strip():
        raise ValueError("the question is empty")
    messages = read_history(args.history) if args.history else []
    if any(not t.strip() for t in args.turn):
        raise ValueError("a --turn is empty: give the follow-up text")
    prompts = get_prompts(args.prompts)
    engine, llm = build_engine(args, prompts)
    try:
        asyncio.run(converse(args, engine, llm, prompts, [question, *args.turn], messages))
    except EngineError as e:
        if args.json:
            print(json.dumps({**Record.from_done(e.done).to_json(), "error": str(e)}))
        print(f"pyrodash generate: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.save_history:
            Path(args.save_history).write_text(json.dumps(messages, indent=1, ensure_ascii=False) + "\n")
    return 0


def build_engine(args: argparse.Namespace, prompts) -> tuple[CollaborateEngine, object]:
    """The Collaborate Engine of the flags, and its LLM backend (the SLM itself when both flags name one model)."""
    from transformers.utils import logging as hf_logging

    prices, relay = Prices.load(args.prices), relay_config(args)  # a bad flag fails before any model loads
    failure = FailurePolicy(retries=args.retries, timeout_s=args.timeout_s, on_error=args.on_error)
    hf_logging.disable_progress_bar()  # no "Loading weights" bars around the answer
    slm = load_slm(with_chat_template(args.slm, args.chat_template))
    spec = spec_from_flags(args.llm, args.llm_prices, args.llm_policy, args.llm_cooldown, args.llm_timeout)
    llm = slm if spec == args.slm and args.llm_mode is None else load_llm(spec, args.llm_mode)
    engine = CollaborateEngine(
        slm,
        llm,
        prompts,
        prices,
        handoff_style=args.handoff_style,
        offload_bias=args.offload_bias,
        max_tokens=args.max_tokens,
        failure=failure,
        handoff_share=args.handoff_share,
        relay=relay,
    )
    return engine, llm


def relay_config(args: argparse.Namespace) -> RelayConfig:
    """The relay of `--max-llm-calls`, `--step-sep` and `--step-max-tokens` (a bad value: a ValueError, one line)."""
    try:
        calls = check_calls(int(args.max_llm_calls))
    except ValueError:
        raise ValueError(
            f"--max-llm-calls {args.max_llm_calls!r}: give a positive integer (1: a single handoff; above 1: relay)"
        ) from None
    try:
        sep = args.step_sep.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        raise ValueError(f"--step-sep {args.step_sep!r}: a bad backslash escape (write \\\\ for a backslash)") from None
    return RelayConfig(max_llm_calls=calls, step_sep=sep, step_max_tokens=args.step_max_tokens)


async def converse(args: argparse.Namespace, engine, llm, prompts, turns: list[str], messages: list[dict]) -> None:
    """Ask each turn in order (after `messages`, which grows by each question and answer); `--json` prints each
    answer's record, otherwise its coloured stream and summary."""
    kw = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    conversation = bool(messages or len(turns) > 1)
    try:
        for i, text in enumerate(turns):
            prompt = text
            if conversation:
                messages.append({"role": "user", "content": prompts.question(text)})
                prompt = list(messages)
            if args.json:
                done = await engine.arun(prompt, **kw)
                print(json.dumps(Record.from_done(done).to_json()), flush=True)
            else:
                out = Console(highlight=False, soft_wrap=True)
                rep = getattr(llm, "report", None)
                if rep is not None and rep.mode and i == 0:
                    out.print(f"[LLM {llm.name}: continuation mode {rep.mode}]", style="dim", markup=False)
                if conversation:
                    out.print(f"[turn {sum(m['role'] == 'user' for m in prompt)}] {text}", style="bold", markup=False)
                done = await stream_answer(out, engine, prompt, kw)
                print_summary(out, done, args.handoff_share)
            messages.append({"role": "assistant", "content": done.output})
    finally:
        await engine.aclose()


async def stream_answer(out: Console, engine, prompt, kw: dict) -> Done:
    """The engine's answer, printed as it streams: SLM text in cyan, the handoff, LLM text in magenta."""
    done = None
    async for ev in engine.stream(prompt, **kw):
        if isinstance(ev, SLMDelta):
            out.print(ev.text, style="cyan", end="", markup=False)
        elif isinstance(ev, Handoff):
            out.print(f" ⟶ LLM (after {ev.slm_tokens} SLM tokens) ", style="bold yellow", end="")
        elif isinstance(ev, LLMDelta):
            out.print(ev.text, style="magenta", end="", markup=False)
        elif isinstance(ev, Done):
            done = ev
    out.print()
    return done


def print_summary(out: Console, done: Done, handoff_share: float) -> None:
    """What happened to an answer: failures and estimates, the handoff, tokens and dollars, per endpoint."""
    u = done.usage
    if done.fallback:
        out.print(f"[LLM failed, the SLM finished the answer: {done.errors[-1]}]", style="red", markup=False)
    elif done.errors:
        out.print(f"[LLM retried after: {'; '.join(done.errors)}]", style="yellow", markup=False)
    if done.usage_estimated:
        note = "[some token counts were not reported by a server: counted locally or estimated]"
        out.print(note, style="yellow", markup=False)
    if not done.handoff_admitted:
        note = f"[outside --handoff-share {handoff_share:g}: <offload> was banned, the SLM answered alone]"
        out.print(note, style="yellow", markup=False)
    handoff = "no handoff" if done.handoff is None else f"handoff after {done.handoff} SLM tokens"
    if len(done.handoffs) > 1:
        handoff = f"{len(done.handoffs)} handoffs after {', '.join(map(str, done.handoffs))} SLM tokens"
    if done.relay_fallback:
        note = f"[relay fell back to a single handoff: {done.relay_fallback} (docs/relay.md)]"
        out.print(note, style="yellow", markup=False)
    out.print(
        f"{handoff} · SLM in/out {u.slm_in}/{u.slm_out} · LLM in/out {u.llm_in}/{u.llm_out} "
        f"(cached {u.llm_cached_in}, calls {u.llm_calls}) · ${done.cost_usd:.6f} · {done.finish_reason}",
        style="dim",
        markup=False,
    )
    if len(done.llm_endpoints) > 1 or any(e["errors"] for e in done.llm_endpoints):
        for e in done.llm_endpoints:
            out.print(
                f"  {e['endpoint']}: calls {e['calls']} (failed {e['errors']}) · in/out {e['llm_in']}/"
                f"{e['llm_out']} · {e['chars']} chars · ${e['cost_usd']:.6f}",
                style="dim",
                markup=False,
            )
    if any(done.trimmed.values()):
        note = f"  history trimmed to fit the context windows: {done.trimmed} messages dropped"
        out.print(note, style="yellow", markup=False)


def read_history(path: str) -> list[dict]:
    """Earlier messages from a JSON file: a list of {"role", "content"} (OpenAI chat format)."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--history {path}: no such file (a JSON list of {{role, content}} messages)")
    try:
        msgs = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"--history {path} is not JSON ({e}): give a list of {{role, content}} messages") from e
    ok = isinstance(msgs, list) and all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
        for m in msgs
    )
    if not ok:
        raise ValueError(f"--history {path}: expected a JSON list of {{role: system|user|assistant, content: str}}")
    return msgs
