"""Build the world of a seed from scratch and ship its two models with PyroDash (`pyrodash.world.shipped`).

    python scripts/ship_world.py [--seed 0] [--out DIR]

Run it after any change to what a world build trains (`WorldConfig`'s model fields, `BUILD_RECIPE`):
`tests/test_world.py` fails while the shipped models' models hash is not the quick preset's. The build goes to DIR
(default: a fresh temporary directory), pretrains both models (`--from-scratch`; ~3 minutes on 2 cores), and its
`slm/`, `llm/` and world.json are copied to `pyrodash/world/checkpoints/seed<N>/`.
"""

from __future__ import annotations

import argparse
import tempfile

from pyrodash.world.build import build_world
from pyrodash.world.shipped import ship


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="where to build (default: a temporary directory)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="pyrodash-ship-")
    world = build_world(out, quick=True, seed=args.seed, from_scratch=True)
    print(f"shipped: {ship(world)}")


if __name__ == "__main__":
    main()
