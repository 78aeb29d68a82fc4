"""docs/serving.md's Tools example runs as written (the block marked `<!-- runs in: tests/test_tools_docs.py -->`)
against a real `pyrodash serve` whose SLM and LLM are the TEST DOUBLES of tests/tool_doubles.py, with
`localhost:8000` swapped for its address: two calls (the second written by the LLM after a handoff), then the
answer."""

from __future__ import annotations

from doc_blocks import ROOT, blocks
from test_server import KEY, UvicornThread, make_engine, serve_config
from tool_doubles import tool_pair

from pyrodash.server.app import build_app


def test_the_tools_example_runs_as_written(capsys):
    [block] = [b for b in blocks(ROOT / "docs" / "serving.md") if b.marker == ("runs in", "tests/test_tools_docs.py")]
    assert block.lang == "python" and block.section == "Tools (agents)"
    slm, llm = tool_pair()
    cfg = serve_config(operating_points={"pyrodash": 0.0})
    with UvicornThread(build_app(cfg, engine=make_engine(slm, llm, cfg))) as srv:
        code = block.text.replace("http://localhost:8000", srv.url)
        exec(compile(code, str(ROOT / "docs" / "serving.md"), "exec"), {"KEY": KEY})  # noqa: S102 - the docs' code
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tool_calls [('lookup_g', 'slm')] None")
    assert lines[1].startswith("tool_calls [('lookup_g', 'llm')]") and not lines[1].endswith("None")
    assert lines[2].startswith("stop []") and lines[3].endswith("\\boxed{41}")
