"""The playground with tools, in a real headless Chromium (as tests/test_playground.py drives it): function tools
typed into the Tools box go with every request, each call of an answer shows as a block saying which model wrote it,
the result typed in the composer goes back as the `tool` message, and the task ends in an answer. The server is
`pyrodash serve`'s app on 127.0.0.1 over the TEST DOUBLES of tests/tool_doubles.py (models that call tools)."""

from __future__ import annotations

import json

import pytest
from test_playground import _ask, _wait, browser  # noqa: F401 - the module fixture (skips without Chromium)
from test_server import KEY, UvicornThread, make_engine, serve_config
from tool_doubles import TASK, TOOL, tool_pair

from pyrodash.server.app import build_app
from pyrodash.server.config import Limits

By = pytest.importorskip("selenium.webdriver.common.by").By


@pytest.fixture(scope="module")
def url():
    slm, llm = tool_pair()
    limits = Limits(max_body_bytes=64 * 1024, max_tokens=4000, default_max_tokens=200)  # room for a whole call
    cfg = serve_config(operating_points={"pyrodash": 0.0}, limits=limits)
    with UvicornThread(build_app(cfg, engine=make_engine(slm, llm, cfg))) as srv:
        yield srv.url


def test_the_playground_runs_a_tool_loop_and_shows_who_called(url, browser, tmp_path):  # noqa: F811
    browser.get(url + "/")
    browser.execute_script("localStorage.setItem('pyrodash.apiKey', arguments[0])", KEY)
    browser.get(url + "/")
    _wait(browser, lambda d: d.find_element(By.ID, "model").get_attribute("value") == "pyrodash")
    browser.find_element(By.CSS_SELECTOR, "#tools-box summary").click()
    browser.find_element(By.ID, "tools").send_keys(json.dumps([TOOL]))
    _ask(browser, TASK)
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".call.slm"))
    assert "lookup_g" in browser.find_element(By.CSS_SELECTOR, ".call.slm").text
    assert "Result of lookup_g" in browser.find_element(By.ID, "question").get_attribute("placeholder")
    _wait(browser, lambda d: not d.find_element(By.ID, "send").get_attribute("disabled"))
    _ask(browser, "g(3) = 11")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".call.llm"))  # the LLM's call, after a handoff
    assert browser.find_elements(By.CSS_SELECTOR, ".marker.handoff")
    _wait(browser, lambda d: not d.find_element(By.ID, "send").get_attribute("disabled"))
    _ask(browser, "g(4) = 30")
    _wait(browser, lambda d: "\\boxed{41}" in d.find_element(By.ID, "history").text)
    tools = browser.find_elements(By.CSS_SELECTOR, ".turn.tool")
    assert [t.find_element(By.CSS_SELECTOR, ".body").text for t in tools] == [
        "lookup_g → g(3) = 11",
        "lookup_g → g(4) = 30",
    ]
    feet = [f.text for f in browser.find_elements(By.CSS_SELECTOR, ".turn-foot")]
    assert any("1 tool call (SLM)" in f for f in feet) and any("1 tool call (LLM)" in f for f in feet), feet
    browser.save_screenshot(str(tmp_path / "playground-tools.png"))
