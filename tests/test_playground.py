"""The browser playground of `pyrodash serve`, in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
driven by Selenium with /usr/bin/chromedriver given explicitly, so Selenium Manager never downloads anything).

A real `pyrodash serve` process (auth on) serves a tiny real SLM in process, and a base SLM (the compare view's "SLM
only"); the LLM is a tiny real model behind
`pyrodash serve-model`'s app on 127.0.0.1, stopped in the last test to see the fallback shown in the page. The
handoff is placed mid-answer by choosing the offload_bias with the API first (greedy decoding: the handoff position
only moves earlier as the bias grows), then set on the page's control. Screenshots go to the tests' tmp dirs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from servers import free_port, stop, wait_healthy
from test_server import UvicornThread, tiny_llm
from tiny_models import HANDOFF_SLM_SEED, tiny_model_dir

ROOT = Path(__file__).resolve().parent.parent
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = "playground-key"
QUESTION = "Start 47: +3, f."
OPS = {"pyrodash": 0.0, "pyrodash-eco": -2.0, "always-offload": 100.0}

if not (CHROMIUM and CHROMEDRIVER.exists()):
    pytest.skip(
        "no Chromium here: install Debian's chromium and chromium-driver (apt-get install -y chromium "
        "chromium-driver; .ci/run does it when it can)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing: pip install -e '.[test]'")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(pyrodash serve URL, the LLM's server): `pyrodash serve` as a process, stopped at the end."""
    from pyrodash.server.model_server import build_model_app

    tmp = tmp_path_factory.mktemp("playground")
    slm_dir = tiny_model_dir(tmp / "slm", seed=HANDOFF_SLM_SEED)
    base_dir = tiny_model_dir(tmp / "slm-base", seed=2, offload=False)
    lsrv = UvicornThread(build_model_app(tiny_llm(tmp_path_factory), model_name="tiny-llm")).__enter__()
    cfg = tmp / "serve.yaml"
    cfg.write_text(
        f"slm: {slm_dir}\nbase_slm: {base_dir}\nllm: {{url: '{lsrv.url}/v1', model: tiny-llm, timeout_s: 10}}\n"
        "prompts: world-v1\n"
        f"prices: paper\noperating_points: {OPS}\nfailure: {{retries: 1, backoff_s: 0.05, timeout_s: 10}}\n"
        "limits: {max_tokens: 256, default_max_tokens: 40}\n"
    )
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pyrodash",
        "serve",
        "--config",
        str(cfg),
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, "pyrodash serve")
        yield url, lsrv
    finally:
        stop(proc)
        if lsrv.thread.is_alive():
            lsrv.__exit__(None, None, None)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,960",
        "--force-device-scale-factor=1",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, cond, timeout: float = 90):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond)


def _open_with_key(driver, url: str) -> None:
    """Open the page; it finds auth on, asks for the key; the key typed in is sent as a Bearer header."""
    driver.get(url + "/")
    driver.execute_script("localStorage.clear()")
    driver.get(url + "/")
    _wait(driver, lambda d: d.find_element(By.ID, "auth-panel").is_displayed())
    assert "Missing API key" in driver.find_element(By.ID, "banners").text
    box = driver.find_element(By.ID, "api-key")
    box.send_keys(KEY)
    driver.find_element(By.ID, "key-save").click()
    _wait(driver, lambda d: not d.find_element(By.ID, "auth-panel").is_displayed())
    _wait(driver, lambda d: len(Select(d.find_element(By.ID, "model")).options) == len(OPS))


def _mid_answer_bias(url: str) -> tuple[float, int]:
    """An offload_bias at which the SLM writes >= 3 tokens and then hands off (greedy), found by bisection."""

    def handoff(bias: float) -> int | None:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
            json={
                "model": "pyrodash",
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 40,
                "temperature": 0,
                "offload_bias": bias,
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["pyrodash"]["handoff"]

    lo, hi = -20.0, 20.0  # handoff(lo) is late or None, handoff(hi) == 0
    assert handoff(hi) == 0
    for _ in range(14):
        mid = (lo + hi) / 2
        h = handoff(mid)
        if h is not None and 3 <= h <= 30:
            return mid, h
        lo, hi = (lo, mid) if h is not None and h < 3 else (mid, hi)
    raise AssertionError("no offload_bias puts the tiny SLM's handoff between tokens 3 and 30")


def _set_number(driver, element_id: str, value: float) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(str(value))


def _ask(driver, question: str) -> None:
    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "send").click()


