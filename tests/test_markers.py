"""The `slow` marker follows the fixtures (tests/conftest.py `SLOW_FIXTURES`): `pytest -m "not slow"` collects no test
that needs the quick demo, the from-scratch world or Gemma, and `-m slow` collects every one of them; the tests that
read the quick demo are collected last (it builds in the background meanwhile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["tests/test_demo.py", "tests/test_scripts_smoke.py", "tests/test_world.py"]


def _collected(marks: str) -> list[str]:
    """The names of the tests `-m marks` collects from FILES, in the order they will run."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marks, *FILES]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line.split("::", 1)[1] for line in out.stdout.splitlines() if "::" in line]


def test_tests_that_need_the_demo_a_scratch_world_or_gemma_are_slow_and_only_they():
    in_order = _collected("slow")
    slow, fast = set(in_order), set(_collected("not slow"))
    assert not slow & fast
    # tests/test_world.py's from-scratch test runs before every test that reads the demo (tests/test_demo.py first)
    assert in_order[0] == "test_quick_world_from_scratch_gap_hidden_difficulty_and_the_shipped_models", in_order
    # through the fixture itself, through a module's fixture over it, and through request.getfixturevalue (demo_run)
    assert {"test_report_structure", "test_demo_profile_reads_the_demo", "test_turn_tables_reads_the_demo"} <= slow
    assert "test_quick_world_from_scratch_gap_hidden_difficulty_and_the_shipped_models" in slow
    assert {"test_every_script_has_a_smoke_test", "test_tokenizer_round_trip"} <= fast
