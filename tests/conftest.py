"""Fixtures shared by test modules: the quick demo, run once per test session, and the from-scratch quick world,
built in the background.

`quick_demo` is `pyrodash demo --quick` into a temporary directory (the world from the cache; on a fresh machine built
there from the base models that ship with PyroDash, which `tests/test_world.py` rebuilds from scratch).
tests/test_demo.py checks its report; tests/test_train.py starts from its curated corpora and its Stage 1 and Stage 2
checkpoints (the same recipe makes the same ones), so CI trains them once.

`scratch_world` is `build_world(quick=True, seed=0, from_scratch=True)` (~4.5 min of pretraining on 2 cores) started
in a process of its own at nice 19 as soon as the session knows it will need it: the suite leaves ~40% of its CPU idle
(measured, `.ci/run` on 2 cores: 2,745 CPU-s in 2,245 s of wall), servers starting and requests waiting, and the
build takes that time instead of 4.5 min of its own; at nice 19 it yields the cores to every test. The test that reads
it waits for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SCRATCH_TEST = "test_quick_world_from_scratch_gap_hidden_difficulty_and_the_shipped_models"
_SCRATCH: dict = {}  # the background build: its process, directory and log


# fixtures that train, build or fetch for minutes: a test that uses one (directly or through another fixture) is
# marked `slow` here, so `pytest -m "not slow"` leaves out exactly those (CI runs them all)
SLOW_FIXTURES = {"quick_demo", "demo_run", "scratch_world", "gemma_files"}


def pytest_collection_modifyitems(config, items):
    """Mark `slow` every test that uses a fixture of `SLOW_FIXTURES`."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """Start the from-scratch world build when a test that reads it is selected."""
    if not any(item.name == SCRATCH_TEST for item in session.items):
        return
    root = Path(tempfile.mkdtemp(prefix="pyrodash-scratch-world-"))
    code = (
        "import sys\nfrom pyrodash.world.build import build_world\n"
        "build_world(sys.argv[1], quick=True, seed=0, verbose=False, from_scratch=True)"
    )
    cmd = [sys.executable, "-c", code, str(root / "quick")]
    with (root / "build.log").open("w") as log:  # (the child keeps its own handle)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(19))
    _SCRATCH.update(proc=proc, world=root / "quick", log=root / "build.log", root=root)


def pytest_sessionfinish(session):
    proc = _SCRATCH.get("proc")
    if proc is None:
        return
    if proc.poll() is None:  # a session that ended before its test (-x, a failure, Ctrl-C)
        proc.kill()
        proc.wait()
    shutil.rmtree(_SCRATCH["root"], ignore_errors=True)


@pytest.fixture(scope="session")
def scratch_world():
    """The from-scratch quick world's directory, once its background build has finished (tests/test_world.py)."""
    if "proc" not in _SCRATCH:  # (collected without its test: e.g. run by name from another module)
        pytest.skip(f"the from-scratch world is built for {SCRATCH_TEST} only")
    t0 = time.perf_counter()
    code = _SCRATCH["proc"].wait()
    log = _SCRATCH["log"].read_text()
    assert code == 0, f"the from-scratch world build failed ({code}):\n{log[-3000:]}"
    print(f"from-scratch world: waited {time.perf_counter() - t0:.0f}s for its background build")
    return _SCRATCH["world"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """Debian's redis-server for a module's tests (tests/test_budget_redis.py has a fresh one per test instead)."""
    from test_budget_redis import REDIS, RedisServer

    if REDIS is None:
        pytest.skip("needs Debian's redis-server: apt-get install -y redis-server")
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.kill()


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    from pyrodash.cli import main

    out = tmp_path_factory.mktemp("demo")
    t0 = time.perf_counter()
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    print(f"quick demo wall time: {time.perf_counter() - t0:.0f}s")
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SLM and LLM (`tiny_slm`, `tiny_llm` of tests/test_server.py), built once per test module; a module may
    define its own `models` instead."""
    from test_server import tiny_llm, tiny_slm

    return tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
