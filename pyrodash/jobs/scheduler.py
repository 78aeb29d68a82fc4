"""Independent steps side by side: worker processes on one torch thread each, a step starting once those it needs are
done (the demo's Stage 3 per λ and evaluation methods). Results do not depend on it (measured: same weights and
records on 1 and 2 threads). An elastic step (`Job(elastic=True)`) is called with `thread_grant=granted_threads` and
takes the cores no other step is ready for at each training step (`take_grant`, which
`pyrodash.train.common.GrantedThreads` calls). A step that starts alone, with no other step ready, runs on every
worker's core: nothing else can start before it ends. Each step's output goes to `log_dir/<step>.log`; a failed step
stops the run with its name and log. The step graph as it ran (each step's seconds, what it waited for, when it
started and ended) goes to `log_dir/steps.json` (`pyrodash.jobs.profile` reads it: the critical path).

    jobs = [Job("stage3 λ=0.6", run_stage3, (recipe, out), {"lam": 0.6}),
            Job("eval pyrodash@0.6", evaluate, (cfg_06,), after=("stage3 λ=0.6",))]
    seconds = run_jobs(jobs, workers=2, log_dir=out / "jobs")
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from pyrodash.jobs.library_log import library_log


class StepFailed(RuntimeError):
    """A step raised in its worker: its name, error and log (the steps done before it keep their outputs)."""


@dataclass
class Job:
    name: str
    fn: Callable  # a module-level function (it is pickled into the worker)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    after: tuple[str, ...] = ()  # names of the jobs this one needs
    # takes idle cores as torch threads (its results must not depend on its thread count); fn takes `thread_grant`
    elastic: bool = False


def default_workers() -> int:
    """Worker processes for side-by-side steps: the machine's cores, at most 4 (the demo has at most 4 such steps
    running at once that are worth it)."""
    return max(1, min(4, os.cpu_count() or 1))


def log_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=@+-]+", "_", name).strip("_") + ".log"


_GRANTS = None  # in a worker process: the threads granted to each job (shared with the scheduler), by job index
_THREADS = 1  # in a worker process: its own torch threads, between steps
_MINE: int | None = None  # in a worker process: the index of the job it runs now


def granted_threads() -> int | None:
    """In a step that `run_jobs` runs in a worker: the torch threads granted to it now (1, more for an elastic step
    while cores are idle); None anywhere else."""
    if _GRANTS is None or _MINE is None:
        return None
    return int(_GRANTS[_MINE])


def take_grant(grant: Callable[[], int | None]) -> None:
    """Take the torch threads `grant()` says the running step may use now (None: nothing changes). An elastic step's
    training steps call it with `granted_threads` (`pyrodash.train.common.GrantedThreads`)."""
    n = grant()
    if n:
        set_threads(n)


def set_threads(n: int) -> None:
    """torch's intra-op threads: set now where this process has loaded torch, else through `OMP_NUM_THREADS`, which
    torch reads when a step loads it (a worker whose steps never use torch never imports it: ~3 CPU-seconds saved
    per worker process)."""
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ["OMP_NUM_THREADS"] = str(n)
    elif n != torch.get_num_threads():
        torch.set_num_threads(n)


def _init_worker(threads: int, grants=None) -> None:
    global _GRANTS, _THREADS
    _GRANTS, _THREADS = grants, threads
    set_threads(threads)


def _run_logged(
    fn: Callable, args: tuple, kwargs: dict, log_path: str, index: int | None = None, threads: int = 1
) -> float:
    """In a worker: run `fn` on `threads` torch threads with its stdout, stderr and library noise (`library_log`) in
    `log_path`; its seconds. The worker is back on its own threads afterwards, whatever the step was granted."""
    global _MINE
    t = time.perf_counter()
    _MINE = index
    set_threads(threads)
    with open(log_path, "a", buffering=1) as log, library_log(Path(log_path)):
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = log
        try:
            fn(*args, **kwargs)
        finally:
            sys.stdout, sys.stderr = saved
            _MINE = None
            set_threads(_THREADS)
    return round(time.perf_counter() - t, 1)


def _grant(running: dict, grants, index: dict[str, int], workers: int, started: dict[str, int]) -> None:
    """The cores no running step holds go to the first running elastic step (in list order); every other step has
    the threads it started with (`started`)."""
    free = workers - sum(1 if j.elastic else started[j.name] for j in running.values())
    for j in sorted(running.values(), key=lambda j: index[j.name]):
        if not j.elastic:
            grants[index[j.name]] = started[j.name]
            continue
        grants[index[j.name]] = 1 + max(free, 0)
        free = 0


def _check(jobs: list[Job]) -> list[Job]:
    """`jobs` in an order that runs each after those it names; a ValueError for duplicate names, unknown names or
    jobs that wait for each other."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must be unique: {names}")
    for j in jobs:
        missing = [a for a in j.after if a not in names]
        if missing:
            raise ValueError(f"job {j.name!r} waits for unknown jobs {missing}")
    return _ordered(jobs)  # no job waits, through others, for itself


