"""The completions protocol as its clients expect it (issue 48), through the official
``openai`` client where the defect shows there, raw HTTP where the client cannot send it.

Against ``niels-serve`` started as a user starts it (``server_url``: the tiny run, T=64,
``--max-new-tokens 48 --max-batch 16``, the default ``--max-waiting 256``), or an app in
this process where a test needs a slow engine or a route of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.local import ThreadServer

from .conftest import SlowEngine
from .test_server import ONE_SLOT, wait_for

PROMPT = "def value(self):\n    return "


@pytest.fixture(scope="module")
def oai(server_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _local_port(response: httpx.Response) -> int:
    """The client's port of the connection ``response`` came on (the same port: the same
    keep-alive connection)."""
    port: int = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port


def _counted(text: str) -> dict[tuple[str, str], float]:
    """``niels_serve_requests_total`` by (route, status)."""
    return {
        (s.labels["route"], s.labels["status"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "niels_serve_requests_total"
    }


@pytest.mark.parametrize(
    ("path", "field", "status"),
    [("/v1/completions", "prompt", 400), ("/api/generate", "prompt", 422)],
)
def test_a_lone_surrogate_is_a_json_error_and_the_connection_lives(
    server_url: str, path: str, field: str, status: int
) -> None:
    """``"\\ud800"`` gave a plain-text 500, a traceback, and reset the keep-alive connection."""
    body = b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 2}'
    if path.startswith("/api"):
        body = b'{"prompt": "a\\ud800b", "max_new_tokens": 2}'
    with httpx.Client(base_url=server_url, timeout=30) as http:
        bad = http.post(path, content=body, headers={"content-type": "application/json"})
        assert bad.status_code == status, bad.text
        error = bad.json()
        named = error["error"]["param"] if path.startswith("/v1") else error["field"]
        assert named == field and "surrogate" in bad.text, bad.text
        assert "lone surrogate U+D800" in bad.text and "Value error" not in bad.text
        assert bad.headers.get("connection") != "close"
        ok = {"model": "tiny", "prompt": "ab", "max_tokens": 2}
        if path.startswith("/api"):
            ok = {"prompt": "ab", "max_new_tokens": 2}
        good = http.post(path, json=ok)
        assert good.status_code == 200 and _local_port(good) == _local_port(bad)  # same one
        assert "none" not in {s for _, s in _counted(http.get("/metrics").text)}


def test_every_5xx_is_counted_with_its_status(served: Served) -> None:
    """An unexpected error was counted as ``status="none"``; it is a JSON 500 now."""
    app = create_app(served, ONE_SLOT)

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        answer = http.get("/v1/boom")
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error", answer.text
        scrape = http.get("/metrics")
        assert _local_port(scrape) == _local_port(answer)  # the same connection
        counted = _counted(scrape.text)
    assert counted[("other", "500")] == 1 and ("other", "none") not in counted


def test_a_v1_client_that_gives_up_is_cancelled(served: Served) -> None:
    """Ten ``curl -m 0.5`` clients of /v1/completions all ran to the end."""
    app = create_app(served, ONE_SLOT, engine=SlowEngine(served, pause_s=0.05))
    ask = {"model": "tiny", "prompt": "def ", "max_tokens": 48, "seed": 1}
    with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=ask, timeout=0.5)  # 48 steps take 2.4 s
        health = wait_for(http, lambda h: h["running"] == 0)
        assert health["cancelled"] == 1 and health["served"] == 0 and health["tokens"] < 48
        assert http.post("/v1/completions", json={**ask, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(("prompts", "n"), [(300, 1), (20, 16)])
def test_a_request_that_can_never_fit_is_a_400_naming_the_limit(
    oai: openai.OpenAI, prompts: int, n: int
) -> None:
    """It was a 503 + Retry-After, which the client retried three times."""
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="tiny", prompt=["a"] * prompts, n=n, max_tokens=1)
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "too_many_choices"
    assert f"{prompts * n} generations" in body["message"]
    assert "--max-batch 16 + --max-waiting 256 = 272" in body["message"]


@pytest.mark.parametrize(
    ("knob", "value"),
    [("max_tokens", 100000), ("temperature", 2.5), ("top_p", 0), ("n", 0), ("logprobs", 9),
     ("temperature", -0.1), ("stop", [""])],
)  # fmt: skip
def test_parameter_errors_are_400_bad_request(oai: openai.OpenAI, knob: str, value: Any) -> None:
    """They were 422: the client raised ``UnprocessableEntityError``."""
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="tiny", prompt="x", **{knob: value})
    body = refused.value.body
    assert isinstance(body, dict) and body["param"] == knob, body


def test_an_unknown_field_is_a_400_naming_it(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="tiny", prompt="x", extra_body={"top_k": 3})
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "top_k"


@pytest.mark.parametrize("value", ['"8"', "8.0", "true"])
def test_integers_are_strict_on_both_apis(server_url: str, value: str) -> None:
    """``"8"``, ``8.0`` and ``true`` were taken as 8 by /v1 and refused by /api."""
    raw = {"content-type": "application/json"}
    v1 = httpx.post(
        f"{server_url}/v1/completions",
        content=f'{{"model": "tiny", "prompt": "x", "max_tokens": {value}}}', headers=raw,
    )  # fmt: skip
    assert v1.status_code == 400 and v1.json()["error"]["param"] == "max_tokens", v1.text
    api = httpx.post(
        f"{server_url}/api/generate",
        content=f'{{"prompt": "x", "max_new_tokens": {value}}}', headers=raw,
    )  # fmt: skip
    assert api.status_code == 422 and api.json()["field"] == "max_new_tokens", api.text


def test_max_tokens_null_is_the_servers_cap(oai: openai.OpenAI) -> None:
    """It was a 422; null is "no limit of the client's own": the server's 48 here."""
    got = oai.completions.create(model="tiny", prompt="x", max_tokens=None, seed=3)
    assert got.usage is not None and got.usage.completion_tokens == 48
    near = oai.completions.create(model="tiny", prompt="x" * 40, max_tokens=None, seed=3)
    assert near.usage is not None and near.usage.completion_tokens == 24  # T=64 - 40 bytes


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 9e-6])
def test_a_temperature_below_1e_5_is_greedy(oai: openai.OpenAI, temperature: float) -> None:
    """Temperatures below 1e-4 were refused (OpenAI takes [0, 2]; vLLM: < 1e-5 is greedy)."""
    ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "seed": 9}
    greedy = oai.completions.create(**ask, temperature=0).choices[0].text
    assert oai.completions.create(**ask, temperature=temperature).choices[0].text == greedy
    assert oai.completions.create(**ask, temperature=2.0).choices[0].finish_reason == "length"


