"""The page in a real browser: Debian's headless chromium, driven by Selenium.

It loads the page from a running ``niels-serve``, types a prompt, waits for
the streamed tokens, picks a layer and a head, hovers a token and checks what
the page shows against the API: the generated tokens, every heatmap cell (its
value and its shade), every head's thumbnail in the overview (a click picks
that head) and where the hovered token attends. It saves a
screenshot (``$NIELS_SERVE_SCREENSHOT`` names a copy, the README's).
A missing browser fails the test with the line that installs it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
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


READ_HEADS = """
return Array.from(document.querySelectorAll('#heads .head')).map(b => {
  const c = b.querySelector('canvas');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const rgba = [];
  for (let i = 0; i < px.length; i += 4) rgba.push([px[i], px[i + 1], px[i + 2], px[i + 3]]);
  return [Number(b.dataset.layer), Number(b.dataset.head), c.width, c.height, rgba,
          b.getAttribute('aria-pressed'), b.getBoundingClientRect().width];
});
"""


def test_the_overview_shows_every_head_and_a_click_picks_it(
    server_url: str, driver: webdriver.Chrome
) -> None:
    """Issue 29: all heads as small multiples, a row per layer, so a user can find an
    interesting head; each thumbnail is its head's matrix, shaded as the big heatmap (each
    row relative to its largest, as the page says); clicking one shows it in the heatmap."""
    driver.get(f"{server_url}/")
    wait = WebDriverWait(driver, 60)
    wait.until(state_is("idle"))
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    for name, value in {**KNOBS, "max_new_tokens": "20"}.items():
        box = driver.find_element(By.ID, name)
        box.clear()
        if value:
            box.send_keys(value)
    driver.find_element(By.ID, "generate").click()
    wait.until(state_is("done"))
    model = httpx.get(f"{server_url}/api/model", timeout=60).json()
    n_layers, n_heads = model["L"], model["H"]
    thumbs = (By.CSS_SELECTOR, "#heads .head")
    wait.until(lambda d: len(d.find_elements(*thumbs)) == n_layers * n_heads)
    tokens = [int(s.get_attribute("data-token")) for s in
              driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")]  # fmt: skip
    t = len(tokens)
    got = httpx.post(f"{server_url}/api/attention", json={"tokens": tokens}, timeout=60).json()
    every = got["attention"]  # (L, H, t, t)

    heads = driver.execute_script(READ_HEADS)
    every_head = [(i, j) for i in range(n_layers) for j in range(n_heads)]
    assert [(h[0], h[1]) for h in heads] == every_head
    for layer, head, width, height, rgba, pressed, shown_px in heads:
        assert (width, height) == (t, t) and shown_px <= 80  # one pixel a cell, shown small
        assert pressed == ("true" if (layer, head) == (0, 0) else "false")  # the heatmap's head
        m = every[layer][head]
        for q in range(t):
            top = max(m[q])
            for k in range(t):
                r, g, b, a = rgba[q * t + k]
                if k > q:
                    assert (r, g, b, a) == (243, 244, 246, 255), (layer, head, q, k)
                else:  # the shade of the big heatmap's cell, in the canvas's 8 bits
                    assert abs(a - 255 * m[q][k] / top) <= 0.5 + 1e-9, (layer, head, q, k, a)
    rows = driver.find_elements(By.CSS_SELECTOR, "#heads .heads-row")
    assert [r.text.split("\n")[0] for r in rows] == [f"layer {i}" for i in range(n_layers)]
    hint = driver.find_element(By.ID, "heads-hint").text
    assert "relative to its own largest probability" in hint
    big = driver.find_element(By.CSS_SELECTOR, ".pick + .hint").text
    assert "relative to the row's largest" in big

    # A click on layer 1, head 3 shows that head in the big heatmap, cell by cell.
    driver.find_element(By.CSS_SELECTOR, '#heads .head[data-layer="1"][data-head="3"]').click()
    heatmap = driver.find_element(By.ID, "heatmap")
    wait.until(lambda d: (heatmap.get_attribute("data-layer"), heatmap.get_attribute("data-head"))
               == ("1", "3"))  # fmt: skip
    assert Select(driver.find_element(By.ID, "layer")).first_selected_option.text == "layer 1"
    assert Select(driver.find_element(By.ID, "head")).first_selected_option.text == "head 3"
    cells = driver.execute_script(READ_CELLS)
    assert len(cells) == t * t
    assert all(float(v) == every[1][3][q][k] for q, k, v, _, future in cells if not future)
    pressed = driver.find_elements(By.CSS_SELECTOR, '#heads .head[aria-pressed="true"]')
    assert [(p.get_attribute("data-layer"), p.get_attribute("data-head")) for p in pressed] == [
        ("1", "3")
    ]


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


def test_the_page_says_how_trained_the_model_is(
    server_url: str, driver: webdriver.Chrome, tiny_run: Path
) -> None:
    """The figures come from the served run's own files, read here directly."""
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    step, val = max((r["step"], r["val_loss"]) for r in records if "val_loss" in r)
    driver.get(f"{server_url}/")
    WebDriverWait(driver, 60).until(state_is("idle"))
    info = driver.find_element(By.ID, "model-info").text
    assert f" step {step} " in info and f" val loss {val:.3f} " in info
    training = driver.find_element(By.ID, "training")
    assert training.text.startswith(f"Trained for {step} steps (")
    assert f"validation loss {val:.3f} nats a byte" in training.text
    barely = val > 2.5  # the tiny test model is: the page must say so
    assert ("This model is barely trained" in training.text) is barely
    assert ("barely" in (training.get_attribute("class") or "").split()) is barely


