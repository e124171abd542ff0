"""Defects found by trying the server as its users do, each fixed and pinned here (issue 29)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.local import ThreadServer

from .conftest import SlowEngine, script
from .test_server import LONG, ONE_SLOT, wait_for

SEED = 6548027008821095176  # over 2**53: a JavaScript number shows it as ...095424


@pytest.mark.parametrize("temperature", [1e-39, 1e-300, 5e-324, 9e-6])
@pytest.mark.parametrize("path", ["/api/generate", "/api/generate/stream"])
def test_a_tiny_temperature_is_greedy(client: httpx.Client, path: str, temperature: float) -> None:
    """1e-39 passed validation and made the draw's probabilities NaN: a 500. Then it was
    refused (422); below 1e-5 it is greedy now, as vLLM takes it (issue 48)."""
    body = {"prompt": "def ", "max_new_tokens": 4, "temperature": temperature, "seed": 1}
    greedy = client.post("/api/generate", json={**body, "temperature": 0}).json()["tokens"]
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    if path == "/api/generate":
        assert response.json()["tokens"] == greedy
    else:
        assert f'"tokens": {greedy}' in response.text


def test_the_smallest_temperature_that_samples(client: httpx.Client) -> None:
    body = {"prompt": "def ", "max_new_tokens": 4, "temperature": 1e-5, "seed": 1}
    greedy = client.post("/api/generate", json={**body, "temperature": 0}).json()["tokens"]
    assert client.post("/api/generate", json=body).json()["tokens"] == greedy  # still peaked


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_json_client_that_gives_up_leaves_no_traceback(served: Served) -> None:
    """It logged ``InvalidStateError: Result is not set`` with a traceback, one a client."""
    app = create_app(served, ONE_SLOT, engine=SlowEngine(served, pause_s=0.05))
    records = _Records()
    with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "asyncio")]
        for logger in loggers:
            logger.addHandler(records)
        try:
            for _ in range(2):
                with pytest.raises(httpx.ReadTimeout):
                    http.post("/api/generate", json=LONG, timeout=0.3)
                wait_for(http, lambda h: h["running"] == 0)
            assert http.post("/api/generate", json={**LONG, "max_new_tokens": 2}).status_code == 200
        finally:
            for logger in loggers:
                logger.removeHandler(records)
    bad = [r.getMessage() for r in records.records if r.exc_info or r.levelno >= logging.ERROR]
    assert bad == []


def test_attention_waits_in_the_same_queue_under_the_same_limit(served: Served) -> None:
    """2000 attention requests all got 200 beside a generation, which took 30 s."""
    running = threading.Event()  # the generation holds after its first token until set
    engine = SlowEngine(served, pause_s=0.05, hold=running)
    app = create_app(served, ONE_SLOT, engine=engine)
    with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/api/generate/stream", json=LONG) as response:
            lines = response.iter_lines()
            first = list(itertools.takewhile(lambda s: s != "event: token", lines))
            assert engine.holding.wait(timeout=30), f"no second step; the stream: {first}"
            health = http.get("/api/health").json()  # taken while the step holds
            busy = http.post("/api/attention", json={"tokens": [1, 2, 3]})
            running.set()
            rest = [line for line in lines if line.startswith("event:")]
        seen = (
            f"{busy.text[:120]}; health while held: {health}; "
            f"then the stream sent {len(rest)} events, the last {rest[-1:]}"
        )
        assert busy.status_code == 503, seen
        assert busy.headers["retry-after"] == "1" and busy.json()["field"] == "body"
        wait_for(http, lambda h: h["running"] == 0)
        assert http.post("/api/attention", json={"tokens": [1, 2, 3]}).status_code == 200


def test_no_docs_page_that_needs_a_cdn(client: httpx.Client) -> None:
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert 'href="/docs"' not in client.get("/").text
    assert client.get("/openapi.json").status_code == 200


def test_a_body_that_is_not_utf8_names_body(client: httpx.Client) -> None:
    response = client.post(
        "/api/generate",
        content=b'{"prompt": "\xff\xfe"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and response.json()["field"] == "body", response.text


def test_max_new_tokens_names_the_real_limit(client: httpx.Client) -> None:
    """Prompt of 40 bytes, T=64, server cap 48: the limit is 24, not 48."""
    body = {"prompt": "x" * 40, "max_new_tokens": 100000}
    error = client.post("/api/generate", json=body).json()
    assert error["field"] == "max_new_tokens" and "must be <= 24" in error["detail"], error


def test_a_seed_as_an_exact_decimal_string(client: httpx.Client) -> None:
    body: dict[str, Any] = {"prompt": "class ", "max_new_tokens": 12, "temperature": 1.0}
    as_int = client.post("/api/generate", json={**body, "seed": SEED}).json()
    as_text = client.post("/api/generate", json={**body, "seed": str(SEED)}).json()
    assert as_text["tokens"] == as_int["tokens"] and as_text["seed_text"] == str(SEED)
    with client.stream("POST", "/api/generate/stream", json={**body, "seed": str(SEED)}) as r:
        assert f'"seed_text": "{SEED}"' in r.read().decode()
    for bad in ("-1", "1e3", " 1", str(2**63)):
        error = client.post("/api/generate", json={**body, "seed": bad}).json()
        assert error["field"] == "seed", (bad, error)
    page = client.get("/").text
    assert 'id="seed" name="seed" type="number"' not in page  # a number input rounds it


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_server_with_status_0_and_no_traceback(
    tiny_run: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl+C ended in a 26-line KeyboardInterrupt traceback and status -2."""
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [script("niels-serve"), "--checkpoint", str(tiny_run), "--port", "0"],
            stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "open http://" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        url = log.read_text().split("open ")[1].split(" ")[0]
        ok = httpx.post(f"{url}api/generate", json={"prompt": "a", "max_new_tokens": 2})
        assert ok.is_success
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and f"stopped ({signum.name})" in text, text
