"""``.ci/schedule.py`` over a fake ``nox``: order by needs, failures, NOT RUN, strays killed.

The fake ``nox`` on ``PATH`` plays each session by its name: ``leaves`` starts
a ``sleep`` that outlives it (as a pytest-xdist worker or a test's server can),
``fails`` exits 3, any other prints its name and passes. Where this machine
allows cpuacct groups (root, cgroup v1), the sleeper is in ``leaves``'s group
and must be killed when that session ends, and no group stays behind.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_NOX = """#!/bin/sh
# nox -s NAME [-- ARGS]
case "$2" in
  leaves) sleep 300 & echo "$!" > "$PIDS/leaves.pid"; echo "left a sleeper";;
  fails) echo "broken on purpose"; exit 3;;
  *) echo "ran $2 $*";;
esac
"""


def _schedule(tmp_path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_schedule", ROOT / ".ci" / "schedule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_schedule"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    vars(module).update(ROOT=tmp_path, LOGS=tmp_path / ".ci-logs")
    return module


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat_file = Path(f"/proc/{pid}/stat")
    state = stat_file.read_text().split()[2] if stat_file.exists() else ""
    return state != "Z"  # a killed process not yet reaped is a zombie: dead


def test_sessions_run_by_needs_and_failures_stop_what_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nox = bin_dir / "nox"
    nox.write_text(FAKE_NOX)
    nox.chmod(nox.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PIDS", str(tmp_path))
    schedule = _schedule(tmp_path)
    session = schedule.Session
    monkeypatch.setattr(
        schedule,
        "SESSIONS",
        (
            session("leaves"),
            session("fails"),
            session("after-fails", needs=("fails",)),
            session("after-leaves", ("-k", "x"), needs=("leaves",)),
        ),
    )
    monkeypatch.setattr(sys, "argv", ["schedule.py", "--slots", "2"])

    assert schedule.main() == 1
    out = capsys.readouterr().out
    summary = out.split("===== summary:", 1)[1]
    assert "nox -s fails FAILED (exit status 3)" in summary
    assert "nox -s after-fails NOT RUN: a session it needs failed" in summary
    assert "nox -s after-leaves passed" in summary
    assert "ran after-leaves -s after-leaves -- -k x" in out  # the arguments reach nox
    assert "===== fails =====\nbroken on purpose" in out  # each log printed whole
    sleeper = int((tmp_path / "leaves.pid").read_text())
    if os.access(schedule.CPUACCT, os.W_OK):
        assert "nox -s leaves passed" in summary
        assert "1 process(es) it left behind killed" in summary
        deadline = time.monotonic() + 10
        while _alive(sleeper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(sleeper), "the session's stray sleep outlived it"
        left = [g.name for g in schedule.CPUACCT.glob(f"ci-{os.getpid()}-*")]
        assert not left, f"groups left behind: {left}"
    else:  # no groups here: only wall times, and nothing can find the stray
        os.kill(sleeper, 9)
        assert " s CPU" not in summary


def test_a_need_not_listed_before_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = _schedule(tmp_path)
    monkeypatch.setattr(schedule, "SESSIONS", (schedule.Session("a", needs=("b",)),))
    monkeypatch.setattr(sys, "argv", ["schedule.py"])
    with pytest.raises(SystemExit) as exit_info:
        schedule.main()
    assert exit_info.value.code == 2
    assert "a needs ['b'], not listed before it" in capsys.readouterr().err


def test_the_landing_run_leaves_the_slow_judges_to_full(tmp_path: Path) -> None:
    schedule = _schedule(tmp_path)
    session = schedule.Session
    listed = (session("lint"), session("mutants", ("-x",), ("lint",), full_only=True))
    assert [s.name for s in schedule.tier(listed, full=False)] == ["lint"]
    assert schedule.tier(listed, full=True) == listed
    real = {s.name for s in schedule.tier(schedule.SESSIONS, full=False)}
    # the README's test command is in every run
    assert {"lint", "typecheck", "test-cpu", "test-mps", "test-contracts"} <= real
