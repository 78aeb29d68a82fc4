"""`pyrodash eval --config CFG [--run-dir DIR] [--limit N]`: methods x benchmarks into RUN_DIR/records/*.jsonl
(resumable: re-run the same command after an interruption), then the summary table from the stored records.

    pyrodash eval --config configs/eval/world-quick.yaml
    pyrodash eval --config RUN/config.resolved.json --dry-run    # a run's own resolved config, checked
    pyrodash eval --config CFG --llm https://api.openai.com/v1#gpt-5-mini   # the config's LLM replaced
    pyrodash eval --config CFG --val-share 0.2    # 20% of the conversations to RUN/val (`pyrodash select RUN`)
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pyrodash.backends.http.endpoint import add_llm_arguments
from pyrodash.eval.build import method_specs
from pyrodash.eval.carve import carve_val, conversation_key, val_methods
from pyrodash.eval.harness import EvalConfig, check_compatible, evaluate, load_examples
from pyrodash.jobs.library_log import library_log
from pyrodash.report.console import print_table2
from pyrodash.report.platform import record_platform
from pyrodash.report.render import write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="eval YAML (see configs/eval/)")
    p.add_argument("--run-dir", default=None, help="override run_dir of the config")
    p.add_argument("--limit", type=int, default=None, help="override limit (examples per benchmark)")
    add_llm_arguments(p)
    p.add_argument(
        "--val-share",
        type=float,
        default=None,
        help="carve this share of your benchmarks' conversations (seeded, whole conversations) into RUN/val, "
        "evaluated with the PyroDash points and the LLM, to pick an operating point on (`pyrodash select RUN`); "
        "the report's figures come from the rest",
    )
    p.add_argument("--val-seed", type=int, default=0, help="the seed of --val-share's carve (default 0)")
    p.add_argument("--no-report", action="store_true", help="do not write report.md / summary.json afterwards")
    p.add_argument(
        "--dry-run", action="store_true", help="check the config, models, prices and benchmarks; print the plan"
    )


def warn_llm_failures(run_dir, console) -> int:
    """A loud warning per method whose records hold failed LLM calls, fallbacks or estimated usage; returns how many
    records had a failed LLM call."""
    import json
    from pathlib import Path

    from rich.markup import escape

    bad = 0
    for path in sorted((Path(run_dir) / "records").glob("*.jsonl")):
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        failed = [r for r in recs if r.get("llm_errors") or r.get("llm_failed")]
        fallbacks = sum(1 for r in recs if r.get("fallback"))
        est = sum(1 for r in recs if r.get("usage_estimated"))
        bad += len(failed)
        if failed or fallbacks:
            first = next((r.get("llm_errors") or [r.get("llm_error", "")] for r in failed), [""])[-1]
            console.print(
                f"[bold red]WARNING: {path.stem}: {len(failed)} of {len(recs)} records had a failed LLM "
                f"call, {fallbacks} fell back to the SLM; accuracy and cost do not measure the LLM you "
                f"configured. First error: {escape(str(first))}[/]",
                markup=True,
                highlight=False,
            )
        if est:
            console.print(
                f"[yellow]{path.stem}: {est} records have token counts the server did not report "
                "(counted locally or estimated: usage_estimated)[/]"
            )
    return bad


def dry_run(cfg: EvalConfig, console) -> int:
    """What `evaluate(cfg)` checks before it answers anything (model paths, prices, the records already in run_dir,
    every benchmark's examples), and the plan; loads no model and writes nothing."""
    import json

    cfg.check_models()
    prices = cfg.price_sheet()
    check_compatible(Path(cfg.run_dir), cfg)
    console.print(f"run_dir: {cfg.run_dir}", highlight=False)
    console.print(f"llm: {cfg.models.get('llm')}", highlight=False, markup=False)
    for b in cfg.benchmarks:
        console.print(f"  {b}: {len(load_examples(cfg, b, cfg.limit))} examples", highlight=False)
    console.print("methods:")
    for name, opts in method_specs(cfg.methods):
        line = f"  {name} {json.dumps(opts) if opts else ''}".rstrip()
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"prices: {prices}", highlight=False, soft_wrap=True)
    console.print("config OK (dry run: no model loaded, nothing written)")
    return 0


def carve_and_evaluate(cfg: EvalConfig, args: argparse.Namespace, console) -> Path:
    """`--val-share`: the benchmarks' examples carved (`pyrodash.eval.carve`) into RUN/val, evaluated there with the
    PyroDash points and the LLM (the carve in RUN/val/carve.json), and the rest in RUN; says so. RUN."""
    import json

    if any(b.startswith("world:") for b in cfg.benchmarks):
        raise ValueError(
            "--val-share carves val from your own benchmarks; the built-in world has its own (world:val): evaluate "
            "it with run_dir=RUN/val, as `pyrodash demo` does"
        )
    examples = [ex for b in cfg.benchmarks for ex in load_examples(cfg, b, cfg.limit)]
    val, rest = carve_val(examples, args.val_share, args.val_seed)
    vcfg = replace(cfg, run_dir=str(Path(cfg.run_dir) / "val"), methods=val_methods(cfg.methods))
    if not any(method_specs([m])[0][0] != "llm" for m in vcfg.methods):
        raise ValueError("--val-share: the config evaluates no PyroDash point to pick from; add pyrodash to methods")
    convs = len({conversation_key(ex) for ex in val})
    console.print(
        f"val: {len(val)} of {len(examples)} examples ({convs} conversations, seed {args.val_seed}) carved into "
        f"{vcfg.run_dir} for `pyrodash select {cfg.run_dir}`; the report's figures come from the other {len(rest)}",
        highlight=False,
    )
    evaluate(vcfg, examples=val)
    carve = {"share": args.val_share, "seed": args.val_seed, "val": len(val), "rest": len(rest), "conversations": convs}
    (Path(vcfg.run_dir) / "carve.json").write_text(json.dumps(carve | {"benchmarks": cfg.benchmarks}, indent=2) + "\n")
    return evaluate(cfg, examples=rest)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    cfg = EvalConfig.from_yaml(args.config, run_dir=args.run_dir, limit=args.limit, llm_mode=args.llm_mode)
    if args.llm is not None:  # the LLM of every method that calls one (llm, oracle, the routers, PyroDash)
        cfg = replace(cfg, models={**cfg.models, "llm": args.llm})
    if args.dry_run:
        return dry_run(cfg, Console())
    log = Path(cfg.run_dir) / "eval.log"
    with library_log(log, lazy=True):
        run_dir = evaluate(cfg) if args.val_share is None else carve_and_evaluate(cfg, args, Console())
    record_platform(run_dir)  # what the report names as the platform of the run's numbers
    console = Console()
    console.print(f"records: [bold]{run_dir / 'records'}[/]" + (f" (library logs in {log})" if log.exists() else ""))
    warn_llm_failures(run_dir, console)
    if not args.no_report:
        path = write_report(run_dir)
        print_table2(run_dir, console)
        console.print(f"report: [bold]{path}[/]")
    return 0
