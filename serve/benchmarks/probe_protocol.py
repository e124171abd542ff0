"""Issue 48's protocol defects, tried again against a running niels-serve: one line each.

    python serve/benchmarks/probe_protocol.py http://127.0.0.1:8000

Each line names a defect as the issue reported it and what the server answers now,
through the official ``openai`` client where the defect showed there and raw HTTP
where the client cannot send the request. A table to read, never a test: the tests
(``serve/tests/test_protocol.py``) assert the same cases against the tiny test model.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

RAW = {"content-type": "application/json"}


def status_of(call: Any) -> str:
    """``200`` or the client's exception: its class and status."""
    try:
        call()
    except openai.APIStatusError as err:
        return f"{type(err).__name__} {err.status_code}"
    return "200"


def main(url: str) -> None:
    http = httpx.Client(base_url=url, timeout=60)
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = oai.models.list().data[0].id
    surrogate = f'{{"model": "{model}", "prompt": "a\\ud800b", "max_tokens": 2}}'.encode()
    bad = http.post("/v1/completions", content=surrogate, headers=RAW)
    again = http.post("/v1/completions", json={"model": model, "prompt": "ab", "max_tokens": 2})
    pool = len(http._transport._pool.connections)  # type: ignore[attr-defined]
    print(f"lone surrogate on /v1: {bad.status_code} {bad.headers['content-type']}: "
          f"{bad.json()['error']['message']}; next request on the connection: "
          f"{again.status_code} ({pool} connection)")  # fmt: skip
    api = http.post("/api/generate", content=b'{"prompt": "\\ud800"}', headers=RAW)
    print(f"lone surrogate on /api: {api.status_code}: {api.json()['detail']}")
    statuses = sorted(
        {line.split('status="')[1].split('"')[0] for line in http.get("/metrics").text.splitlines()
         if line.startswith("niels_serve_requests_total{")}
    )  # fmt: skip
    print(f"statuses counted in /metrics: {statuses}")

    before = http.get("/api/health").json()["cancelled"]
    ask = {"model": model, "prompt": "def ", "max_tokens": 100, "seed": 1}

    def give_up(_: int) -> str:
        try:
            httpx.post(f"{url}/v1/completions", json=ask, timeout=0.05)
        except httpx.TimeoutException:
            return "gave up"
        return "answered"

    with ThreadPoolExecutor(10) as clients:
        outcomes = list(clients.map(give_up, range(10)))
    time.sleep(1.0)
    health = http.get("/api/health").json()
    print(f"10 non-stream /v1 clients giving up after 0.05 s: {outcomes.count('gave up')} gave "
          f"up, {health['cancelled'] - before} cancelled by the server, "
          f"{health['running']} still running")  # fmt: skip

    for prompts, n in ((300, 1), (1000, 16)):
        start = time.perf_counter()
        try:
            oai.completions.create(model=model, prompt=["a"] * prompts, n=n, max_tokens=1)
            said = "200"
        except openai.APIStatusError as err:
            said = f"{type(err).__name__} {err.status_code}: {err.body['message']}"  # type: ignore[index]
        print(f"{prompts} prompts x n={n}: {said} ({time.perf_counter() - start:.2f} s)")

    print("max_tokens 100000: " + status_of(
        lambda: oai.completions.create(model=model, prompt="x", max_tokens=100000)))  # fmt: skip
    echoed = oai.completions.create(
        model=model, prompt="a\u00e9\u20acb", max_tokens=3, temperature=0, logprobs=1, echo=True
    ).choices[0]
    plain = oai.completions.create(
        model=model, prompt="a\u00e9\u20acb", max_tokens=3, temperature=0, logprobs=1
    ).choices[0]
    assert echoed.logprobs is not None and plain.logprobs is not None
    print(f"text_offset of 'a\u00e9\u20acb' + 3 bytes, echoed: {echoed.logprobs.text_offset}; "
          f"not echoed: {plain.logprobs.text_offset}")  # fmt: skip
    null = oai.completions.create(model=model, prompt="x", max_tokens=None)
    print(f"max_tokens null: 200, {null.usage.completion_tokens if null.usage else '?'} tokens")
    for value in ('"8"', "8.0", "true"):
        v1 = http.post(
            "/v1/completions",
            headers=RAW,
            content=f'{{"model": "{model}", "prompt": "x", "max_tokens": {value}}}',
        )
        native = http.post("/api/generate", headers=RAW,
                           content=f'{{"prompt": "x", "max_new_tokens": {value}}}')  # fmt: skip
        print(f"max_tokens {value}: /v1 {v1.status_code}, /api {native.status_code}")
    for temperature in (2.5, 2.0, 1e-39, 1e-6):
        said = status_of(lambda t=temperature: oai.completions.create(
            model=model, prompt="x", max_tokens=2, temperature=t))  # fmt: skip
        print(f"temperature {temperature}: {said}")
    usage_only: Any = {"include_usage": True}
    print("stream_options without stream: " + status_of(lambda: oai.completions.create(
        model=model, prompt="x", max_tokens=2, stream_options=usage_only)))  # fmt: skip
    echo = oai.completions.create(model=model, prompt="def ", max_tokens=8, echo=True, seed=1)
    print(f"echo: {echo.choices[0].text!r}")
    messages: Any = [{"role": "user", "content": "a function"}]
    chat = oai.chat.completions.create(model=model, messages=messages, max_tokens=24, seed=1)
    streamed = oai.chat.completions.create(
        model=model, messages=messages, max_tokens=24, seed=1, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    print(f"chat: {chat.choices[0].message.content!r}; streamed the same: "
          f"{text == chat.choices[0].message.content}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
