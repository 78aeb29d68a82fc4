"""The one record of an answer (`pyrodash.record`): built from the engine's Done, and the reader that keeps runs made
before it reporting (usage nested under "usage", segments keyed "model")."""

from __future__ import annotations

from pyrodash.cost import Prices, Usage
from pyrodash.events import Done
from pyrodash.record import USAGE_FIELDS, Record, read_record, usage_of
from pyrodash.report.metrics import compute_metrics

PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)


def _done() -> Done:
    u = Usage(slm_in=10, slm_out=5, llm_in=30, llm_out=7, llm_calls=1)
    segs = [{"by": "slm", "text": "ab"}, {"by": "llm", "endpoint": "llm", "text": "cd"}]
    return Done(
        output="abcd",
        slm_text="ab",
        llm_text="cd",
        usage=u,
        cost_usd=u.cost(PRICES),
        finish_reason="stop",
        handoff=4,
        segments=segs,
    )


def test_record_from_done_is_flat_and_keeps_the_streamed_segments():
    rec = Record.from_done(_done()).to_json()
    assert {k: rec[k] for k in USAGE_FIELDS} == _done().usage.to_dict() and "usage" not in rec
    assert "".join(s["text"] for s in rec["segments"]) == rec["output"] == "abcd"
    assert [s["by"] for s in rec["segments"]] == ["slm", "llm"] and rec["handoff"] == 4 and rec["mode"] == "collab"
    assert read_record(rec) == rec and usage_of(rec) == _done().usage


def test_records_written_before_the_one_record_still_read_and_report_the_same():
    new = {
        "id": "1",
        "benchmark": "b",
        "sample": 0,
        "gold": "1",
        "correct": True,
        **Record.from_done(_done()).to_json(),
    }
    old = {k: v for k, v in new.items() if k not in USAGE_FIELDS}
    old["usage"] = _done().usage.to_dict()
    old["segments"] = [{"model": s["by"], "text": s["text"]} for s in new["segments"]]
    got = read_record(old)
    assert usage_of(old) == usage_of(new) and [(s["by"], s["text"]) for s in got["segments"]] == [
        (s["by"], s["text"]) for s in new["segments"]
    ]
    a, b = compute_metrics("m", [read_record(old)], PRICES), compute_metrics("m", [new], PRICES)
    assert (a.accuracy, a.cost_usd, a.llm_calls, a.llm_token_ratio) == (
        b.accuracy,
        b.cost_usd,
        b.llm_calls,
        b.llm_token_ratio,
    )
