"""A signal that ends ``contracts pr`` ends every process the verdict started.

The checker runs in a child process here, on a real scenario repository whose
PR adds a test that sleeps, so that sandboxed workers (each in a session of its
own) are running when the signal comes. Every descendant seen before the signal
is remembered by pid and start time: none may be alive afterwards, and the exit
status is an error, never a pass.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_mutants as tiny
from prkit import PrRepo

from niels_gpt_contracts.cli import EXIT_ERROR
from niels_gpt_contracts.sandbox import processes

SLEEPER = "\n\ndef test_waits():\n    import time\n\n    time.sleep(600)\n"
Seen = dict[int, str]  # pid -> its start time (field 22 of /proc/<pid>/stat)


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # fields from the state on: [0] is field 3


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """``pid -> (start time, session)`` of every live process below ``root``."""
    parent: dict[int, int] = {}
    info: dict[int, tuple[str, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                parent[int(entry.name)] = int(fields[1])
                info[int(entry.name)] = (fields[19], int(fields[3]), fields[0])
    found: dict[int, tuple[str, int]] = {}
    todo = [p for p, pp in parent.items() if pp == root]
    while todo:
        pid = todo.pop()
        if pid not in found and info[pid][2] != "Z":
            found[pid] = info[pid][:2]
            todo += [p for p, pp in parent.items() if pp == pid]
    return found


def _alive(seen: Seen) -> list[int]:
    out = []
    for pid, start in seen.items():
        fields = _stat(pid)
        if fields is not None and fields[19] == start and fields[0] != "Z":
            out.append(pid)
    return out


ON_PROC = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads the process tree in /proc"
)


def _slow_pr(pr_repo: PrRepo) -> None:
    test = "packages/rope/tests/test_rope.py"
    pr_repo.write(test, pr_repo.read(test) + SLEEPER)
    pr_repo.pr("rope", "a slow test")


def _ends_everything(
    cmd: list[str], sig: signal.Signals, env: dict[str, str] | None = None
) -> None:
    """Run ``cmd`` until a worker in a session of its own exists, signal it, and check
    that it exits 2 with one line of reason and that none of its descendants lives on."""
    checker = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    seen: Seen = {}
    try:
        deadline = time.monotonic() + 240
        sandboxed = False
        while not sandboxed and checker.poll() is None and time.monotonic() < deadline:
            tree = _tree(checker.pid)
            seen |= {pid: start for pid, (start, _) in tree.items()}
            # a worker in a session of its own, alive for a while: the sleeping test's run
            own = os.getsid(checker.pid)
            sandboxed = any(sid != own for _, sid in tree.values()) and len(seen) >= 2
            time.sleep(0.5 if not sandboxed else 0)
        assert sandboxed, checker.communicate(timeout=60)
        time.sleep(2)
        seen |= {pid: start for pid, (start, _) in _tree(checker.pid).items()}
        checker.send_signal(sig)
        out, err = checker.communicate(timeout=120)
    finally:
        if checker.poll() is None:
            os.killpg(checker.pid, signal.SIGKILL)
            checker.wait()
    time.sleep(1)
    survivors = _alive(seen)
    for pid in survivors:  # leave nothing behind, whatever the verdict on the checker
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"{len(survivors)} of {len(seen)} descendants survived"
    assert checker.returncode == EXIT_ERROR, (checker.returncode, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"contracts: error: ended by {sig.name}"), err[-3000:]
    assert out == ""


@ON_PROC
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signal_ends_the_verdict_and_every_worker(pr_repo: PrRepo, sig: signal.Signals) -> None:
    _slow_pr(pr_repo)
    cmd = [
        sys.executable, "-m", "niels_gpt_contracts.cli", "pr", "--repo", str(pr_repo.root),
        "--base", "main", "--head", "HEAD", "--python", sys.executable,
        "--cache-dir", str(pr_repo.cache), "--jobs", "1", "--skip-mutants",
    ]  # fmt: skip
    _ends_everything(cmd, sig)


@ON_PROC
def test_a_signal_ends_a_mutants_run_and_every_fork(tmp_path: Path) -> None:
    """``contracts mutants`` on ``test_mutants``'s tiny stage: its ``hangs`` mutant sleeps."""
    root = tmp_path / "repo"
    files = {
        "specs/tiny.toml": tiny.SPEC + tiny.CATALOGUE,
        tiny.MODULE: tiny.SOURCE,
        "packages/tiny/tests/test_tiny.py": tiny.TESTS,
        "pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["--import-mode=importlib"]\n',
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    shutil.copy(tiny.SCHEMA, root / "specs" / "spec.schema.json")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    cmd = [
        sys.executable, "-m", "niels_gpt_contracts.cli", "mutants", "--repo", str(root),
        "--mutant", "hangs", "--jobs", "1", "--timeout", "300", "--all",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root / "packages/tiny/src")}
    _ends_everything(cmd, signal.SIGTERM, env)


def test_the_handlers_are_the_callers_again_after_the_verdict() -> None:
    before = {sig: signal.getsignal(sig) for sig in processes.ENDING_SIGNALS}
    with processes.ending_on_signals(EXIT_ERROR):
        assert all(signal.getsignal(s) is not before[s] for s in before)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    with pytest.raises(ValueError, match="never exits 0"), processes.ending_on_signals(0):
        pass