def luminance(rgb: Sequence[float]) -> float:
    """WCAG relative luminance of an sRGB colour (0..255 channels)."""
    lin = [c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4
           for c in rgb]  # fmt: skip
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def on_white(css: str) -> list[float]:
    """``rgb(...)`` or ``rgba(...)`` painted over white, as [r, g, b]."""
    inside = [float(x) for x in css[css.index("(") + 1 : css.index(")")].split(",")]
    a = inside[3] if len(inside) == 4 else 1.0
    return [255 + (c - 255) * a for c in inside[:3]]


def contrast(fg: str, bg: str) -> float:
    lo, hi = sorted((luminance(on_white(fg)), luminance(on_white(bg))))
    return (hi + 0.05) / (lo + 0.05)


READ_SHADED = """
return Array.from(document.querySelectorAll('#tokens .tok')).filter(s => s.dataset.attn)
  .map(s => [s.classList.contains('prompt'), getComputedStyle(s).color,
             getComputedStyle(s).backgroundColor]);
"""

READ_WIDTHS = """
const map = document.getElementById('heatmap');
const box = map.getBoundingClientRect();
return [document.documentElement.scrollWidth, document.documentElement.clientWidth,
        window.innerWidth, box.left, box.right, Number(map.dataset.cell)];
"""


def test_a_400_px_window_scales_the_heatmap_and_keeps_hovered_tokens_readable(
    server_url: str, driver: webdriver.Chrome
) -> None:
    """At 400 px the heatmap kept its width and the page scrolled sideways; hovering
    turned the grey prompt tokens' text unreadable. The overview line matches the head."""
    driver.set_window_size(400, 1000)
    try:
        driver.get(f"{server_url}/")
        wait = WebDriverWait(driver, 60)
        wait.until(state_is("idle"))
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(PROMPT)
        for name, value in {**KNOBS, "max_new_tokens": "36"}.items():
            box = driver.find_element(By.ID, name)
            box.clear()
            if value:
                box.send_keys(value)
        driver.find_element(By.ID, "generate").click()
        wait.until(state_is("done"))
        heatmap = driver.find_element(By.ID, "heatmap")
        wait.until(lambda d: heatmap.get_attribute("data-t"))
        t = len(PROMPT) + 36
        assert len(driver.find_elements(By.CSS_SELECTOR, "#heatmap .cell")) == t * t
        scroll, client, inner, left, right, cell = driver.execute_script(READ_WIDTHS)
        assert inner <= 400 and scroll <= client, (scroll, client)  # no sideways scroll
        assert left >= 0 and right <= client and cell >= 1, (left, right, client, cell)
        heads = driver.find_elements(By.CSS_SELECTOR, "#heads .head")  # the overview fits too
        assert heads and all(h.rect["x"] >= 0 and h.rect["x"] + h.rect["width"] <= client
                             for h in heads), [h.rect for h in heads]  # fmt: skip

        # The overview line: this head's shares, from the same matrix the API gives.
        tokens = [int(s.get_attribute("data-token")) for s in
                  driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")]  # fmt: skip
        got = httpx.post(f"{server_url}/api/attention", json={"tokens": tokens, "layer": 0,
                         "head": 0}, timeout=60).json()  # fmt: skip
        m = got["attention"][0][0]
        rows = range(1, t)
        want = {
            "prev": sum(m[q][q - 1] for q in rows) / (t - 1),
            "self": sum(m[q][q] for q in rows) / (t - 1),
            "first": sum(m[q][0] for q in rows) / (t - 1),
            "distance": sum(m[q][k] * (q - k) for q in rows for k in range(q + 1)) / (t - 1),
        }
        overview = driver.find_element(By.ID, "overview")
        for name, value in want.items():
            # the same float64 sums in the same order: equal, not close
            assert float(overview.get_attribute(f"data-{name}") or "nan") == value, name
        assert overview.text.startswith("Layer 0, head 0, averaged over rows 1 to ")
        assert (
            f"{round(100 * want['prev'])}% of a token's attention goes to the token just "
            "before it" in overview.text
        )

        # Hover the last token: every token is shaded; each must stay readable (WCAG AA 4.5:1).
        last = driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")[t - 1]
        ActionChains(driver).move_to_element(last).perform()
        wait.until(lambda d: d.find_element(By.ID, "hover-info").text.startswith(f"#{t - 1} "))
        shaded = driver.execute_script(READ_SHADED)
        assert len(shaded) == t and sum(p for p, _, _ in shaded) == len(PROMPT)
        worst = min(contrast(fg, bg) for _, fg, bg in shaded)
        assert worst >= 4.5, [(p, fg, bg) for p, fg, bg in shaded if contrast(fg, bg) < 4.5]
    finally:
        driver.set_window_size(1280, 1400)
