"""The demo app served on loopback, as its users meet it: `gradio_client` calls of every named endpoint (good and
bad input, and a burst of concurrent requests), and every tab driven in headless Chromium (Debian's `chromium`
and `chromium-driver`, which `.ci/run` installs).

One server for the module; each test talks to it over HTTP only, so what is checked is what a browser or a
client gets: the page's text, the endpoint's return values, the message of a refused request."""

from __future__ import annotations

import concurrent.futures
import shutil
import socket
import time
from pathlib import Path

import pytest

from demos import app

gr = pytest.importorskip("gradio")  # the `demo` extra, in `dev`
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "tests" / "artifacts" / "demo_screens"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    blocks = app.build()
    port = _free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        blocks.close()


@pytest.fixture(scope="module")
def client(served):
    return Client(served, verbose=False)


# one good request per endpoint, small enough to answer in a second or two, and what its first output must hold
GOOD = {
    "/text": (dict(pair="stdlib-bytes", prompt="def f(x):\n", max_new_tokens=8), "| yes |"),
    "/ssm": (dict(pair="stdlib-mamba2", prompt="import os\n", max_new_tokens=8), "| yes |"),
    "/image": (dict(digit_class=3, seed=1), "LANTERN"),
    "/continuous": (dict(digit_class=4, seed=2, drafts_per_step=4), "speculative"),
    "/reasoning": (dict(problem_number=0, question=""), "| SpecReason |"),
    "/reasoning_judge": (dict(problem_number=1, question=""), "control: approve-all head"),
}
# one bad request per endpoint and what its message must say: the argument, where the handler refuses it, or
# Gradio's own bound or choice check, where a slider or dropdown refuses it first
BAD = {
    "/text": (dict(pair="stdlib-bytes", prompt="", max_new_tokens=8), "prompt"),
    "/ssm": (dict(pair="stdlib-mamba2", prompt="", max_new_tokens=8), "prompt"),
    "/vision_sample": (dict(kind="pie"), "pie"),  # Gradio's own check: not one of the dropdown's choices
    "/vision": (dict(question=" ", max_new_tokens=8, chain_k=2), "question"),
    "/image": (dict(digit_class=12), "greater than maximum value 9"),  # Gradio's own check of the slider
    "/continuous": (dict(digit_class=3, drafts_per_step=0), "less than minimum value 1"),
    "/reasoning": (dict(problem_number=99999, question=""), "problem"),
    "/reasoning_judge": (dict(problem_number=0, question="", judge_threshold=2.0), "greater than maximum value 1"),
}


def _vision_request(client) -> dict:
    image, question = client.predict(kind="table", api_name="/vision_sample")
    return dict(image=handle_file(image), question=question, max_new_tokens=8, chain_k=4)


def test_every_endpoint_refuses_bad_input_with_its_message_and_keeps_serving(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert set(BAD) == names  # every endpoint is covered here
    for name, (kwargs, argument) in BAD.items():
        if name == "/vision":
            kwargs = {**_vision_request(client), **kwargs}
        with pytest.raises(AppError, match=argument):
            client.predict(api_name=name, **kwargs)
    table = client.predict(**GOOD["/text"][0], api_name="/text")[0]  # the server still answers
    assert "| yes |" in table


def test_twenty_concurrent_requests_across_tabs_all_answer(client):
    """A bounded load test: 20 requests in flight at once over every endpoint; none is lost, none errors, each
    answer is its own request's (the text tab's prompt varies per request)."""
    requests = []
    mix = ["/text", "/ssm", "/reasoning_judge", "/vision_sample", "/vision"]  # the cheap ones: every tab's heavy
    for i in range(20):                                                      # request runs in the browser test
        name = mix[i % len(mix)]
        if name == "/text":
            kwargs = dict(GOOD[name][0], prompt=f"x = {i}\n")
        elif name == "/vision":
            kwargs = _vision_request(client)
        elif name == "/vision_sample":
            kwargs = dict(kind="bar")
        else:
            kwargs = GOOD[name][0]
        requests.append((name, kwargs))
    jobs = [client.submit(api_name=name, **kwargs) for name, kwargs in requests]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: job.result(timeout=300), jobs))
    assert len(results) == 20
    for (name, kwargs), result in zip(requests, results):
        expected = {"/vision": "| yes |", "/vision_sample": "image.webp"}.get(name) or GOOD[name][1]
        assert expected in result[0], (name, result[0][:200])
        if name == "/text":  # the completion continues this request's prompt, as plain decoding does on its own
            assert result[1] == _plain_completion(kwargs["prompt"], kwargs["max_new_tokens"])


