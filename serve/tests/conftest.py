"""Fixtures of the app's tests: a tiny trained run, the app in-process, a real server.

These tests run against the installed wheels (``nox -s test-serve``). The
checkpoint is trained once a session by the real ``niels-train`` on a small
synthetic corpus (seconds), then loaded with the experiment's ``load_run``,
the way ``niels-serve`` loads it.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import torch

from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.loading import load_run
from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.cached import CachedEngine
from niels_gpt_serve.engine import Engine, Tokens
from niels_gpt_serve.limits import Limits
from niels_gpt_serve.local import ThreadServer
from niels_gpt_serve.trained import read_training

TINY_FLAGS = (
    *("--context", "64", "--width", "32", "--layers", "2", "--heads", "4"),
    *("--steps", "30", "--batch-size", "8", "--warmup", "3", "--lr", "0.01"),
    *("--eval-every", "30", "--eval-batches", "1", "--sample-tokens", "0"),
    *("--device", "cpu", "--no-progress"),
)
_WORDS = (
    *("def", "class", "return", "import", "from", "self", "value", "for", "while", "if"),
    *("else", "elif", "try", "except", "with", "as", "lambda", "yield", "None", "True"),
    *("False", "pass", "print", "range", "len", "list", "dict"),
)


def script(name: str) -> str:
    """A console script of the environment these tests run in."""
    found = Path(sys.executable).parent / name
    if not found.is_file():
        raise FileNotFoundError(f"{name} is not installed beside {sys.executable}")
    return str(found)


def write_corpus(root: Path) -> Path:
    """About 30 KiB of Python-looking lines in 24 files, the same every time."""
    rng = random.Random(7)
    for i in range(24):
        lines = [
            "    " * rng.randint(0, 2)
            + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 7)))
            for _ in range(40)
        ]
        path = root / f"mod_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A niels-train run folder: v1, T=64, C=32, 2 layers, 4 heads, 30 steps."""
    root = tmp_path_factory.mktemp("tiny")
    corpus = write_corpus(root / "corpus")
    out = root / "runs" / "tiny"
    subprocess.run(
        [script("niels-train"), "--corpus", str(corpus), "--data-dir", str(root / "data"),
         "--out", str(out), *TINY_FLAGS],
        check=True, capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def served(tiny_run: Path) -> Served:
    run = load_run(tiny_run, device="cpu")
    assert isinstance(run.model, GPT)
    training = read_training(tiny_run, run.step, run.meta)
    return Served(run.model, run.config, run.arch, tiny_run.name, run.step, training)


@pytest.fixture(scope="session")
def limits() -> Limits:
    return Limits(max_new_tokens=48, max_body_bytes=4096, max_batch=8, max_waiting=64)


@pytest.fixture(scope="session")
def client(served: Served, limits: Limits) -> Iterator[httpx.Client]:
    """The app in this process, on uvicorn on 127.0.0.1, and an httpx client for it."""
    with (
        ThreadServer(create_app(served, limits)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        yield http


class SlowEngine:
    """An engine (the app's default, cached) with a pause each step, so a test can act
    mid-generation.

    ``hold``: when given, every step after the first waits for it to be set (30 s at
    most), so a test acts while a generation is surely running, however loaded the
    machine is, and sets it to let the generation end. ``holding`` is set once a step
    has begun to wait, so the test knows the request sits in the running batch.
    Subclasses that set only ``inner``, ``name`` and ``pause_s`` get no hold (the
    class defaults).
    """

    hold: threading.Event | None = None
    steps = 0

    def __init__(
        self,
        served: Served,
        pause_s: float,
        inner: Engine | None = None,
        hold: threading.Event | None = None,
    ) -> None:
        self.inner = inner or CachedEngine(served.model)
        self.name, self.pause_s, self.hold, self.steps = self.inner.name, pause_s, hold, 0
        self.holding = threading.Event()

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        time.sleep(self.pause_s)
        if self.hold is not None and self.steps > 0:
            self.holding.set()
            self.hold.wait(timeout=30)
        self.steps += 1
        return self.inner.next_logits(batch)

    def release(self, key: int) -> None:
        self.inner.release(key)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def thread_server() -> type[ThreadServer]:
    return ThreadServer


@pytest.fixture(scope="session")
def server_url(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``niels-serve --checkpoint <tiny run> --port 0`` as a user starts it; its printed URL."""
    log = tmp_path_factory.mktemp("server") / "niels-serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [script("niels-serve"), "--checkpoint", str(tiny_run), "--port", "0",
             "--max-new-tokens", "48", "--max-batch", "16"],
            stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            found = re.search(r"open (http://127\.0\.0\.1:\d+)/", log.read_text())
            url = found.group(1) if found else None
            if url is None and (proc.poll() is not None or time.monotonic() > deadline):
                raise RuntimeError(f"niels-serve did not print its URL:\n{log.read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Print a line to the terminal past pytest's capture (the load test's figures)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def write(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n{line}", flush=True)

    return write
