"""The `pyrodash` command. Each subcommand lives in `pyrodash/commands/<name>.py` and provides
`add_arguments(parser)` and `run(args) -> int`. Only the command being run is imported (its module imports what it
needs at its top), so `pyrodash --help` is fast and `pyrodash cost` never loads TRL.

Run `pyrodash --help` for the list.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from pyrodash.jobs.scheduler import StepFailed

# name -> (module, one-line help). A command is listed only once its module exists.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("pyrodash.commands.demo", "the whole pipeline on the built-in world: build, curate, train, eval, report"),
    "world": ("pyrodash.commands.world", "build the built-in world (synthetic task + two small models)"),
    "generate": ("pyrodash.commands.generate", "answer one question with the Collaborate Engine"),
    "serve": ("pyrodash.commands.serve", "OpenAI-compatible Collaborate Engine server"),
    "serve-model": ("pyrodash.commands.serve_model", "serve one local model behind an OpenAI-compatible API"),
    "calibrate": ("pyrodash.commands.calibrate", "pick the offload_bias that hits a target LLM-call rate"),
    "curate": ("pyrodash.commands.curate", "EasyHard curation: Corpus A and Corpus B"),
    "train": ("pyrodash.commands.train", "training stages 1-3 (stage1 | stage2 | stage3)"),
    "eval": ("pyrodash.commands.eval", "evaluate methods x benchmarks into per-example records"),
    "report": ("pyrodash.commands.report", "tables, Pareto figure and case studies from stored records"),
    "select": ("pyrodash.commands.select", "pick an operating point on validation data; write it to a serve config"),
    "benchmarks": ("pyrodash.commands.benchmarks", "list or load the math benchmarks"),
    "cost": ("pyrodash.commands.cost", "price token counts with a price sheet"),
    "models": ("pyrodash.commands.models", "fetch a known pretrained model (gemma3-270m) and convert it once"),
    "check": ("pyrodash.commands.check", "probe an LLM endpoint (and an SLM server): model, key, continuation mode"),
}


class CLIError(Exception):
    """A user mistake: printed as one line, exit code 2 (set PYRODASH_DEBUG=1 for the traceback)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, with `only`, of that command alone (the others listed by name and help,
    their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="pyrodash", description="PyroDash: cost-aware, token-level SLM -> LLM collaboration."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if importlib.util.find_spec(module) is None:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)  # the command: the first non-option argument
    parser = build_parser(only=first if first in COMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        if os.environ.get("PYRODASH_DEBUG"):
            raise
        print(f"pyrodash {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StepFailed as e:  # its log has the traceback; the steps done keep their outputs (a rerun resumes)
        if os.environ.get("PYRODASH_DEBUG"):
            raise
        print(
            f"pyrodash {args.command}: {e}; the steps that finished are kept: run it again to resume", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print(f"pyrodash {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
