"""The suite's background builds (tests/conftest.py `Background`) run once per session however many pytest-xdist
workers read them: the first process to ask starts the build, any other attaches and waits on its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import Background

ROOT = Path(__file__).resolve().parent.parent
# a build that says it ran (one line a run) and takes a moment
CODE = "import sys, time\nopen(sys.argv[1] + '.ran', 'a').write('ran\\n')\ntime.sleep(1)"


def test_a_second_process_attaches_to_a_running_build_and_reads_its_exit(tmp_path):
    owner = Background(tmp_path, "b", CODE, "out")
    other = Background(tmp_path, "b", CODE, "out")  # as the other worker does (same builds directory and name)
    assert owner.proc is not None and other.proc is None and other.running()
    assert other.finish() == 0 and not other.running()
    assert owner.finish() == 0 and owner.reaped_cpu() == owner.usage()["cpu_s"] and other.reaped_cpu() == 0.0
    assert (tmp_path / "b" / "out.ran").read_text() == "ran\n"  # it ran once
    assert other.usage()["code"] == 0 and other.stop()["code"] == 0


def test_a_build_killed_at_the_end_reads_as_killed_to_every_process(tmp_path):
    owner = Background(tmp_path, "b", "import time\ntime.sleep(60)", "out")
    other = Background(tmp_path, "b", "", "out")
    assert other.running()
    assert other.stop() is None  # the session's main process, which does not own it, kills it
    assert owner.finish() != 0 and not owner.running() and other.finish() == -9


def test_two_workers_report_every_test_to_the_profile(tmp_path):
    """`pytest -n 2` with PYRODASH_SUITE_PROFILE: the controller writes both workers' tests."""
    out = tmp_path / "suite.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests/test_tokens.py"]
    run = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYRODASH_SUITE_PROFILE": str(out)}
    )
    assert run.returncode == 0, run.stdout[-2000:]
    tests = json.loads(out.read_text())["tests"]
    passed = int(run.stdout.split(" passed")[0].split()[-1])
    assert len(tests) == passed > 1 and all(t["test"].startswith("tests/test_tokens.py::") for t in tests)


GROUPED = """
import os
import pytest

@pytest.fixture(scope="module")
def shared():
    return os.getpid()

@pytest.mark.parametrize("i", range(6))
def test_shares(shared, i):
    with open(os.environ["RAN"], "a") as f:
        f.write(f"shares {os.getpid()} {shared}\\n")

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    with open(os.environ["RAN"], "a") as f:
        f.write(f"alone {os.getpid()} -\\n")
"""


def _two_workers(tmp_path, name: str, source: str) -> list[list[str]]:
    """Run the test module `source` (as `name`) under `-n 2` with the suite's settings (pyproject.toml) and its
    conftest; the lines its tests wrote to $RAN, split into fields."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / name).write_text(source)
    ran = tmp_path / "ran.txt"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
    run = subprocess.run(
        [*cmd, "-n", "2", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RAN": str(ran)}
    )
    assert run.returncode == 0, run.stdout[-2000:]
    return [line.split() for line in ran.read_text().splitlines()]


def test_tests_sharing_a_module_fixture_run_on_one_worker_which_sets_it_up_once(tmp_path):
    """Under `-n 2` (the suite's settings from pyproject.toml, its conftest): the six tests of a module that share a
    module fixture run in one worker, which made the fixture once."""
    rows = _two_workers(tmp_path, "test_grouped.py", GROUPED)
    shares = {(pid, made) for kind, pid, made in rows if kind == "shares"}
    assert len(rows) == 12 and len(shares) == 1, rows
    ((pid, made),) = shares
    assert pid == made  # the fixture was made by the worker that ran them all


def test_a_build_yields_to_the_tests_nice_19_and_its_session_group_too(tmp_path):
    """A build at nice 19 in a session of its own: where the kernel schedules by autogroup, the new session is its own
    group, which shares the CPU evenly with the tests' unless the group's nice is 19 as well."""
    code = (
        "import os, sys\ngroup = open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup') else ''"
        "\nopen(sys.argv[1], 'w').write(f'{os.nice(0)}|{group}')"
    )
    bg = Background(tmp_path, "b", code, "out.txt")
    assert bg.wait().is_file()
    nice, group = bg.out.read_text().split("|")
    assert nice == "19"
    if group:  # (e.g. "/autogroup-75 nice 19")
        assert group.split()[-1] == "19", group


EXCLUSIVE = """
import os, time
import pytest

def _ran(kind):
    t0 = time.time()
    time.sleep(1.0 if kind == "exclusive" else 0.3)
    with open(os.environ["RAN"], "a") as f:
        f.write(f"{kind} {t0} {time.time()}\\n")

@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    _ran("shared")

@pytest.mark.exclusive
def test_alone():
    _ran("exclusive")

@pytest.mark.parametrize("i", range(6))
def test_shared_after(i):
    _ran("shared")
"""


def test_an_exclusive_test_runs_with_no_other_test_body_beside_it(tmp_path):
    """Under `-n 2`: while the `exclusive` test's body runs, no other test's body runs on the other worker (without
    the lock, the other worker's short tests would run through its second)."""
    rows = [(kind, float(a), float(b)) for kind, a, b in _two_workers(tmp_path, "test_exclusive.py", EXCLUSIVE)]
    ((_, start, end),) = [r for r in rows if r[0] == "exclusive"]
    shared = [(a, b) for kind, a, b in rows if kind == "shared"]
    assert len(shared) == 12 and not [(a, b) for a, b in shared if a < end and b > start], rows
