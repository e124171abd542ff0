"""The page is ready when it says so (issue 48): while ``/api/model`` is on its way, no
select is empty and nothing can be clicked; ``body[data-ready]`` is set once it is ready.

In headless chromium, against an app in this process whose ``/api/model`` answers
after a pause, so the loading page can surely be looked at.
"""

from __future__ import annotations

import asyncio

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from starlette.types import ASGIApp, Receive, Scope, Send

from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.local import ThreadServer

from .test_browser import driver, state_is  # noqa: F401  (driver: the module's chromium)
from .test_server import ONE_SLOT

pytestmark = pytest.mark.browser

READ_PAGE = """
const opts = (id) => Array.from(document.getElementById(id).options).map(o => o.textContent);
return {ready: document.body.dataset.ready ?? null, busy: document.body.getAttribute('aria-busy'),
        layer: opts('layer'), head: opts('head'),
        status: document.getElementById('status').textContent,
        generate: document.getElementById('generate').disabled};
"""


class SlowModelInfo:
    """ASGI middleware: ``GET /api/model`` waits ``pause_s`` before it is answered."""

    def __init__(self, app: ASGIApp, pause_s: float) -> None:
        self.app, self.pause_s = app, pause_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/api/model":
            await asyncio.sleep(self.pause_s)
        await self.app(scope, receive, send)


def test_the_loading_page_has_no_empty_select_and_says_when_it_is_ready(
    served: Served,
    driver: webdriver.Chrome,  # noqa: F811
) -> None:
    """It showed "loading the model…" above two empty selects, and nothing to wait on."""
    app = create_app(served, ONE_SLOT)
    app.add_middleware(SlowModelInfo, pause_s=3.0)
    with ThreadServer(app) as url:
        driver.get(f"{url}/")
        loading = driver.execute_script(READ_PAGE)
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true"
        )
        ready = driver.execute_script(READ_PAGE)
    assert loading["ready"] is None and loading["busy"] == "true", loading
    assert loading["layer"] == ["loading…"] and loading["head"] == ["loading…"], loading
    assert loading["generate"] is True and "loading" in loading["status"], loading
    L, H = served.config.L, served.config.H
    assert ready["layer"] == [f"layer {i}" for i in range(L)], ready
    assert ready["head"] == [f"head {i}" for i in range(H)], ready
    assert ready["busy"] is None and ready["generate"] is False and ready["status"] == "ready"
    assert state_is("idle")(driver)
