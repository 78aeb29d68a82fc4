"""`python -m pyrodash ...` runs the `pyrodash` command (also what `accelerate launch -m pyrodash ...` needs)."""

import sys

from pyrodash.cli import main

sys.exit(main())
