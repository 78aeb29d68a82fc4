"""The demo's console stays readable: library log records and warnings go to DIR/demo.log, not to the terminal."""

from __future__ import annotations

import logging
import warnings


def test_library_noise_goes_to_the_log_file(tmp_path, capsys):
    from pyrodash.library_log import library_log

    log = tmp_path / "demo.log"
    with library_log(log):
        warnings.warn("`foo` is deprecated", FutureWarning, stacklevel=1)
        logging.getLogger("transformers.trainer").warning("{'loss': 1.23, 'grad_norm': 0.5}")
        logging.getLogger("trl").info("ignored below WARNING by default")
    out = capsys.readouterr()
    text = log.read_text()
    assert "FutureWarning" in text and "`foo` is deprecated" in text and "'loss': 1.23" in text
    assert "deprecated" not in out.out + out.err and "loss" not in out.out + out.err
    # restored afterwards: warnings reach the console again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["after"]