def _call_kwargs(j: Job) -> dict:
    """The keyword arguments `j.fn` is called with: an elastic step also gets `thread_grant` (`granted_threads`),
    the function its training steps ask for the threads granted now."""
    return {**j.kwargs, "thread_grant": granted_threads} if j.elastic else j.kwargs


def _run_here(order: list[Job], log_dir: Path) -> dict[str, float]:
    """`order` one after the other in this process, on the caller's threads; {name: seconds}."""
    seconds: dict[str, float] = {}
    spans: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for j in order:
        t = time.perf_counter()
        j.fn(*j.args, **_call_kwargs(j))
        seconds[j.name] = round(time.perf_counter() - t, 1)
        spans[j.name] = [t - t0, time.perf_counter() - t0]
    write_steps(log_dir, order, seconds, spans, workers=1)  # (on the caller's threads)
    return seconds


STEPS_FILE = "steps.json"


def write_steps(
    log_dir: Path, jobs: list[Job], seconds: dict, spans: dict, workers: int, threads: dict | None = None
) -> Path:
    """`log_dir/steps.json`: the steps that ran, in list order, each with its seconds (in its worker), the steps it
    waited for, whether it was elastic, the threads it started on (`threads`; None: the caller's), and its start and
    end in seconds from the start of the run (as the scheduler saw them); and the number of workers."""
    log_dir.mkdir(parents=True, exist_ok=True)
    steps = [
        {
            "name": j.name,
            "seconds": seconds[j.name],
            "after": list(j.after),
            "elastic": j.elastic,
            "threads": (threads or {}).get(j.name),
            "start_s": round(spans[j.name][0], 1),
            "end_s": round(spans[j.name][1], 1),
        }
        for j in jobs
        if j.name in seconds
    ]
    path = log_dir / STEPS_FILE
    path.write_text(json.dumps({"workers": workers, "steps": steps}, indent=1, ensure_ascii=False) + "\n")
    return path


def _start_ready(waiting: list[Job], running: dict, seconds: dict, submit: Callable, workers: int) -> None:
    """Move the waiting jobs whose needs are done to `running` (via `submit(job, threads)`) while workers are free.
    A job that starts with nothing running and no other job ready gets every worker's core: each job still waiting
    needs one not done, which only its end can change, so nothing starts beside it."""
    ready = [j for j in waiting if all(a in seconds for a in j.after)][: max(workers - len(running), 0)]
    alone = not running and len(ready) == 1
    for j in ready:
        waiting.remove(j)
        running[submit(j, workers if alone else 1)] = j


