"""The page in a real browser: Debian's headless chromium, driven by Selenium.

It loads the page from a running ``niels-serve``, types a prompt, waits for
the streamed tokens, picks a layer and a head, hovers a token and checks what
the page shows against the API: the generated tokens, every heatmap cell (its
value and its shade) and where the hovered token attends. It saves a
screenshot (``$NIELS_SERVE_SCREENSHOT`` names a copy, the README's).
A missing browser fails the test with the line that installs it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

INSTALL = "apt-get install -y chromium chromium-driver"
PROMPT = "def value(self):\n    return "
KNOBS = {"max_new_tokens": "30", "temperature": "0.8", "top_k": "40", "top_p": "", "seed": "7"}


def _find(*names: str) -> str | None:
    return next((found for name in names if (found := shutil.which(name))), None)


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    browser = _find("chromium", "chromium-browser")
    chromedriver = _find("chromedriver")
    if browser is None or chromedriver is None:
        pytest.fail(f"the browser test needs Debian's chromium and chromium-driver: {INSTALL}")
    options = Options()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1400", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    try:
        chrome = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    except WebDriverException as err:
        pytest.fail(f"chromium did not start ({err.msg}); reinstall it: {INSTALL}")
    chrome.set_script_timeout(30)
    yield chrome
    chrome.quit()


def state_is(name: str) -> Any:
    return lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == name


# Every arrival of a generated token, as the page appends it, with the page's state then.
WATCH_TOKENS = """
window.seen = [];
new MutationObserver(() => {
  const count = document.querySelectorAll('#tokens .tok.gen').length;
  window.seen.push([count, document.body.dataset.state]);
}).observe(document.getElementById('tokens'), {childList: true});
"""

READ_CELLS = """
return Array.from(document.querySelectorAll('#heatmap .cell')).map(c => [
  Number(c.dataset.q), Number(c.dataset.k), c.dataset.v === undefined ? null : c.dataset.v,
  getComputedStyle(c).backgroundColor, c.classList.contains('future')]);
"""

READ_TOKENS = """
return Array.from(document.querySelectorAll('#tokens .tok')).map(s => [
  s.textContent, Number(s.dataset.token), s.dataset.attn === undefined ? null : s.dataset.attn,
  s.classList.contains('gen'), s.classList.contains('query')]);
"""


def alpha(css: str) -> float:
    """The alpha of ``rgba(r, g, b, a)`` (``rgb(...)`` is 1)."""
    inside = css[css.index("(") + 1 : css.index(")")].split(",")
    return float(inside[3]) if len(inside) == 4 else 1.0


def test_the_page_streams_and_shows_the_attention_of_a_chosen_head(
    server_url: str, driver: webdriver.Chrome, tmp_path: Path
) -> None:
    driver.get(f"{server_url}/")
    wait = WebDriverWait(driver, 60)
    wait.until(state_is("idle"))
    assert driver.find_element(By.ID, "model-info").text.startswith("v1 ")
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    for name, value in KNOBS.items():
        box = driver.find_element(By.ID, name)
        box.clear()
        if value:
            box.send_keys(value)
    driver.execute_script(WATCH_TOKENS)
    driver.find_element(By.ID, "generate").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tokens .tok.gen"))  # streaming
    wait.until(state_is("done"))

    # The tokens: one span a byte, appended one by one while streaming, equal to the API's.
    with httpx.Client(base_url=server_url, timeout=60) as http:
        body = {"prompt": PROMPT, "max_new_tokens": 30, "temperature": 0.8, "top_k": 40, "seed": 7}
        answer = http.post("/api/generate", json=body).json()
    spans = driver.execute_script(READ_TOKENS)
    assert [s[1] for s in spans if s[3]] == answer["tokens"]
    assert [s[0] for s in spans] == answer["labels"]  # escapes included: \\n is two characters
    assert spans[PROMPT.index("\n")][0] == "\\n"
    seen = driver.execute_script("return window.seen")
    assert [c for c, _ in seen if c] == list(range(1, 31))  # a token at a time
    assert all(state == "streaming" for c, state in seen if 0 < c < 30)

    # Pick layer 1, head 2; the heatmap is that head's matrix from the API.
    Select(driver.find_element(By.ID, "layer")).select_by_value("1")
    heatmap = driver.find_element(By.ID, "heatmap")
    wait.until(lambda d: heatmap.get_attribute("data-layer") == "1")
    Select(driver.find_element(By.ID, "head")).select_by_value("2")
    wait.until(lambda d: heatmap.get_attribute("data-head") == "2")
    tokens = answer["prompt_tokens"] + answer["tokens"]
    with httpx.Client(base_url=server_url, timeout=60) as http:
        got = http.post("/api/attention", json={"tokens": tokens, "layer": 1, "head": 2}).json()
    matrix = got["attention"][0][0]  # (t, t)
    t = len(tokens)
    cells = driver.execute_script(READ_CELLS)
    assert len(cells) == t * t
    for q, k, value, background, future in cells:
        if k > q:
            assert future and value is None
            continue
        assert float(value) == matrix[q][k], (q, k)
        shade = matrix[q][k] / max(matrix[q])  # the browser keeps alpha in 8 bits
        assert alpha(background) == pytest.approx(shade, abs=1 / 255), (q, k)

    # Hover a generated token: every token up to it is shaded by how much it attends there.
    q = t - 4
    target = driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")[q]
    ActionChains(driver).move_to_element(target).perform()
    wait.until(lambda d: d.find_element(By.ID, "hover-info").text.startswith(f"#{q} "))
    spans = driver.execute_script(READ_TOKENS)
    assert [float(s[2]) for s in spans[: q + 1]] == matrix[q][: q + 1]
    assert all(s[2] is None for s in spans[q + 1 :])
    assert [i for i, s in enumerate(spans) if s[4]] == [q]  # the query is marked
    hover_row = driver.find_elements(By.CSS_SELECTOR, "#heatmap .cell.row-hover")
    assert {c.get_attribute("data-q") for c in hover_row} == {str(q)}

    shot = tmp_path / "niels-serve.png"
    assert driver.save_screenshot(str(shot))
    if copy := os.environ.get("NIELS_SERVE_SCREENSHOT"):
        shutil.copyfile(shot, copy)


def test_a_64_bit_seed_goes_through_the_page_exactly(
    server_url: str, driver: webdriver.Chrome
) -> None:
    """The page rounded seeds through JavaScript numbers: ...095176 became ...095424."""
    seed = "6548027008821095176"
    driver.get(f"{server_url}/")
    wait = WebDriverWait(driver, 60)
    wait.until(state_is("idle"))
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("class ")
    for name, value in {**KNOBS, "max_new_tokens": "12", "top_k": "", "seed": seed}.items():
        box = driver.find_element(By.ID, name)
        box.clear()
        if value:
            box.send_keys(value)
    driver.find_element(By.ID, "generate").click()
    wait.until(state_is("done"))
    assert f"seed {seed}," in driver.find_element(By.ID, "status").text
    body = {"prompt": "class ", "max_new_tokens": 12, "temperature": 0.8, "seed": int(seed)}
    answer = httpx.post(f"{server_url}/api/generate", json=body, timeout=60).json()
    spans = driver.execute_script(READ_TOKENS)
    assert [s[1] for s in spans if s[3]] == answer["tokens"]