def test_stream_options_without_stream_is_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(
            model="tiny", prompt="x", max_tokens=2, stream_options={"include_usage": True}
        )
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == "stream_options"


def test_echo_puts_the_prompt_before_the_text(oai: openai.OpenAI) -> None:
    ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
    plain = oai.completions.create(**ask).choices[0].text
    echoed = oai.completions.create(**ask, echo=True)
    assert echoed.choices[0].text == PROMPT + plain
    assert echoed.usage is not None and echoed.usage.completion_tokens == 10
    streamed = list(oai.completions.create(**ask, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == PROMPT + plain
    only = oai.completions.create(**{**ask, "max_tokens": 0}, echo=True)
    assert only.choices[0].text == PROMPT


def test_text_offset_counts_characters_from_the_prompts_start(oai: openai.OpenAI) -> None:
    """OpenAI's ``text_offset``: where each token starts in prompt + completion, in
    characters. It was ``[0, 0, 0, 1, 2, 2]`` for non-ASCII bytes and began at 0."""
    prompt = "a\u00e9\u20acb"  # a, é (2 bytes), € (3 bytes), b: 4 characters, 7 bytes
    ask = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1}
    plain = oai.completions.create(**ask).choices[0]
    assert plain.logprobs is not None and plain.logprobs.text_offset is not None
    assert plain.logprobs.text_offset[0] == 4
    echoed = oai.completions.create(**ask, echo=True).choices[0]
    lp = echoed.logprobs
    assert lp is not None and lp.text_offset is not None and lp.tokens is not None
    assert lp.text_offset[:7] == [0, 1, 1, 2, 2, 2, 3]
    assert lp.tokens[:3] == ["a", "bytes:\\xc3", "bytes:\\xa9"]
    assert lp.text_offset[7:] == plain.logprobs.text_offset
    assert lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.top_logprobs is not None and lp.top_logprobs[0] is None
    streamed = list(oai.completions.create(**ask, stream=True))
    offsets = [
        o
        for c in streamed
        if c.choices[0].logprobs
        for o in c.choices[0].logprobs.text_offset or []
    ]
    assert offsets == plain.logprobs.text_offset


CHAT = [
    {"role": "system", "content": "Write Python."},
    {"role": "user", "content": "a function"},
]


def test_chat_is_the_completion_of_its_plain_template(oai: openai.OpenAI) -> None:
    """Chat completions answered 400 ``chat_not_supported``; the template is ``chat.py``'s."""
    prompt = "Write Python.\n\nUser: a function\n\nAssistant: "
    ask = {"model": "tiny", "max_tokens": 20, "seed": 4}
    got = oai.chat.completions.create(messages=CHAT, **ask)
    want = oai.completions.create(prompt=prompt, stop="\nUser:", **ask).choices[0]
    assert got.object == "chat.completion" and got.id.startswith("chatcmpl-")
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage is not None and got.usage.prompt_tokens == len(prompt.encode())
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "function"}],
        }
    ]
    again = oai.chat.completions.create(messages=[CHAT[0], *parts], **ask)
    assert again.choices[0].message.content == want.text


def test_a_chat_stream_is_the_chat_in_deltas(oai: openai.OpenAI) -> None:
    ask = {"model": "tiny", "max_completion_tokens": 16, "seed": 8, "n": 2}
    whole = oai.chat.completions.create(messages=CHAT, **ask)
    chunks = list(
        oai.chat.completions.create(
            messages=CHAT,
            stream=True,
            stream_options={"include_usage": True},
            **ask,
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == whole.choices[index].message.content
        assert mine[-1].finish_reason == whole.choices[index].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_errors_are_400s_naming_the_field(oai: openai.OpenAI) -> None:
    for bad in (
        {"messages": []},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x", "name": "ann"}]},
        {"messages": CHAT, "max_tokens": 2, "max_completion_tokens": 2},
        {"messages": [{"role": "user", "content": "x" * 80}]},
        {"messages": CHAT, "temperature": 3},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model="tiny", **bad)
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] in {
            "messages", "messages.0.role", "messages.0.name", "max_completion_tokens",
            "temperature",
        }, (bad, body)  # fmt: skip


def test_echo_with_logprobs_checks_the_prompt_before_scoring_it(oai: openai.OpenAI) -> None:
    """A prompt past the context was scored first, and the model's own error was a 500."""
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model="tiny", prompt="x" * 80, echo=True, logprobs=1, max_tokens=1)
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "prompt"