def _plain_completion(prompt: str, max_new_tokens: int) -> str:
    from demos.compare import load_pair

    pair = load_pair("stdlib-bytes")
    ids = pair.tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = pair.target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
    return pair.tokenizer.decode(out[0, ids.shape[1]:].tolist())


# --- a real browser -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("the browser tests need Debian's chromium and chromium-driver: "
                    "apt-get install -y chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # this machine has no network: without the background-networking flags Chromium keeps dialling out
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic", "--window-size=1400,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


# tab title (as the page shows it) -> (endpoint whose button to press, text its result table must show)
TABS = {
    "Text": ("text", "same output as plain"),
    "State-space (STree)": ("ssm", "STree"),
    "Vision-language": ("vision", "same answer as plain"),
    "Image AR (LANTERN)": ("image", "LANTERN"),
    "Image AR, continuous": ("continuous", "speculative"),
    "Reasoning": ("reasoning", "SpecReason"),
}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_every_tab_answers_in_headless_chromium(served, browser):
    from selenium.webdriver.common.by import By

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.get(served)
    _wait(lambda: browser.find_elements(By.CSS_SELECTOR, "button[role='tab']"), 60, "the app's tabs")
    for title, (endpoint, expected) in TABS.items():
        tab = _wait(lambda: [b for b in browser.find_elements(By.CSS_SELECTOR, "button[role='tab']")
                             if b.text.strip() == title], 10, f"the tab {title!r}")[0]
        tab.click()  # a tab hidden in an overflow menu at this width would not be clickable
        if endpoint == "vision":  # a shorter answer than the default 160 tokens (seven decodings run)
            box = browser.find_element(By.CSS_SELECTOR, "#vision-max-new input[type='number']")
            box.clear()
            box.send_keys("48\n")
        run = _wait(lambda: [b for b in browser.find_elements(By.ID, f"{endpoint}-run") if b.is_displayed()], 10,
                    f"the {endpoint} button")[0]
        run.click()
        table = browser.find_element(By.ID, f"{endpoint}-table")
        text = _wait(lambda: expected in table.text and table.text, 120, f"the {endpoint} result in the page")
        assert "Error" not in text
        browser.save_screenshot(str(SCREENSHOTS / f"{endpoint}.png"))
    # a bad request shows its message in the page, and the page keeps working
    box = browser.find_element(By.CSS_SELECTOR, "#reasoning-problem input")  # still on the reasoning tab
    box.clear()
    box.send_keys("99999")
    browser.find_element(By.ID, "reasoning-run").click()
    try:
        _wait(lambda: "got 99999" in browser.find_element(By.TAG_NAME, "body").text, 30,
              "the refused request's message in the page")
    finally:
        browser.save_screenshot(str(SCREENSHOTS / "reasoning_bad_input.png"))
    box.clear()
    box.send_keys("2")
    browser.find_element(By.ID, "reasoning-run").click()  # and the page keeps working
    table = browser.find_element(By.ID, "reasoning-table")
    _wait(lambda: "Reference answer" in table.text and str(_reference_answer(2)) in table.text, 60,
          "the next request's result")


def _reference_answer(problem: int) -> int:
    from multispec.reasoning import load_pair

    return int(load_pair().test[problem].answer)
