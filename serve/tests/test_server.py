"""The server as a process sees it: clients that leave, a full queue, the command line."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import niels_gpt_experiments.cli
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate as stage_generate
from niels_gpt_experiments.loading import load_run
from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.cli import apply_quant, listen
from niels_gpt_serve.demo import DEMO_FLAGS
from niels_gpt_serve.limits import Limits
from niels_gpt_serve.local import ThreadServer
from niels_gpt_serve.runs import ServeError, choose_run, newest_run

from .conftest import TINY_FLAGS, SlowEngine, script, write_corpus

ONE_SLOT = Limits(max_new_tokens=48, max_body_bytes=4096, max_batch=1, max_waiting=0)
LONG = {"prompt": "def ", "max_new_tokens": 48, "temperature": 1.0, "seed": 1}


def wait_for(http: httpx.Client, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll /api/health until ``done`` holds (at most 20 s); return the last reading."""
    deadline = time.monotonic() + 20
    while True:
        health: dict[str, Any] = http.get("/api/health").json()
        if done(health) or time.monotonic() > deadline:
            return health
        time.sleep(0.02)


def test_a_client_that_leaves_mid_stream_frees_its_slot(
    served: Served, thread_server: type[ThreadServer]
) -> None:
    app = create_app(served, ONE_SLOT, engine=SlowEngine(served, pause_s=0.05))
    with thread_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/api/generate/stream", json=LONG) as response:
            tokens = 0
            for line in response.iter_lines():
                tokens += line == "event: token"
                if tokens == 2:
                    busy = http.post("/api/generate", json={**LONG, "max_new_tokens": 2})
                    assert busy.status_code == 503 and busy.json()["field"] == "body"
                    assert busy.headers["retry-after"] == "1"
                    break  # leaving the block closes the connection mid-stream
        health = wait_for(http, lambda h: h["running"] == 0)
        assert health["running"] == 0 and health["cancelled"] == 1 and health["served"] == 0
        assert health["tokens"] < 48  # it stopped generating for the client that left
        again = http.post("/api/generate", json={**LONG, "max_new_tokens": 3})
        assert again.status_code == 200 and len(again.json()["tokens"]) == 3


