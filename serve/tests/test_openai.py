"""The OpenAI-compatible API with the official ``openai`` client, against ``niels-serve``
started as a user starts it (``server_url``), and its Prometheus metrics.

Tokens are checked against the page's own ``/api/generate`` (which test_api.py
checks against the stages): the same prompt, knobs and seed give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMPT = "def value(self):\n    return "


@pytest.fixture(scope="module")
def oai(server_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def native(server_url: str, **body: Any) -> str:
    """The page API's text for ``body``, decoded as /v1 decodes it."""
    answer = httpx.post(f"{server_url}/api/generate", json=body, timeout=60).json()
    return bytes(answer["tokens"]).decode("utf-8", errors="replace")


def test_models_list_the_served_run(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list().data] == ["tiny"]
    assert oai.models.retrieve("tiny").id == "tiny"


def test_a_completion_is_the_native_generation(oai: openai.OpenAI, server_url: str) -> None:
    got = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0)
    want = native(server_url, prompt=PROMPT, max_new_tokens=20, temperature=0)
    assert got.object == "text_completion" and got.model == "tiny"
    assert got.choices[0].text == want and got.choices[0].finish_reason == "length"
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(PROMPT.encode()), 20)


def test_seed_and_n_give_each_choice_its_own_reproducible_seed(
    oai: openai.OpenAI, server_url: str
) -> None:
    ask = {"model": "tiny", "prompt": ["class ", "if "], "max_tokens": 12, "seed": 77, "n": 3}
    got = oai.completions.create(**ask)
    again = oai.completions.create(**ask)
    assert [c.index for c in got.choices] == list(range(6))
    assert [c.text for c in got.choices] == [c.text for c in again.choices]
    for c in got.choices:
        prompt, i = ask["prompt"][c.index // 3], c.index % 3
        assert c.text == native(server_url, prompt=prompt, max_new_tokens=12, seed=77 + i)
    assert got.usage is not None and got.usage.completion_tokens == 6 * 12
    assert got.usage.prompt_tokens == len("class ") + len("if ")


def test_a_stream_is_the_completion_in_chunks(oai: openai.OpenAI) -> None:
    ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "seed": 5, "n": 2}
    whole = oai.completions.create(**ask)
    chunks = list(
        oai.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.text for c in mine) == whole.choices[index].text
        assert [c.finish_reason for c in mine][-1] == "length"
        assert all(c.finish_reason is None for c in mine[:-1]) and len(mine) > 2
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_the_raw_stream_ends_with_done(server_url: str) -> None:
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server_url}/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_stop_ends_the_text_before_the_first_stop_string(oai: openai.OpenAI) -> None:
    free = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0)
    text = free.choices[0].text
    stop = text[6:8]
    want = text[: text.find(stop)]
    ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    got = oai.completions.create(**ask, stop=[stop, "\x00never"])
    assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"
    streamed = list(oai.completions.create(**ask, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_logprobs_of_greedy_tokens_are_the_largest(oai: openai.OpenAI) -> None:
    got = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3
    ).choices[0]
    assert got.logprobs is not None and got.logprobs.token_logprobs is not None
    assert got.logprobs.top_logprobs is not None and got.logprobs.tokens is not None
    assert len(got.logprobs.token_logprobs) == 10 == len(got.logprobs.top_logprobs)
    for chosen, name, top in zip(
        got.logprobs.token_logprobs, got.logprobs.tokens, got.logprobs.top_logprobs, strict=True
    ):
        assert chosen is not None and chosen <= 0 and len(top) == 3
        assert top[name] == chosen == max(top.values())  # greedy: the likeliest byte


def test_errors_come_in_the_protocol_shape(oai: openai.OpenAI, server_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        oai.completions.create(model="tiny", prompt="x" * 40, max_tokens=100000)
    body = too_long.value.body
    assert isinstance(body, dict) and body["param"] == "max_tokens"
    assert body["type"] == "invalid_request_error" and "must be <= 24" in body["message"]
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="tiny", prompt="x", temperature=2.01)
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    bad = httpx.post(f"{server_url}/v1/completions", content=b"{", timeout=30,
                     headers={"content-type": "application/json"})  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"


def test_request_ids_are_echoed(server_url: str) -> None:
    given = httpx.get(f"{server_url}/v1/models", headers={"X-Request-Id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = httpx.get(f"{server_url}/api/health")
    assert len(made.headers["x-request-id"]) == 32
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
    answer = httpx.post(f"{server_url}/v1/completions", json=body, headers={"X-Request-Id": "r9"})
    assert answer.json()["id"] == "cmpl-r9" and answer.headers["x-request-id"] == "r9"


def test_metrics_parse_with_prometheus_clients_parser(oai: openai.OpenAI, server_url: str) -> None:
    oai.completions.create(model="tiny", prompt="def ", max_tokens=8, n=2)
    text = httpx.get(f"{server_url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("niels_serve_requests_total", (("route", "/v1/completions"),
                                                   ("status", "200")))] >= 1  # fmt: skip
    assert samples[("niels_serve_tokens_total", (("kind", "completion"),))] >= 16
    assert samples[("niels_serve_tokens_total", (("kind", "prompt"),))] >= 8
    assert ("niels_serve_queue_depth", ()) in samples and ("niels_serve_running", ()) in samples
    for histogram in ("batch_size", "time_to_first_token_seconds", "time_per_token_seconds"):
        assert families[f"niels_serve_{histogram}"].type == "histogram"
        assert samples[(f"niels_serve_{histogram}_count", ())] >= 1
    assert samples[("niels_serve_batch_size_sum", ())] >= 2
