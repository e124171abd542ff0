"""Load: 32 concurrent clients on 127.0.0.1 against a running ``niels-serve``.

Bounded: 32 requests, each at most 24 new tokens, the whole burst under a
120 s limit. Every client must get an answer, and every answer must equal the
one its request gets when it is served alone (the same seed and knobs);
half of the clients stream (server-sent events), half take the JSON answer.
The figures (p50/p99 latency, tokens/s) are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

CLIENTS = 32
PROMPTS = ["d", "def ", "class A:\n", "import os\n", "for i in range(", "while True:\n    x = "]


def request(i: int) -> dict[str, Any]:
    """Client ``i``'s request: prompts of different lengths, every knob varied."""
    body: dict[str, Any] = {
        "prompt": PROMPTS[i % len(PROMPTS)] * (1 + i % 2),  # 1 to 40 bytes
        "max_new_tokens": 8 + (i * 7) % 17,  # 8 to 24: prompt + new <= T = 64
        "seed": 1000 + i,
        "temperature": [0.0, 0.7, 1.0, 1.4][i % 4],
    }
    if i % 3 == 1:
        body["top_k"] = 5 + i
    if i % 5 == 2:
        body["top_p"] = 0.8
    if i % 8 == 3:
        body["eos"] = 10  # a newline ends it
    return body


async def ask(http: httpx.AsyncClient, i: int) -> tuple[float, list[int]]:
    """Client ``i``: its latency and its tokens (streamed for odd ``i``)."""
    start = time.perf_counter()
    if i % 2 == 0:
        response = await http.post("/api/generate", json=request(i))
        response.raise_for_status()
        return time.perf_counter() - start, list(response.json()["tokens"])
    tokens: list[int] = []
    async with http.stream("POST", "/api/generate/stream", json=request(i)) as response:
        response.raise_for_status()
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token":
                tokens.append(json.loads(line[6:])["token"])
            elif line.startswith("data: ") and event == "done":
                assert json.loads(line[6:])["tokens"] == tokens
                return time.perf_counter() - start, tokens
    raise AssertionError(f"client {i}: the stream ended without a done event")


async def burst(url: str) -> list[tuple[float, list[int]]]:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        return list(await asyncio.gather(*(ask(http, i) for i in range(CLIENTS))))


def rank(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.mark.load
def test_32_concurrent_clients_get_their_single_request_answers(
    server_url: str, report: Callable[[str], None]
) -> None:
    with httpx.Client(base_url=server_url, timeout=60) as http:
        alone = []
        for i in range(CLIENTS):  # one at a time: each request served alone
            response = http.post("/api/generate", json=request(i))
            assert response.status_code == 200, response.text
            alone.append(response.json()["tokens"])
        before = http.get("/api/health").json()
    start = time.perf_counter()
    results = asyncio.run(asyncio.wait_for(burst(server_url), timeout=120))
    wall = time.perf_counter() - start
    with httpx.Client(base_url=server_url, timeout=60) as http:
        after = http.get("/api/health").json()
    assert len(results) == CLIENTS  # none lost
    for i, ((_, tokens), want) in enumerate(zip(results, alone, strict=True)):
        assert tokens == want, f"client {i} got other tokens batched than alone"
    assert after["served"] - before["served"] == CLIENTS and after["failed"] == 0
    assert after["largest_batch"] > 1  # they were batched
    assert after["running"] == after["waiting"] == 0
    latencies = [lat for lat, _ in results]
    tokens = sum(len(t) for _, t in results)
    report(
        f"load: {CLIENTS} concurrent clients (16 JSON, 16 streamed), {tokens} tokens in "
        f"{wall:.2f} s = {tokens / wall:.0f} tokens/s; latency p50 {rank(latencies, 0.5):.3f} s, "
        f"p99 {rank(latencies, 0.99):.3f} s; largest batch {after['largest_batch']}"
    )
