"""What a long run needs: progress lines in a log, checkpoints by the clock, Ctrl+C.

The Ctrl+C and kill tests run ``python -m niels_gpt_experiments`` (``niels-train``)
in a subprocess whose output is a pipe, as under ``nohup`` or in CI, and signal
it once its first progress line is out: a tiny model, a run of 100,000 steps
that never gets far, so each test is a few seconds of CPU.
"""

from __future__ import annotations

import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from niels_gpt_experiments import checkpoint
from niels_gpt_experiments import trainer as trainer_module
from niels_gpt_experiments.cli import INTERRUPTED, interrupted_text, train_main
from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.interrupt import StopRequest, TrainingInterrupted
from niels_gpt_experiments.progress import Display

# A progress line as a log shows it.
LINE = re.compile(
    r"^step (\d+)/(\d+)  loss \d+\.\d{4}  [\d,]+ tokens/s  elapsed \d+:\d\d:\d\d  "
    r"ETA (?:\d+:\d\d:\d\d|-:--:--)$"
)


def _tiny_flags(corpus: Path, data: Path, out: Path) -> list[str]:
    return [
        *("--context", "16", "--width", "16", "--layers", "2", "--heads", "2"),
        *("--batch-size", "4", "--eval-batches", "1", "--sample-tokens", "4"),
        *("--corpus", str(corpus), "--data-dir", str(data), "--out", str(out)),
        *("--device", "cpu"),
    ]


def test_a_log_gets_a_plain_progress_line_per_interval(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured output is not a terminal: lines, not a bar that only shows when it stops."""
    flags = [*_tiny_flags(corpus_dir, data_dir, tmp_path / "run"), "--steps", "6"]
    assert train_main([*flags, "--eval-every", "3", "--progress-seconds", "0"]) == 0
    text = capsys.readouterr().out
    lines = [m for m in map(LINE.match, text.splitlines()) if m]
    assert [(int(m[1]), int(m[2])) for m in lines] == [(s, 6) for s in range(1, 7)], text
    assert "━" not in text  # no bar drawn into the log

    # A long interval: the first step and the last, nothing between.
    flags = [*_tiny_flags(corpus_dir, data_dir, tmp_path / "slow"), "--steps", "6"]
    assert train_main([*flags, "--eval-every", "3", "--progress-seconds", "3600"]) == 0
    text = capsys.readouterr().out
    assert [int(m[1]) for m in map(LINE.match, text.splitlines()) if m] == [1, 6], text


def test_a_terminal_keeps_the_live_bar() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=200)
    display = Display(True, total=3, every_s=0.0, console=console)
    assert display.live
    with display.running(0):
        for step in (1, 2, 3):
            display.step(step, 2.5, 1000.0)
    text = screen.getvalue()
    assert "━" in text and "step" in text and "elapsed" not in text


class _Run:
    """``niels-train FLAGS`` in a subprocess; its stdout lines arrive in ``lines``."""

    def __init__(self, flags: list[str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "niels_gpt_experiments", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            found = pattern.match(line.rstrip("\n"))
            if found:
                return found
        self.proc.kill()
        raise AssertionError(f"no line matching {pattern.pattern!r}: {''.join(self.out)}")

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """Exit status and stderr."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        finally:
            self.proc.kill()
        self._reader.join(timeout=5)
        return self.proc.returncode, err


def _long_run(corpus: Path, data: Path, out: Path, *more: str) -> list[str]:
    """A run far longer than any test waits: no evaluation, no scheduled checkpoint."""
    return [
        *_tiny_flags(corpus, data, out),
        *("--steps", "100000", "--eval-every", "100000", "--progress-seconds", "0.2"),
        *more,
    ]


def test_ctrl_c_saves_a_checkpoint_and_says_so_in_one_line(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    run = _Run(_long_run(corpus_dir, data_dir, out))
    run.wait_for(LINE, timeout=120)
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish()
    assert code == INTERRUPTED == 130, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    said = re.fullmatch(
        r"niels-train: interrupted: stopped after step (\d+), saved (\S+); "
        r"continue with the same flags and --resume\n",
        err,
    )
    assert said, err
    step, path = int(said[1]), Path(said[2])
    assert checkpoint.latest(out) == path == out / "checkpoints" / f"step-{step:07d}"

    # The same command with --resume goes on from that step.
    flags = _long_run(corpus_dir, data_dir, out, "--resume", "--stop-after", str(step + 2))
    assert train_main(flags) == 0
    assert f"resumed from step-{step:07d} at step {step}" in capsys.readouterr().out
    assert checkpoint.latest(out) == out / "checkpoints" / f"step-{step + 2:07d}"


def test_a_checkpoint_by_the_clock_survives_a_kill(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--checkpoint-minutes 0.01 (0.6 s): a checkpoint long before any step-based one."""
    out = tmp_path / "run"
    run = _Run(_long_run(corpus_dir, data_dir, out, "--checkpoint-minutes", "0.01"))
    run.wait_for(LINE, timeout=120)
    pointer = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 30
    while not pointer.is_file() and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.1)
    run.proc.kill()  # no chance to save anything more
    run.finish()
    found = checkpoint.latest(out)
    assert found is not None, "".join(run.out)
    step = int(found.name.removeprefix("step-"))
    assert 0 < step < 100000

    flags = _long_run(corpus_dir, data_dir, out, "--resume", "--stop-after", str(step + 1))
    assert train_main(flags) == 0
    assert f"resumed from {found.name} at step {step}" in capsys.readouterr().out


def test_checkpoint_minutes_and_progress_seconds_refuse_negative_values(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [*_tiny_flags(corpus_dir, data_dir, tmp_path / "run"), "--steps", "1"]  # if taken
    for flag in ("--checkpoint-minutes", "--progress-seconds"):
        with pytest.raises(SystemExit) as stop:
            train_main([*flags, flag, "-1"])
        assert stop.value.code == 2
        assert f"{flag} -1.0" in capsys.readouterr().err


def test_the_first_ctrl_c_asks_to_stop_and_the_second_stops_now() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    with stop.catching():
        signal.raise_signal(signal.SIGINT)  # Python's handler has run when this returns
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_mid_step_names_the_checkpoint_before(
    tiny: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``KeyboardInterrupt`` inside step 5: nothing saved, step 3's checkpoint named."""
    real = trainer_module.accumulate_gradients
    calls: list[int] = []

    def interrupted_in_step_5(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(trainer_module, "accumulate_gradients", interrupted_in_step_5)
    cfg = tiny(steps=6, eval_every=3)
    with pytest.raises(KeyboardInterrupt) as raised:  # not TrainingInterrupted: a plain one
        trainer_module.train(cfg)  # would end the pytest session, not fail this test
    stopped = raised.value
    assert isinstance(stopped, TrainingInterrupted), stopped
    saved = cfg.out_dir / "checkpoints" / "step-0000003"
    assert (stopped.step, stopped.checkpoint) == (4, saved)
    assert not stopped.saved_now and checkpoint.latest(cfg.out_dir) == saved
    assert interrupted_text(stopped, cfg.out_dir) == (
        f"interrupted during step 5; the last checkpoint is {saved}; "
        "continue with the same flags and --resume"
    )
    assert interrupted_text(None, cfg.out_dir).startswith(
        f"interrupted before the first step; the last checkpoint is {saved}"
    )
