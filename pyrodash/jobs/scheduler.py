"""Independent steps side by side: worker processes on one torch thread each, a step starting once those it needs are
done. The demo runs Stage 3 for each λ and the evaluation's methods this way.

    jobs = [Job("stage3 λ=0.6", run_stage3, (recipe, out), {"lam": 0.6}),
            Job("eval pyrodash@0.6", evaluate, (cfg_06,), after=("stage3 λ=0.6",))]
    seconds = run_jobs(jobs, workers=2, log_dir=out / "jobs")

Why processes on one thread: the world's models are too small for two threads to pay (measured, quick world: the
evaluation's methods on 1 thread take 1.39x their time on 2, Stage 3 about 1.2x), so two steps on one thread each
finish sooner than the same steps one after the other on two. Results do not depend on it: measured, quick world seed
0, Stage 3 λ 0.6 on 1 thread wrote the same weights, byte for byte, as on 2, and 3060 evaluation records (SLM, LLM,
oracle, PyroDash per λ) were identical. With `workers=1` the steps run here, in order, on the caller's threads.

An elastic step (`Job(elastic=True)`: one whose results do not depend on its thread count, checked for each) takes the
cores no other step is ready for: while fewer steps than workers run, the scheduler grants it the idle ones, and the
step reads its grant at each training step (`granted_threads`, `pyrodash.train.common.GrantedThreads`); a step that
becomes ready takes its core back at the elastic step's next training step. The demo's Stage 2 is one: it is the
longest step of its chain, and the evaluation beside it ends first.

A step's console output and library logs go to `log_dir/<step>.log`; the caller's console shows one row per step
(running, done, seconds). A step that fails stops the run with its name and its log's path once the steps already
running have finished; what finished is kept (every step of the demo is reused when its output exists).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from pyrodash.jobs.library_log import library_log


@dataclass
class Job:
    name: str
    fn: Callable  # a module-level function (it is pickled into the worker)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    after: tuple[str, ...] = ()  # names of the jobs this one needs
    elastic: bool = False  # takes idle cores as torch threads (its results must not depend on its thread count)


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


def _init_worker(threads: int, grants=None) -> None:
    import torch

    global _GRANTS, _THREADS
    _GRANTS, _THREADS = grants, threads
    torch.set_num_threads(threads)


def _run_logged(fn: Callable, args: tuple, kwargs: dict, log_path: str, index: int | None = None) -> float:
    """In a worker: run `fn` with its stdout, stderr and library noise (`library_log`) in `log_path`; its seconds.
    The worker is back on its own threads afterwards, whatever the step was granted."""
    global _MINE
    t = time.perf_counter()
    _MINE = index
    with open(log_path, "a", buffering=1) as log, library_log(Path(log_path)):
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = log
        try:
            fn(*args, **kwargs)
        finally:
            sys.stdout, sys.stderr = saved
            _MINE = None
            import torch

            torch.set_num_threads(_THREADS)
    return round(time.perf_counter() - t, 1)


def _grant(running: dict, grants, index: dict[str, int], workers: int) -> None:
    """The cores no running step holds go to the first running elastic step (in list order); every other step has
    one thread."""
    free = workers - len(running)
    for j in sorted(running.values(), key=lambda j: index[j.name]):
        n = 1 + free if j.elastic and free > 0 else 1
        free -= n - 1
        grants[index[j.name]] = n


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


def run_jobs(jobs: list[Job], workers: int, log_dir: str | Path, console=None) -> dict[str, float]:
    """Run `jobs` (each after the ones it names) on `workers` processes of one thread each; {name: seconds}.
    Jobs start in list order as workers free up; put the long ones first."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    order = _check(jobs)
    if workers <= 1:  # here, one after the other
        seconds = {}
        for j in order:
            t = time.perf_counter()
            j.fn(*j.args, **j.kwargs)
            seconds[j.name] = round(time.perf_counter() - t, 1)
        return seconds
    import multiprocessing as mp

    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # a fresh interpreter: torch's thread pools are not fork-safe
    index = {j.name: i for i, j in enumerate(jobs)}
    grants = ctx.RawArray("i", [1] * len(jobs))  # written here, read by the step's worker at its training steps
    seconds: dict[str, float] = {}
    waiting = list(jobs)
    running: dict[Future, Job] = {}
    failed: list[str] = []
    with (
        Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar,
        ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(1, grants)) as pool,
    ):
        rows = {j.name: bar.add_task(f"{j.name} [dim](waiting)[/]", total=1, start=False) for j in jobs}
        while waiting or running:
            for j in list(waiting):
                if failed or len(running) >= workers:
                    break
                if all(a in seconds for a in j.after):
                    waiting.remove(j)
                    grants[index[j.name]] = 1
                    running[
                        pool.submit(_run_logged, j.fn, j.args, j.kwargs, str(log_dir / log_name(j.name)), index[j.name])
                    ] = j
                    bar.start_task(rows[j.name])
            _grant(running, grants, index, workers)
            for j in running.values():
                n = grants[index[j.name]]
                bar.update(rows[j.name], description=f"{j.name} [dim](running, {n} thread{'s' if n > 1 else ''})[/]")
            if failed and not running:
                break
            if not running:  # pragma: no cover - _check and list order rule this out
                raise ValueError(f"jobs {[j.name for j in waiting]} wait for jobs that never run")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                j = running.pop(fut)
                try:
                    seconds[j.name] = fut.result()
                    bar.update(rows[j.name], completed=1, description=f"{j.name} [green]done[/]")
                    bar.stop_task(rows[j.name])
                except Exception as e:  # noqa: BLE001 - reported below with the job's name and log
                    failed.append(f"{j.name}: {type(e).__name__}: {e} (log: {log_dir / log_name(j.name)})")
                    bar.update(rows[j.name], description=f"{j.name} [red]failed[/]")
                    bar.stop_task(rows[j.name])
    if failed:
        raise RuntimeError("a step failed: " + "; ".join(failed))
    return seconds


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
