"""Subprocesses for untrusted code: own session, time limit, no survivors.

Each run starts in a new session (process group). When it ends, or times out,
the whole group is killed. A process that escaped its group (double fork plus
``setsid``) is reparented to the checker, which registers itself as a child
subreaper on Linux (``prctl(PR_SET_CHILD_SUBREAPER)``), and is killed and
reaped after the run. Elsewhere only the group kill applies (see SECURITY.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
_active: set[int] = set()
_lock = threading.Lock()


@dataclass(frozen=True)
class Finished:
    """A finished run: exit status (``None`` on timeout), output, duration."""

    code: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); whether it took effect.

    The checker also makes itself non-dumpable: other processes of its user
    (the PR's code, when it cannot be confined) may not trace it or open its
    memory and descriptors through /proc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Pids whose parent is this process (Linux ``/proc``; empty elsewhere)."""
    me = os.getpid()
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me:
                found.append(int(entry.name))
    return found


def reap_orphans() -> int:
    """Kill and reap every child this process did not start itself; how many."""
    killed = 0
    with _lock:
        active = set(_active)
    for pid in _children():
        if pid in active:
            continue
        with contextlib.suppress(ProcessLookupError, ChildProcessError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            killed += 1
    return killed


@contextlib.contextmanager
def tracked(pid: int) -> Iterator[None]:
    """Mark a child started elsewhere (a fork server) as ours while it runs."""
    with _lock:
        _active.add(pid)
    try:
        yield
    finally:
        with _lock:
            _active.discard(pid)


def kill_group(pid: int) -> None:
    """SIGKILL the process group (session) led by ``pid``, if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
    stdin: str | None = None,
) -> Finished:
    """Run ``cmd`` to completion in its own session; kill what it leaves behind."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    with _lock:
        _active.add(proc.pid)
    try:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            code = None
        kill_group(proc.pid)
    finally:
        with _lock:
            _active.discard(proc.pid)
    reap_orphans()
    return Finished(code, out, err, time.monotonic() - start)
