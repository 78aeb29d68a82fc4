"""Long conversations: the range rule calibrated on the world's six-turn validation conversations, then the six-turn
test conversations (gold and own history) evaluated with it. The quick demo runs `calibrate_long` and `evaluate_long`
as steps beside its evaluation; `pyrodash calibrate --range` runs `range_calibration` alone. Why and how:
docs/conversations.md."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pyrodash.engine.calibrate import calibrate_range
from pyrodash.engine.conversation import example_messages
from pyrodash.eval.build import Backends, run_answers
from pyrodash.eval.harness import EvalConfig, evaluate, load_examples
from pyrodash.eval.methods import Env
from pyrodash.eval.names import method_name
from pyrodash.grading import grade_batch
from pyrodash.prompts import get_prompts

VALIDATION = "world:multiturn6_val"  # calibrates the rule
TEST = ["world:multiturn6", "world:multiturn6-self"]  # evaluated with it
# the methods the six-turn test conversations measure: the policy under the rule against the LLM alone, whose answers
# the rule routes to. The SLM alone is left out: the rule never uses its answers, the three-turn conversations
# (world:multiturn, -self) already show it losing the thread, and on six turns it was 0-3% right from the fourth turn
# on at 40% of this step's one-thread seconds (quick world seed 0). `pyrodash eval` evaluates it there when asked.
BASELINES = ("llm",)
CALIBRATION_FILE = "range_calibration.json"  # in the run dir: the report's range section and range.png read it


def range_calibration(engine, examples: list, prompts, min_ratio: float = 0.9, **batch) -> dict:
    """`calibrate_range` over conversation-turn examples (gold history in `meta.history`) as a JSON-ready dict."""
    if not examples or not all("turn" in (ex.meta or {}) for ex in examples):
        raise ValueError("the range rule is calibrated on conversation turns (examples with meta.turn)")
    cal = calibrate_range(
        engine,
        [example_messages(prompts, ex.question, ex.meta.get("history")) for ex in examples],
        [ex.gold for ex in examples],
        [int(ex.meta["turn"]) for ex in examples],
        lambda outs, golds: grade_batch(outs, golds, workers=0),
        min_ratio=min_ratio,
        **batch,
    )
    return cal.to_dict()


def _calibration_env(cfg: EvalConfig) -> tuple[Env, Backends]:
    """The evaluation environment and the models (with the run's answer store) the range calibration runs in."""
    prompts, be = get_prompts(cfg.prompts), Backends(run_answers(cfg))
    env = Env(
        prompts, cfg.price_sheet(), max_tokens=cfg.max_tokens, batch_size=cfg.batch_size, concurrency=cfg.concurrency
    )
    return env, be


def calibrate_long(cfg: EvalConfig, lam: float) -> dict:
    """Calibrate the range rule for the λ policy on `VALIDATION`, written to RUN_DIR/range_calibration.json (no
    records: it can run beside any evaluation). The LLM's answers come from the run's answer store where
    `llm_validation_answers` put them first."""
    env, be = _calibration_env(cfg)
    policy = be.get(policy_spec(cfg, lam), offload=True)
    engine = env.engine(policy, be.get(cfg.models["llm"], llm=True, mode=cfg.llm_mode))
    out = range_calibration(
        engine,
        load_examples(cfg, VALIDATION, cfg.limit),
        env.prompts,
        batch_size=cfg.batch_size,
        concurrency=cfg.concurrency,
    )
    out.update(benchmark=VALIDATION, policy=method_name("pyrodash", lam))
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.run_dir) / CALIBRATION_FILE).write_text(json.dumps(out, indent=1) + "\n")
    return out


# the validation turns whose LLM answers the demo decodes beside training. The calibration answers turn by turn up to
# the first turn out of range and no further; on the quick world's seeds that turn is the 3rd or the 4th, so the
# LLM's answers to turns 1-4 are decoded ahead and turns 5-6 (half of the LLM's tokens read: the longest prompts)
# only if a calibration reaches them (it then decodes them itself)
LLM_TURNS_AHEAD = 4


def llm_validation_answers(cfg: EvalConfig, turns: int = LLM_TURNS_AHEAD) -> int:
    """The LLM alone on the first `turns` turns of every `VALIDATION` conversation (after its gold history), decoded
    into the run's answer store and nothing else: the half of `calibrate_long` that needs no trained policy, so the
    demo runs it beside training and the calibration reads these answers back. The number of turns decoded."""
    env, be = _calibration_env(cfg)
    llm = be.get(cfg.models["llm"], llm=True, mode=cfg.llm_mode)
    examples = [ex for ex in load_examples(cfg, VALIDATION, cfg.limit) if int(ex.meta["turn"]) <= turns]
    chats = [example_messages(env.prompts, ex.question, ex.meta.get("history")) for ex in examples]
    engine = env.engine(llm, llm, require_offload=False)  # the LLM alone: no policy, no <offload>
    engine.batch(chats, mode="llm", batch_size=cfg.batch_size, concurrency=cfg.concurrency)
    return len(chats)


def policy_spec(cfg: EvalConfig, lam: float):
    """The λ policy's checkpoint under `models.pyrodash` (an error naming it where there is none)."""
    specs = {float(k): v for k, v in (cfg.models.get("pyrodash") or {}).items()}
    if float(lam) not in specs:
        raise ValueError(f"long conversations: pyrodash λ={lam} has no checkpoint under models.pyrodash")
    return specs[float(lam)]


def evaluate_long(cfg: EvalConfig, lam: float, methods: tuple[str, ...], quiet: bool = True) -> None:
    """`TEST` for `methods` (of "slm", "llm", "pyrodash": the λ policy under the calibrated rule) and nothing else,
    so it can run beside the evaluation's other steps once they have written these methods' records. The rule binds
    PyroDash methods only, so slm and llm need no calibration (and run before it). The demo asks for `BASELINES`
    and "pyrodash"."""
    full = with_long_conversations(cfg, lam, rule="pyrodash" in methods)
    kinds = {"slm": "slm", "llm": "llm", "pyrodash": {"pyrodash": {"lambdas": [lam]}}}
    models = {k: cfg.models[k] for k in ("slm", "llm")}  # the only models it needs (the others may not exist yet)
    if "pyrodash" in methods:
        models["pyrodash"] = {lam: policy_spec(cfg, lam)}
    evaluate(replace(full, benchmarks=TEST, methods=[kinds[m] for m in methods], models=models), quiet=quiet)


def with_long_conversations(cfg: EvalConfig, lam: float, rule: bool = True) -> EvalConfig:
    """`cfg` with `TEST` added for `BASELINES` and the λ policy, under the range rule calibrated into
    RUN_DIR/range_calibration.json by `calibrate_long` (`rule`; else none)."""
    cal = json.loads((Path(cfg.run_dir) / CALIBRATION_FILE).read_text()) if rule else {"range_rule": None}
    who = [*BASELINES, method_name("pyrodash", lam).replace(".", "[.]")]
    return replace(
        cfg,
        benchmarks=list(dict.fromkeys(cfg.benchmarks + TEST)),
        benchmark_methods={**cfg.benchmark_methods, **{b: who for b in TEST}},
        range_rule=cal["range_rule"],
    )
