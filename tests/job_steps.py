"""Steps for tests/test_jobs.py's scheduler runs. A worker process imports the module of each step it runs, so these
live apart from the tests, whose module imports the demo (and with it transformers, TRL, ...): a worker that
unpickles a step from here starts in a fraction of the time."""

from __future__ import annotations

import time
from pathlib import Path


def note(path: str, text: str, wait: float = 0.0) -> None:
    """A step: print, wait, then append `text` to `path`."""
    print(f"step {text} running")
    time.sleep(wait)
    with open(path, "a") as f:
        f.write(text)


def fail(message: str) -> None:
    print("about to fail")
    raise ValueError(message)


def torch_loaded(path: str) -> None:
    """A step: whether torch was loaded in this worker before it (written as "yes" / "no")."""
    import sys

    Path(path).write_text("yes" if "torch" in sys.modules else "no")


def torch_threads(path: str) -> None:
    import torch

    Path(path).write_text(str(torch.get_num_threads()))


def watch_grant(path: str, timeout: float = 30.0, until: str = "1,2", thread_grant=None) -> None:
    """A step: records the torch threads it runs on, taking the grant the scheduler passes it (`thread_grant`) as
    training steps do (`take_grant`, what `GrantedThreads` calls at each step; here every 50 ms), until it has seen the
    thread counts `until` (or `timeout`). A step given no grant records ";no grant" after its thread count."""
    import torch

    from pyrodash.jobs.scheduler import take_grant

    if thread_grant is None:
        Path(path).write_text(f"{torch.get_num_threads()};no grant")
        return
    seen = [torch.get_num_threads()]
    end = time.time() + timeout
    while ",".join(map(str, seen)) != until and time.time() < end:
        time.sleep(0.05)
        take_grant(thread_grant)
        if torch.get_num_threads() != seen[-1]:
            seen.append(torch.get_num_threads())
    Path(path).write_text(",".join(map(str, seen)))
