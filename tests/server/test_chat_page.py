#!/usr/bin/env python3
"""The chat page of `tandem serve`, driven in a real browser: Debian's chromium, headless, through
chromedriver (selenium). The server runs with an API key, so the page must take the key from its
user; the test types the key and a question, waits for the streamed answer, checks the answer's
TTFT/TPOT/token line and the KV view fed by /metrics, and saves a screenshot (docs/chat_page.png
by default). It fails if no answer appears. Exit 77 (CTest: skipped), saying why, when the model,
chromium, chromedriver or the selenium package is missing (scripts/setup.sh installs them).

    python3 tests/server/test_chat_page.py --tandem build/tandem --model models/....gguf
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time

SKIP = 77
KEY = "page-test-key"
QUESTION = "What is the capital of France? <i>Answer in one sentence.</i>"
FOLLOW_UP = "Name three famous places to visit there."
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def find_browser():
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver") or next((p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
                                                   if os.path.exists(p)), None)
    return browser, driver


def start_server(tandem, model):
    proc = subprocess.Popen([tandem, "serve", "-m", model, "--port", "0", "--kv-memory", "64MiB", "--api-key", KEY],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("tandem serve did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--screenshot", default=os.path.join(os.path.dirname(__file__), "..", "..", "docs", "chat_page.png"))
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"skip: no model at {a.model} (run scripts/setup.sh)")
        return SKIP
    browser, driver_path = find_browser()
    if not browser or not driver_path:
        print("skip: no chromium/chromedriver (apt-get install chromium chromium-driver; scripts/setup.sh does)")
        return SKIP
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        print("skip: the selenium package is not installed (pip install selenium; scripts/setup.sh does)")
        return SKIP

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800",
                 "--force-device-scale-factor=1", "--hide-scrollbars", "--no-first-run", "--disable-extensions"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})

    proc, port = start_server(a.tandem, a.model)
    driver = None
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        # The page's viewport itself is 1280x760, whatever the headless window adds around it.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 760, "deviceScaleFactor": 1,
                                                                      "mobile": False})
        driver.set_page_load_timeout(30)
        driver.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: "API key" in d.find_element(By.ID, "kv-text").text)
        check(True, "without the key, the page says /metrics needs it")

        # Without the key a question gets the server's 401 as the answer's error line.
        box = driver.find_element(By.ID, "input")
        box.send_keys("Hello?" + Keys.ENTER)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done]"))
        err = driver.find_element(By.CSS_SELECTOR, ".msg.assistant")
        check("error" in err.get_attribute("class") and "401" in err.text and "API key" in err.text,
              f"without the key, a question shows the server's refusal: {err.text!r}")
        driver.find_element(By.ID, "clear").click()
        check(not driver.find_elements(By.CSS_SELECTOR, "#log .msg"), "New conversation clears the log")

        key = driver.find_element(By.ID, "key")
        key.send_keys(KEY)
        key.send_keys(Keys.TAB)  # "change" fires: the page reloads the model name and the KV view with the key
        wait.until(lambda d: re.search(r"\d+ of \d+ blocks", d.find_element(By.ID, "kv-text").text))
        total = int(re.search(r"of (\d+) blocks", driver.find_element(By.ID, "kv-text").text).group(1))
        check(total > 0, f"with the key, the KV view shows the pool ({total} blocks)")
        wait.until(lambda d: "SmolLM2" in d.find_element(By.ID, "model").text)

        limit = driver.find_element(By.ID, "max-tokens")
        limit.clear()
        limit.send_keys(str(a.max_tokens))

        def ask(text, n):  # types `text`, sends it with Enter, waits for the n-th answer
            box = driver.find_element(By.ID, "input")
            box.send_keys(text)
            t0 = time.time()
            box.send_keys(Keys.ENTER)
            sel = f".msg.assistant:nth-of-type({2 * n})"
            # The streamed answer: text shows while the answer is still being written, then it ends.
            WebDriverWait(driver, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, sel + " .text") and
                                             d.find_element(By.CSS_SELECTOR, sel + " .text").text.strip())
            WebDriverWait(driver, 180).until(lambda d: d.find_elements(By.CSS_SELECTOR, sel + "[data-done]"))
            answer = driver.find_element(By.CSS_SELECTOR, sel + " .text").text.strip()
            stats = driver.find_element(By.CSS_SELECTOR, sel + " .stats").text
            failed = "error" in driver.find_element(By.CSS_SELECTOR, sel).get_attribute("class")
            print(f"     answer {n} ({time.time() - t0:.1f} s): {answer!r}\n     stats: {stats}")
            return answer, stats, failed

        answer, stats, failed = ask(QUESTION, 1)
        check(bool(answer) and not failed, "a streamed answer appears")
        check("Paris" in answer, "the server applied the chat template (the answer names Paris)")
        m = re.search(r"TTFT ([\d.]+) ms · TPOT ([\d.]+) ms/token \(([\d.]+) tok/s\) · (\d+) tokens \(prompt (\d+)\)", stats)
        check(m is not None, f"the answer's TTFT, TPOT and token counts are shown: {stats!r}")
        if m:
            check(0 < float(m.group(1)) < 120000 and 0 < float(m.group(2)) < 10000, "TTFT and TPOT are plausible")
            check(1 <= int(m.group(4)) <= a.max_tokens and int(m.group(5)) > 10, "token counts within max_tokens, prompt templated")
        first_prompt = int(m.group(5)) if m else 0

        # Text typed by the user stays text: no element was made from it.
        user = driver.find_element(By.CSS_SELECTOR, ".msg.user .text").text
        check(user == QUESTION and not driver.find_elements(By.CSS_SELECTOR, "#log i"), "message text is shown as text, not markup")

        # A second turn carries the first: its prompt holds the whole conversation.
        answer, stats, failed = ask(FOLLOW_UP, 2)
        m = re.search(r"\(prompt (\d+)\)", stats)
        check(bool(answer) and not failed and m and int(m.group(1)) > first_prompt + 10,
              f"a second turn is answered with the conversation as its prompt: {stats!r}")

        # The KV view polls /metrics (every 250 ms while the page's own answer runs, else every
        # second). A short answer can end between two polls on a fast or busy machine, so the
        # history is also shown a request that provably outlives two polls: 600 tokens that no
        # end-of-text cuts short (seconds of decoding on any CPU), sent beside the page.
        import json as _json
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=_json.dumps({"prompt": "1, 2, 3,", "max_tokens": 600, "temperature": 0,
                                                       "ignore_eos": True}).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        # The KV view kept polling during the answers (its history has points) and is back to idle.
        wait.until(lambda d: re.search(r"^0 of \d+ blocks", d.find_element(By.ID, "kv-text").text))
        check(True, "after the answer the KV view shows no blocks in use")
        peak = driver.find_element(By.ID, "kv-history").get_attribute("data-peak")
        check(peak is not None and int(peak) >= 1, f"the KV history saw the answers' blocks in use (peak {peak})")

        csp = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        check(not csp, f"no Content-Security-Policy violations {csp}")

        time.sleep(0.3)
        shot = os.path.abspath(a.screenshot)
        os.makedirs(os.path.dirname(shot), exist_ok=True)
        check(driver.save_screenshot(shot) and os.path.getsize(shot) > 10000, f"screenshot saved to {shot}")
    except Exception as e:  # a timeout waiting for the page is a failure, with what the page showed
        check(False, f"{type(e).__name__}: {e}".strip())
        if driver:
            try:
                print("     page log: " + " | ".join(el.text for el in driver.find_elements(By.CSS_SELECTOR, "#log .msg")))
                print("     kv: " + driver.find_element(By.ID, "kv-text").text)
            except Exception:
                pass
    finally:
        if driver:
            driver.quit()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

    print(f"\n{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
