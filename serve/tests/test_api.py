"""Every endpoint and knob of the API: the app in this process on uvicorn, httpx as the client.

Generated tokens are checked against the stages' own generation
(``kv_cache.generate`` with a generator seeded alike), attention against the
backbone's ``forward_with_attn_trace``: both are independent of the app's code.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import torch

from niels_gpt.model.kv_cache import generate as stage_generate
from niels_gpt_serve.app import Served

PROMPT = "def value(self):\n    return "


def reference(served: Served, prompt: str, n: int, **knobs: Any) -> list[int]:
    """The stage's tokens for ``prompt`` alone, cut after the first eos like the API."""
    ids = torch.tensor([list(prompt.encode())], dtype=torch.int64)  # (1, t)
    seed, eos = knobs.pop("seed"), knobs.pop("eos", None)
    out = stage_generate(
        served.model, ids, n, generator=torch.Generator().manual_seed(seed), eos_id=eos, **knobs
    )
    assert isinstance(out, torch.Tensor)
    tokens: list[int] = out[0, ids.shape[1] :].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


def sse(text: str) -> list[tuple[str, Any]]:
    """``(event, data)`` of every server-sent event in ``text``."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_the_page_and_its_files_come_from_the_app(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/app.js">' in page.text and 'href="/style.css"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    script = client.get("/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "https://" not in script.text and "innerHTML" not in script.text
    heads = client.get("/heads.js")  # the overview of every head
    assert heads.headers["content-type"].startswith("text/javascript")
    assert "function renderHeads" in heads.text and "innerHTML" not in heads.text
    assert '<script src="/heads.js">' in page.text
    assert client.get("/style.css").headers["content-type"].startswith("text/css")


def test_model_info_and_health(client: httpx.Client, served: Served) -> None:
    info = client.get("/api/model").json()
    cfg = served.config
    assert (info["V"], info["T"], info["C"], info["L"], info["H"]) == (
        cfg.V, cfg.T, cfg.C, cfg.L, cfg.H,
    )  # fmt: skip
    assert info["arch"] == "v1" and info["step"] == served.step and info["run"] == "tiny"
    assert info["params"] == sum(p.numel() for p in served.model.parameters())
    assert info["max_new_tokens"] == 48 and info["max_prompt_tokens"] == cfg.T - 1
    health = client.get("/api/health").json()
    assert health["status"] == "ok" and health["running"] == 0 and health["waiting"] == 0


def test_openapi_documents_every_route_and_limit(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/api/model", "/api/health", "/api/generate", "/api/generate/stream",
            "/api/attention"} <= set(schema["paths"])  # fmt: skip
    knobs = schema["components"]["schemas"]["GenerateRequest"]["properties"]
    assert set(knobs) == {
        "prompt",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "eos",
    }
    assert knobs["temperature"]["minimum"] == 0
    assert (
        "text/event-stream"
        in schema["paths"]["/api/generate/stream"]["post"]["responses"]["200"]["content"]
    )


KNOBS = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "top_k": 20, "top_p": 0.9},
    {"temperature": 100.0},
    {"temperature": 1.0, "top_k": 256, "top_p": 1.0},
]


@pytest.mark.parametrize("knobs", KNOBS, ids=[json.dumps(k) for k in KNOBS])
def test_generate_equals_the_stage_alone(
    client: httpx.Client, served: Served, knobs: dict[str, Any]
) -> None:
    body = {"prompt": PROMPT, "max_new_tokens": 24, "seed": 1234, **knobs}
    answer = client.post("/api/generate", json=body).json()
    want = reference(served, PROMPT, 24, seed=1234, **knobs)
    assert answer["tokens"] == want
    assert answer["prompt_tokens"] == list(PROMPT.encode())
    assert answer["finish_reason"] == "length" and answer["seed"] == 1234
    assert len(answer["labels"]) == len(PROMPT.encode()) + 24
    assert answer["labels"][PROMPT.index("\n")] == "\\n"  # the prompt's newline, escaped
    assert answer["total_ms"] >= answer["queued_ms"] > 0


def test_a_seed_reproduces_and_a_missing_one_is_returned(client: httpx.Client) -> None:
    body = {"prompt": "class ", "max_new_tokens": 16, "temperature": 1.0}
    first = client.post("/api/generate", json=body).json()
    again = client.post("/api/generate", json={**body, "seed": first["seed"]}).json()
    assert again["tokens"] == first["tokens"]
    other = client.post("/api/generate", json={**body, "seed": first["seed"] + 1}).json()
    assert other["tokens"] != first["tokens"]


def test_eos_stops_after_the_eos_token(client: httpx.Client, served: Served) -> None:
    free = client.post(
        "/api/generate", json={"prompt": PROMPT, "max_new_tokens": 24, "temperature": 0}
    ).json()["tokens"]
    eos = free[5]
    cut = free[: free.index(eos) + 1]
    body = {"prompt": PROMPT, "max_new_tokens": 24, "temperature": 0, "eos": eos}
    answer = client.post("/api/generate", json=body).json()
    assert answer["tokens"] == cut and answer["finish_reason"] == "eos"
    assert answer["tokens"] == reference(served, PROMPT, 24, seed=0, temperature=0, eos=eos)


def test_zero_new_tokens(client: httpx.Client) -> None:
    answer = client.post("/api/generate", json={"prompt": "x", "max_new_tokens": 0}).json()
    assert answer["tokens"] == [] and answer["text"] == "" and answer["finish_reason"] == "length"


def test_the_stream_is_the_answer_token_by_token(client: httpx.Client) -> None:
    body = {"prompt": "if x:\n", "max_new_tokens": 12, "seed": 5, "temperature": 0.8, "top_k": 40}
    whole = client.post("/api/generate", json=body).json()
    with client.stream("POST", "/api/generate/stream", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse(response.read().decode())
    names = [name for name, _ in events]
    assert names == ["start", *["token"] * 12, "done"]
    start, done = events[0][1], events[-1][1]
    assert start["prompt_tokens"] == list(b"if x:\n") and start["labels"][-1] == "\\n"
    tokens = [data for name, data in events if name == "token"]
    assert [t["index"] for t in tokens] == list(range(12))
    assert [t["token"] for t in tokens] == whole["tokens"] == done["tokens"]
    assert [t["label"] for t in tokens] == whole["labels"][6:]
    assert done["text"] == whole["text"] and done["seed"] == 5


def test_non_printable_bytes_are_escaped(client: httpx.Client) -> None:
    tokens = [0x1B, 0x5B, 0x32, 0x4A, 0x3C, 0xC3, 0xA9, 0x09, 0x5C, 0xFF]
    answer = client.post("/api/attention", json={"tokens": tokens, "layer": 0, "head": 0}).json()
    assert answer["labels"] == [
        "\\x1b",
        "[",
        "2",
        "J",
        "<",
        "\\xc3",
        "\\xa9",
        "\\t",
        "\\\\",
        "\\xff",
    ]


def test_attention_is_the_backbone_trace(client: httpx.Client, served: Served) -> None:
    tokens = list(b"def f(x):\n    return x")
    answer = client.post("/api/attention", json={"tokens": tokens}).json()
    cfg = served.config
    assert answer["layers"] == list(range(cfg.L)) and answer["heads"] == list(range(cfg.H))
    got = torch.tensor(answer["attention"], dtype=torch.float64)  # (L, H, t, t)
    assert got.shape == (cfg.L, cfg.H, len(tokens), len(tokens))
    ids = torch.tensor([tokens])
    for layer in range(cfg.L):
        _, trace = served.model.forward_with_attn_trace(ids, layer, return_full_attn=True)
        assert trace["attn_full"] is not None
        want = trace["attn_full"][0].double()  # (H, t, t)
        torch.testing.assert_close(got[layer], want, rtol=0, atol=5e-7)  # rounded to 6 places
    assert torch.equal(got.triu(diagonal=1), torch.zeros_like(got))  # causal
    torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1], dtype=torch.float64),
                               rtol=0, atol=len(tokens) * 5e-7)  # fmt: skip
    one = client.post("/api/attention", json={"tokens": tokens, "layer": 1, "head": 0}).json()
    assert one["layers"] == [1] and one["heads"] == [0]
    assert one["attention"][0][0] == answer["attention"][1][0]


def _error(client: httpx.Client, path: str, status: int, field: str, **request: Any) -> None:
    response = client.post(path, **request)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field, body
    assert body["detail"].startswith(f"{field}: ") and body["errors"][0]["field"] == field


GOOD = {"prompt": "def ", "max_new_tokens": 4}
BAD_GENERATE = [
    ("prompt over T-1 bytes", {**GOOD, "prompt": "x" * 64}, 422, "prompt"),
    ("prompt of multi-byte chars over T-1", {**GOOD, "prompt": "é" * 32}, 422, "prompt"),
    ("prompt empty", {**GOOD, "prompt": ""}, 422, "prompt"),
    ("prompt missing", {"max_new_tokens": 4}, 422, "prompt"),
    ("prompt not a string", {**GOOD, "prompt": 5}, 422, "prompt"),
    (
        "max_new_tokens past T",
        {**GOOD, "prompt": "x" * 40, "max_new_tokens": 30},
        422,
        "max_new_tokens",
    ),
    ("max_new_tokens past the server cap", {**GOOD, "max_new_tokens": 49}, 422, "max_new_tokens"),
    ("max_new_tokens negative", {**GOOD, "max_new_tokens": -1}, 422, "max_new_tokens"),
    ("max_new_tokens a string", {**GOOD, "max_new_tokens": "4"}, 422, "max_new_tokens"),
    ("max_new_tokens a bool", {**GOOD, "max_new_tokens": True}, 422, "max_new_tokens"),
    ("max_new_tokens a float", {**GOOD, "max_new_tokens": 4.5}, 422, "max_new_tokens"),
    ("temperature negative", {**GOOD, "temperature": -0.1}, 422, "temperature"),
    ("temperature too high", {**GOOD, "temperature": 100.5}, 422, "temperature"),
    ("temperature a string", {**GOOD, "temperature": "hot"}, 422, "temperature"),
    ("top_k zero", {**GOOD, "top_k": 0}, 422, "top_k"),
    ("top_k over V", {**GOOD, "top_k": 257}, 422, "top_k"),
    ("top_p zero", {**GOOD, "top_p": 0}, 422, "top_p"),
    ("top_p over one", {**GOOD, "top_p": 1.5}, 422, "top_p"),
    ("seed negative", {**GOOD, "seed": -1}, 422, "seed"),
    ("seed over 2**63-1", {**GOOD, "seed": 2**63}, 422, "seed"),
    ("eos negative", {**GOOD, "eos": -1}, 422, "eos"),
    ("eos over V-1", {**GOOD, "eos": 256}, 422, "eos"),
    ("an unknown field", {**GOOD, "temprature": 0.5}, 422, "temprature"),
]


@pytest.mark.parametrize(("body", "status", "field"), [c[1:] for c in BAD_GENERATE],
                         ids=[c[0] for c in BAD_GENERATE])  # fmt: skip
@pytest.mark.parametrize("path", ["/api/generate", "/api/generate/stream"])
def test_bad_generate_requests_name_the_field(
    client: httpx.Client, path: str, body: dict[str, Any], status: int, field: str
) -> None:
    _error(client, path, status, field, json=body)


@pytest.mark.parametrize(
    ("content", "status", "field"),
    [
        (b'{"prompt": "def ", "max_new_tokens": ', 400, "body"),  # not JSON
        (b"prompt=def", 400, "body"),
        (b'["def "]', 422, "body"),  # JSON, not an object
        (b'{"prompt": "def ", "temperature": NaN}', 422, "temperature"),
        (b'{"prompt": "def ", "top_p": Infinity}', 422, "top_p"),
    ],
)
def test_bodies_that_are_not_a_request_object(
    client: httpx.Client, content: bytes, status: int, field: str
) -> None:
    headers = {"content-type": "application/json"}
    _error(client, "/api/generate", status, field, content=content, headers=headers)


def test_a_body_over_the_limit_is_refused_before_it_is_read(client: httpx.Client) -> None:
    big = json.dumps({"prompt": "x" * 5000, "max_new_tokens": 1}).encode()  # limit: 4096
    _error(client, "/api/generate", 413, "body", content=big,
           headers={"content-type": "application/json"})  # fmt: skip

    def chunks():  # no Content-Length: counted as it streams in
        for _ in range(10):
            yield b" " * 1000

    _error(client, "/api/attention", 413, "body", content=chunks(),
           headers={"content-type": "application/json"})  # fmt: skip


BAD_ATTENTION = [
    ("no tokens", {"tokens": []}, "tokens"),
    ("tokens missing", {"layer": 0}, "tokens"),
    ("a token over V-1", {"tokens": [1, 256]}, "tokens"),
    ("a negative token", {"tokens": [-1]}, "tokens"),
    ("more tokens than T", {"tokens": [1] * 65}, "tokens"),
    ("a token as a string", {"tokens": ["a"]}, "tokens.0"),
    ("a layer the model lacks", {"tokens": [1, 2], "layer": 2}, "layer"),
    ("a negative layer", {"tokens": [1, 2], "layer": -1}, "layer"),
    ("a head the model lacks", {"tokens": [1, 2], "head": 4}, "head"),
    ("a path", {"tokens": [1], "path": "/etc/passwd"}, "path"),
]


@pytest.mark.parametrize(("body", "field"), [c[1:] for c in BAD_ATTENTION],
                         ids=[c[0] for c in BAD_ATTENTION])  # fmt: skip
def test_bad_attention_requests_name_the_field(
    client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    _error(client, "/api/attention", 422, field, json=body)


def test_unknown_routes_and_methods_answer_json(client: httpx.Client) -> None:
    missing = client.get("/etc/passwd")
    assert missing.status_code == 404 and missing.json()["field"] == "path"
    wrong = client.get("/api/generate")
    assert wrong.status_code == 405 and wrong.json()["field"] == "path"


def test_the_server_goes_on_after_every_error(client: httpx.Client) -> None:
    for _, body, _, _ in BAD_GENERATE:
        client.post("/api/generate", json=body)
    client.post("/api/generate", content=b"{", headers={"content-type": "application/json"})
    answer = client.post("/api/generate", json={**GOOD, "seed": 3})
    assert answer.status_code == 200 and len(answer.json()["tokens"]) == 4
    assert client.get("/api/health").json()["failed"] == 0