def test_a_client_that_gives_up_on_a_json_answer_frees_its_slot(
    served: Served, thread_server: type[ThreadServer]
) -> None:
    app = create_app(served, ONE_SLOT, engine=SlowEngine(served, pause_s=0.05))
    with thread_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/api/generate", json=LONG, timeout=0.5)  # 48 steps take 2.4 s
        health = wait_for(http, lambda h: h["running"] == 0)
        assert health["cancelled"] == 1 and health["served"] == 0 and health["tokens"] < 48
        assert http.post("/api/generate", json={**LONG, "max_new_tokens": 2}).status_code == 200


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # A guard against a hang, not a timing: on CI's lanes (two shared cores, load 8)
    # the CLI's start (torch's import) alone took over 60 s.
    return subprocess.run(
        [script("niels-serve"), *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False,
    )  # fmt: skip


def test_bad_flags_and_a_bad_checkpoint_say_so(tmp_path: Path) -> None:
    port = run_cli("--port", "70000")
    assert port.returncode == 2 and "--port must be in [0, 65535], got 70000" in port.stderr
    batch = run_cli("--max-batch", "0")
    assert batch.returncode == 2 and "--max-batch 0: max_batch must be >= 1, got 0" in batch.stderr
    # Input errors, each named by its flag: exit 2 (a missing run folder was exit 1).
    missing = run_cli("--checkpoint", str(tmp_path / "nothing"))
    assert missing.returncode == 2
    assert "error: --checkpoint must be a niels-train run folder" in missing.stderr
    assert "Traceback" not in missing.stderr
    device = run_cli("--checkpoint", str(tmp_path / "nothing"), "--device", "tpu")
    assert device.returncode == 2 and "error: --device tpu: " in device.stderr
    (tmp_path / "a-file").write_text("")
    runs = run_cli("--runs", str(tmp_path / "a-file"))  # exit 1 once a demo training failed
    assert runs.returncode == 2 and f"error: --runs {tmp_path / 'a-file'}: " in runs.stderr
    both = run_cli("--demo", "--checkpoint", str(tmp_path))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_the_newest_run_is_chosen(tiny_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert newest_run(runs) is None
    older, newer = runs / "a" / "older", runs / "newer"
    shutil.copytree(tiny_run, older)
    shutil.copytree(tiny_run, newer)
    now = time.time()
    os.utime(older / "checkpoints" / "latest", (now, now))
    os.utime(newer / "checkpoints" / "latest", (now - 60, now - 60))
    said: list[str] = []
    assert choose_run(None, runs, said.append) == older
    assert said == [f"niels-serve: serving the newest run under {runs}/: {older}"]
    assert choose_run(newer, runs, said.append) == newer
    with pytest.raises(ServeError, match="must be a niels-train run folder"):
        choose_run(runs, runs, said.append)


def test_with_no_run_the_demo_model_is_trained_first_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo path as niels-serve takes it, tiny flags added (seconds, not minutes):
    trained once with the preset's flags, then served without training again; ``--demo``
    serves it even when another run is newer."""
    corpus = write_corpus(tmp_path / "corpus")
    asked: list[list[str]] = []
    real = niels_gpt_experiments.cli.train_main

    def train_main(argv: list[str]) -> int:
        asked.append(list(argv))
        return real([*argv, *TINY_FLAGS, "--corpus", str(corpus), "--data-dir", str(tmp_path)])

    monkeypatch.setattr(niels_gpt_experiments.cli, "train_main", train_main)
    said: list[str] = []
    runs = tmp_path / "runs"
    assert choose_run(None, runs, said.append) is None  # the shipped model: no training
    assert asked == [] and said == []
    run = choose_run(None, runs, said.append, shipped=False)
    assert run == runs / "demo" and (run / "checkpoints" / "latest").is_file()
    assert asked == [[*DEMO_FLAGS, "--out", str(runs / "demo"), "--resume"]]
    assert "training the demo model" in said[0]
    assert choose_run(None, runs, said.append) == run  # next time it is the newest run
    newer = runs / "newer"
    shutil.copytree(run, newer)
    later = time.time() + 60
    os.utime(newer / "checkpoints" / "latest", (later, later))
    assert choose_run(None, runs, said.append) == newer
    assert choose_run(None, runs, said.append, demo=True) == run
    assert len(asked) == 1  # finished: kept, never trained again


def test_the_listening_socket_gives_connections_without_nagle_delays() -> None:
    """asyncio sets TCP_NODELAY only where the socket names IPPROTO_TCP; without it
    every small server-sent event waits for the client's delayed ACK (~40 ms)."""

    async def accepted_nodelay() -> int:
        sock = listen("127.0.0.1", 0)
        seen: asyncio.Queue[int] = asyncio.Queue()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.put_nowait(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            got = await asyncio.wait_for(seen.get(), 10)
            writer.close()
        return got

    assert asyncio.run(accepted_nodelay()) != 0


def test_a_v0_run_is_served_too(tmp_path: Path) -> None:
    """niels-train --model v0 (LayerNorm + GELU blocks): generation and attention work alike."""
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "runs" / "v0"
    subprocess.run(
        [script("niels-train"), "--model", "v0", "--corpus", str(corpus), "--data-dir",
         str(tmp_path / "data"), "--out", str(run), *TINY_FLAGS],
        check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    loaded = load_run(run, device="cpu")
    assert loaded.arch == "v0" and isinstance(loaded.model, GPT)
    served = Served(loaded.model, loaded.config, loaded.arch, run.name, loaded.step)
    body = {"prompt": "def ", "max_new_tokens": 12, "temperature": 0.9, "top_k": 20, "seed": 4}
    with ThreadServer(create_app(served, ONE_SLOT)) as url, httpx.Client(base_url=url) as http:
        assert http.get("/api/model").json()["arch"] == "v0"
        answer = http.post("/api/generate", json=body).json()
        tokens = answer["prompt_tokens"] + answer["tokens"]
        maps = http.post("/api/attention", json={"tokens": tokens, "layer": 1}).json()
    ids = torch.tensor([list(b"def ")])
    want = stage_generate(served.model, ids, 12, temperature=0.9, top_k=20,
                          generator=torch.Generator().manual_seed(4))  # fmt: skip
    assert isinstance(want, torch.Tensor) and answer["tokens"] == want[0, 4:].tolist()
    _, trace = served.model.forward_with_attn_trace(torch.tensor([tokens]), 1, True)
    assert trace["attn_full"] is not None
    got = torch.tensor(maps["attention"][0], dtype=torch.float64)  # (H, t, t)
    torch.testing.assert_close(got, trace["attn_full"][0].double(), rtol=0, atol=5e-7)


def test_quant_int8_serves_the_quantized_model(tiny_run: Path) -> None:
    """--quant int8: the run's linear layers in int8, generation through the app as the stage's."""
    assert "invalid choice: 'int4'" in run_cli("--quant", "int4").stderr
    loaded = load_run(tiny_run, device="cpu")
    float_ids = torch.tensor([list(b"def ")])
    assert apply_quant(loaded.model, "none") == "" and not _int8_layers(loaded.model)
    assert apply_quant(loaded.model, "int8") == ", int8 linear weights"
    model = loaded.model
    assert isinstance(model, GPT) and _int8_layers(model) == 5 * loaded.config.L  # 5 a block
    assert model.lm_head.weight is model.tok_emb.weight  # the tied head stays
    served = Served(model, loaded.config, loaded.arch, tiny_run.name, loaded.step)
    body = {"prompt": "def ", "max_new_tokens": 12, "temperature": 0.9, "top_k": 20, "seed": 4}
    with ThreadServer(create_app(served, ONE_SLOT)) as url, httpx.Client(base_url=url) as http:
        answer = http.post("/api/generate", json=body).json()
    want = stage_generate(served.model, float_ids, 12, temperature=0.9, top_k=20,
                          generator=torch.Generator().manual_seed(4))  # fmt: skip
    assert isinstance(want, torch.Tensor) and answer["tokens"] == want[0, 4:].tolist()


def _int8_layers(model: torch.nn.Module) -> int:
    return sum(type(m).__name__ == "Int8Linear" for m in model.modules())