def _collect(done, running: dict, seconds: dict, failed: list[str], bar, rows: dict, log_dir: Path, ended=None) -> None:
    """Record each finished step's seconds, or its failure with its name and log; `ended(name)` for each."""
    for fut in done:
        j = running.pop(fut)
        if ended is not None:
            ended(j.name)
        try:
            seconds[j.name] = fut.result()
            bar.update(rows[j.name], completed=1, description=f"{j.name} [green]done[/]")
        except Exception as e:  # noqa: BLE001 - reported by run_jobs with the job's name and log
            failed.append(f"{j.name}: {type(e).__name__}: {e} (log: {log_dir / log_name(j.name)})")
            bar.update(rows[j.name], description=f"{j.name} [red]failed[/]")
        bar.stop_task(rows[j.name])


def run_jobs(jobs: list[Job], workers: int, log_dir: str | Path, console=None) -> dict[str, float]:
    """Run `jobs` (each after the ones it names) on `workers` processes of one thread each; {name: seconds}.
    Jobs start as workers free up, those more steps wait on first (`waited_on_first`), else in list order: put the
    long ones first."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    order = _check(jobs)
    log_dir = Path(log_dir)
    if workers <= 1:
        return _run_here(order, log_dir)
    import multiprocessing as mp

    log_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # a fresh interpreter: torch's thread pools are not fork-safe
    index = {j.name: i for i, j in enumerate(jobs)}
    grants = ctx.RawArray("i", [1] * len(jobs))  # written here, read by the step's worker at its training steps
    seconds: dict[str, float] = {}
    waiting, running, failed = waited_on_first(jobs), {}, []
    t0, spans, started = time.perf_counter(), {}, {}
    with (
        Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar,
        ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(1, grants)) as pool,
    ):
        rows = {j.name: bar.add_task(f"{j.name} [dim](waiting)[/]", total=1, start=False) for j in jobs}

        def submit(j: Job, threads: int) -> Future:
            grants[index[j.name]] = 1
            spans[j.name], started[j.name] = [time.perf_counter() - t0], threads
            bar.start_task(rows[j.name])
            log = str(log_dir / log_name(j.name))
            return pool.submit(_run_logged, j.fn, j.args, _call_kwargs(j), log, index[j.name], threads)

        while waiting or running:
            if not failed:
                _start_ready(waiting, running, seconds, submit, workers)
            _grant(running, grants, index, workers, started)
            for j in running.values():
                n = grants[index[j.name]]
                bar.update(rows[j.name], description=f"{j.name} [dim](running, {n} thread{'s' if n > 1 else ''})[/]")
            if failed and not running:
                break
            if not running:  # pragma: no cover - _check and list order rule this out
                raise ValueError(f"jobs {[j.name for j in waiting]} wait for jobs that never run")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            _collect(
                done, running, seconds, failed, bar, rows, log_dir, lambda n: spans[n].append(time.perf_counter() - t0)
            )
    write_steps(log_dir, jobs, seconds, spans, workers, started)
    if failed:
        raise StepFailed("a step failed: " + "; ".join(failed))
    return seconds


def waited_on_first(jobs: list[Job]) -> list[Job]:
    """`jobs` by how many steps wait on each, directly or through others, most first; list order among equals. Of two
    ready steps the one that more wait on starts first (the demo's Stage 3 for the λ its range calibration, sweeps
    and long conversations need, before the λ only its own evaluation needs)."""
    needs = {j.name: set(j.after) for j in jobs}
    waits_on: dict[str, set[str]] = {}  # name -> every step it needs, through others too
    for j in _ordered(jobs):
        waits_on[j.name] = set().union(*(waits_on[a] | {a} for a in needs[j.name]))
    waited = {j.name: sum(j.name in w for w in waits_on.values()) for j in jobs}
    return sorted(jobs, key=lambda j: -waited[j.name])


def _ordered(jobs: list[Job]) -> list[Job]:
    """`jobs` in an order where each comes after those it names (list order kept where it allows)."""
    out: list[Job] = []
    left = list(jobs)
    while left:
        j = next((j for j in left if all(a in {o.name for o in out} for a in j.after)), None)
        if j is None:
            raise ValueError(f"jobs {[j.name for j in left]} wait for each other")
        out.append(j)
        left.remove(j)
    return out