def test_page_loads_without_a_key_and_asks_for_it(stack, browser):
    url, _ = stack
    r = httpx.get(url + "/")
    assert r.status_code == 200 and "PyroDash playground" in r.text
    assert httpx.get(url + "/playground/config").status_code == 401, "the page's data needs the API key"
    _open_with_key(browser, url)
    _wait(browser, lambda d: d.find_element(By.ID, "health").text == "SLM ✓ · LLM ✓")  # with the key: the models


def test_chat_shows_the_handoff_and_what_it_cost(stack, browser, tmp_path):
    url, _ = stack
    bias, at = _mid_answer_bias(url)
    _open_with_key(browser, url)
    _set_number(browser, "bias", bias)
    assert float(browser.find_element(By.ID, "bias").get_attribute("value")) == pytest.approx(bias)
    _ask(browser, QUESTION)
    _wait(browser, lambda d: d.find_element(By.ID, "meter").get_attribute("data-state") == "final")
    answer = browser.find_elements(By.CSS_SELECTOR, ".turn.assistant .body")[-1]
    slm = answer.find_elements(By.CSS_SELECTOR, ".seg.slm")
    llm = answer.find_elements(By.CSS_SELECTOR, ".seg.llm")
    marker = answer.find_elements(By.CSS_SELECTOR, ".marker.handoff")
    assert len(slm) == 1 and len(llm) == 1 and len(marker) == 1
    assert slm[0].text and llm[0].text and f"after {at} SLM token" in marker[0].text
    # SLM text, then the marker, then LLM text, in two different colours
    order = browser.execute_script("return [...arguments[0].children].map(e => e.className)", answer)
    assert order == ["seg slm", "marker handoff", "seg llm"]
    assert slm[0].value_of_css_property("color") != llm[0].value_of_css_property("color")
    # the meter: billed dollars by component, and the LLM-only estimate
    total = float(browser.find_element(By.ID, "cost-total").get_attribute("data-usd"))
    only = float(browser.find_element(By.ID, "cost-llm-only").get_attribute("data-usd"))
    assert total > 0 and only > 0
    for comp in ("slm_in", "slm_out", "llm_in", "llm_out"):
        assert int(browser.find_element(By.ID, f"tok-{comp}").text) > 0
        assert browser.find_element(By.ID, f"usd-{comp}").text.startswith("$")
    assert "estimate" in browser.find_element(By.ID, "meter-how").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#meter-bars .bar-row")) == 2
    # the same request through the API: the page showed what the server billed
    r = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
        json={
            "model": "pyrodash",
            "messages": [{"role": "user", "content": QUESTION}],
            "offload_bias": bias,
            "temperature": 0,
            "max_tokens": int(browser.find_element(By.ID, "max-tokens").get_attribute("value")),
        },
    )
    p = r.json()["pyrodash"]
    assert (
        p["handoff"] == at and total == pytest.approx(p["cost_usd"]) and only == pytest.approx(p["llm_only_cost_usd"])
    )
    shown = slm[0].get_attribute("textContent") + llm[0].get_attribute("textContent")
    assert shown == r.json()["choices"][0]["message"]["content"]
    browser.save_screenshot(str(tmp_path / "playground-chat.png"))
    assert (tmp_path / "playground-chat.png").stat().st_size > 10_000

    # a second turn carries the first as history
    _ask(browser, "And then?")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".turn.assistant .turn-foot")) == 2)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".turn.user")) == 2
    assert browser.execute_script("return state.history.length") == 4


