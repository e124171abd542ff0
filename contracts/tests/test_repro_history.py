"""The reproducer replays the calls before the failing one, shrunk (issue 50, no verdict run).

A stage function with a call counter (each call scales by how often it was
called) answers its first call right and every later one wrong: the failing
call alone passes in a fresh process. Its calls are captured as a capture
run's worker sends them; ``repro.write`` must put the calls before the pick
into the reproducer's history, and ``repro.shrink``, running the script in
a sandbox on the stage's code, must keep the shortest prefix that still
fails (one call here, of two).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from niels_gpt_contracts.sandbox import _oracle_capture, _oracle_kit
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Stream, read_stream
from niels_gpt_contracts.verdict import explain, repro

STAGE = """
import torch

CALLS = [0]


def scaled(x: torch.Tensor) -> torch.Tensor:
    CALLS[0] += 1  # the bug: a counter that outlives the call
    return x * CALLS[0]


def plain(x: torch.Tensor) -> torch.Tensor:
    return x + 1
"""


@pytest.fixture
def stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "src"
    (src / "counted").mkdir(parents=True)
    (src / "counted" / "__init__.py").write_text(STAGE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(src))
    return src


def _stream(calls: list[tuple[str, object]]) -> Stream:
    """The calls' capture frames and answers, in order, as a capture run sends them."""
    pipe = io.BytesIO()
    frames = _oracle_kit.Frames(pipe)
    o = _oracle_kit.Oracle("counted", 1, frames, run=lambda _: True, watch={})
    o.capture = _oracle_capture.capture
    for name, fn in calls:
        o.call(name, fn, desc="B=1 T=3", stages=1, reduction=1)  # type: ignore[arg-type]
    frames.write({"kind": "done"})
    stream = Stream("capture")
    assert read_stream(io.BytesIO(pipe.getvalue()), stream)
    return stream


def _run(script: Path, src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip


def test_a_failure_that_needs_earlier_calls_replays_the_shortest_prefix(
    stage: Path, tmp_path: Path
) -> None:
    import counted

    x = torch.arange(3, dtype=torch.float64)
    calls = [("a", partial(counted.scaled, x)), ("z", partial(counted.plain, x))]
    calls.append(("b", partial(counted.scaled, x)))
    got = _stream(calls)
    base = Stream("base", calls={("counted", "b"): got.calls[("counted", "a")]})  # x * 1
    pick = [explain.Failed("counted", "b", "B=1 T=3", False)]
    order = ["a", "z", "b"]
    script = repro.write(tmp_path / "out", "counted", pick, got, {False: base}, ["counted"], order)
    meta = json.loads((script.parent / "meta.json").read_text(encoding="utf-8"))
    assert [step["call"] for step in meta["history"]] == ["a", "z"]
    assert _run(script, stage).returncode == 1  # replayed: the counter is at 3
    alone = _run(script, stage, "--history", "0")
    assert alone.returncode == 0, alone.stdout + alone.stderr  # a fresh process passes

    box = Sandbox.prepare(sys.executable, tmp_path / "scratch", ["counted"], 1)
    note = repro.shrink(box, [stage], script, timeout=300)
    assert note == "replays 1 earlier call(s) of 2"
    meta = json.loads((script.parent / "meta.json").read_text(encoding="utf-8"))
    assert [step["call"] for step in meta["history"]] == ["a"]
    done = _run(script, stage)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "replaying 1 earlier call(s) first: a last" in done.stdout
