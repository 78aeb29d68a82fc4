"""Screenshots of the playground of a running `pyrodash serve` (the README's docs/playground*.png come from this).

    pyrodash serve --config configs/serve/world.yaml --slm runs/q/stage1 &
    python docs/playground_screenshot.py --url http://127.0.0.1:8000 --bias 2 "47: +3x8 f2"

Headless Debian chromium through /usr/bin/chromedriver (Selenium Manager is never asked to download a driver).
It types the key (if given), sets offload_bias, asks the question in the chat, then the same question in the
compare view, and saves one PNG of each.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("question", nargs="+", help="question(s) asked in the chat, in order; the last one is compared")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--key", default=os.environ.get("PYRODASH_API_KEY"), help="API key (default $PYRODASH_API_KEY)")
    ap.add_argument("--model", help="operating point to select (default: the server's first)")
    ap.add_argument("--bias", type=float, help="offload_bias typed into the page (default: the model's)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--out", default="docs/playground.png")
    ap.add_argument("--compare-out", default="docs/playground-compare.png")
    ap.add_argument("--size", default="1440,900", help="window size W,H")
    args = ap.parse_args()

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={args.size}",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)
    wait = WebDriverWait(driver, 300, poll_frequency=0.2)
    try:
        driver.get(args.url + "/")
        driver.execute_script("localStorage.clear()")
        if args.key:
            driver.execute_script("localStorage.setItem('pyrodash.apiKey', arguments[0])", args.key)
        driver.get(args.url + "/")
        wait.until(lambda d: Select(d.find_element(By.ID, "model")).options)
        if args.model:
            Select(driver.find_element(By.ID, "model")).select_by_value(args.model)
        for box_id, value in (("bias", args.bias), ("max-tokens", args.max_tokens)):
            if value is not None:
                box = driver.find_element(By.ID, box_id)
                box.clear()
                box.send_keys(str(value))
        for i, q in enumerate(args.question, 1):
            box = driver.find_element(By.ID, "question")
            box.send_keys(q)
            driver.find_element(By.ID, "send").click()
            wait.until(lambda d, n=i: len(d.find_elements(By.CSS_SELECTOR, ".turn.assistant .turn-foot")) >= n)
        driver.save_screenshot(args.out)
        print(f"wrote {Path(args.out).resolve()}")
        if args.compare_out:
            driver.find_element(By.ID, "tab-compare").click()
            driver.find_element(By.ID, "compare-question").send_keys(args.question[-1])
            driver.find_element(By.ID, "compare-send").click()
            wait.until(
                lambda d: all(
                    c.get_attribute("data-state") in ("done", "error") for c in d.find_elements(By.CSS_SELECTOR, ".col")
                )
            )
            driver.save_screenshot(args.compare_out)
            print(f"wrote {Path(args.compare_out).resolve()}")
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
