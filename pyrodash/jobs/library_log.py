"""Library noise to a file: transformers/datasets/TRL log records and warnings go to a log file, their progress
bars are off, so the console keeps our own headers, rich bars and tables. Used by `pyrodash demo` (DIR/demo.log),
by each side-by-side step (`pyrodash.jobs.scheduler`: DIR/jobs/<step>.log) and by `pyrodash curate`, `train` and `eval`
(DIR/curate.log, DIR/train.log, DIR/eval.log in their output or run directory)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path


class _LazyFileHandler(logging.FileHandler):
    """A log file opened (and its directory made) at its first record: a command that stops before writing anything
    (a config error) leaves no directory behind."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


@contextlib.contextmanager
def library_log(path: Path, lazy: bool = False):
    """Send library noise (transformers/datasets/TRL log records, FutureWarnings and other warnings) to `path`, and
    turn off transformers' weight-loading and datasets' map bars: the console keeps the stage headers, our rich
    bars and the tables. `lazy`: the file (and its directory) is made at its first record, for a command whose
    output directory a config error must not leave behind; else it is opened at once."""
    import warnings

    handler = _LazyFileHandler(Path(path)) if lazy else logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    loggers = [
        logging.getLogger(n) for n in ("py.warnings", "transformers", "datasets", "trl", "accelerate", "peft", "torch")
    ]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.disable_progress_bar()  # "Loading weights" bars of every from_pretrained
    except ImportError:  # pragma: no cover - transformers is a dependency
        hf_logging = None
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        datasets = None
    logging.captureWarnings(True)
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            yield
        finally:
            logging.captureWarnings(False)
            for lg, hs, prop in saved:
                lg.handlers, lg.propagate = hs, prop
            if hf_logging is not None:
                hf_logging.enable_default_handler()
                hf_logging.enable_progress_bar()
            if datasets is not None:
                datasets.enable_progress_bars()
            handler.close()