def test_compare_view_runs_slm_llm_and_pyrodash(stack, browser, tmp_path):
    url, _ = stack
    _open_with_key(browser, url)
    browser.find_element(By.ID, "tab-compare").click()
    Select(browser.find_element(By.ID, "model")).select_by_value("always-offload")
    assert browser.find_element(By.ID, "bias").get_attribute("value") == "100"
    box = browser.find_element(By.ID, "compare-question")
    box.send_keys(QUESTION)
    browser.find_element(By.ID, "compare-send").click()
    _wait(
        browser,
        lambda d: all(c.get_attribute("data-state") == "done" for c in d.find_elements(By.CSS_SELECTOR, ".col")),
    )
    costs = {}
    for col in browser.find_elements(By.CSS_SELECTOR, ".col"):
        mode = col.get_attribute("data-mode")
        costs[mode] = float(col.find_element(By.CSS_SELECTOR, ".col-cost").get_attribute("data-usd"))
        segs = {s.get_attribute("class") for s in col.find_elements(By.CSS_SELECTOR, ".answer .seg")}
        assert segs == {"slm": {"seg slm"}, "llm": {"seg llm"}, "collab": {"seg llm"}}[mode], mode
    assert all(c > 0 for c in costs.values())
    assert costs["slm"] < costs["llm"], "the SLM's prices are lower than the LLM's"
    # "SLM only" is the server's base SLM answering alone, and the column says so; an answer without a final
    # \boxed{} is flagged, not shown as the SLM's answer
    slm_col = browser.find_element(By.CSS_SELECTOR, '.col[data-mode="slm"]')
    assert slm_col.find_element(By.TAG_NAME, "h3").text == "SLM only (base)"
    assert "base SLM slm-base" in slm_col.find_element(By.CSS_SELECTOR, ".col-who").text
    status = slm_col.find_element(By.CSS_SELECTOR, ".col-status").text
    assert "the base SLM answered alone" in status
    answer = slm_col.find_element(By.CSS_SELECTOR, ".answer").get_attribute("textContent")
    if "\\boxed{" not in answer and "cut at max tokens" not in status:
        assert slm_col.get_attribute("data-flag") == "no-answer" and "before a final answer" in status
    collab = browser.find_element(By.CSS_SELECTOR, '.col[data-mode="collab"]')
    assert collab.find_elements(By.CSS_SELECTOR, ".marker.handoff")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#compare-bars .bar-row")) == 3
    browser.save_screenshot(str(tmp_path / "playground-compare.png"))


def test_llm_down_shows_the_fallback_and_errors_in_the_page(stack, browser, tmp_path):
    url, lsrv = stack
    _open_with_key(browser, url)
    lsrv.__exit__(None, None, None)  # the LLM's server goes away
    Select(browser.find_element(By.ID, "model")).select_by_value("always-offload")
    _ask(browser, QUESTION)
    _wait(browser, lambda d: d.find_element(By.ID, "meter").get_attribute("data-state") == "final")
    banner = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".banner.warn"))[0]
    assert "fallback" in banner.text and "LLM failed" in banner.text
    answer = browser.find_elements(By.CSS_SELECTOR, ".turn.assistant .body")[-1]
    assert answer.find_elements(By.CSS_SELECTOR, ".marker.handoff")
    assert answer.find_elements(By.CSS_SELECTOR, ".marker.fallback")
    assert answer.find_elements(By.CSS_SELECTOR, ".seg.slm") and not answer.find_elements(By.CSS_SELECTOR, ".seg.llm")
    _wait(browser, lambda d: d.find_element(By.ID, "health").get_attribute("data-state") == "down")
    assert "LLM unreachable" in browser.find_element(By.ID, "health").text
    # LLM only cannot fall back: its 502 is shown in its column and as a banner
    browser.find_element(By.ID, "tab-compare").click()
    box = browser.find_element(By.ID, "compare-question")
    box.clear()
    box.send_keys(QUESTION)
    browser.find_element(By.ID, "compare-send").click()
    llm_col = browser.find_element(By.CSS_SELECTOR, '.col[data-mode="llm"]')
    _wait(browser, lambda d: llm_col.get_attribute("data-state") == "error")
    assert llm_col.find_element(By.CSS_SELECTOR, ".turn-error").text
    assert any("HTTP 502" in b.text for b in browser.find_elements(By.CSS_SELECTOR, ".banner.error"))
    browser.save_screenshot(str(tmp_path / "playground-llm-down.png"))
    # a wrong key: the page says so
    browser.execute_script("localStorage.setItem('pyrodash.apiKey', 'wrong')")
    browser.get(url + "/")
    _wait(browser, lambda d: d.find_element(By.ID, "auth-panel").is_displayed())
    assert "Incorrect API key" in browser.find_element(By.ID, "banners").text
