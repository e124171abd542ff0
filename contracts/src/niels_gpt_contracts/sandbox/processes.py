"""Subprocesses for untrusted code: own session, time limit, no survivors.

Each run starts in a new session (process group). When it ends, or times out,
the whole group is killed. A process that escaped its group (double fork plus
``setsid``) is reparented to the checker, which registers itself as a child
subreaper on Linux (``prctl(PR_SET_CHILD_SUBREAPER)``), and is killed and
reaped after the run. Elsewhere only the group kill applies (see SECURITY.md).

A signal that ends the verdict (SIGTERM, SIGINT, SIGHUP, SIGQUIT) ends the
whole tree too: ``ending_on_signals`` kills every descendant (psutil's process
tree, each one's process group as well) before ``Ended`` unwinds the checker,
which then exits non-zero with no verdict.
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

import psutil  # type: ignore[import-untyped]

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_active: set[int] = set()
_lock = threading.Lock()
_ended: list[int] = []  # the signal that ended this verdict, once one came


class Ended(BaseException):
    """A signal ended the verdict; its workers are already killed. Not an ``Exception``:
    nothing that handles errors may turn it into a verdict."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"ended by {signal.Signals(signum).name}")


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
    """Pids whose parent is this process (psutil's process table)."""
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process().children()]
    return []


def descendants(root: int | None = None) -> dict[int, int]:
    """``pid -> process group`` of every live (not zombie) process below ``root``
    (this process by default), in psutil's process tree; empty where there is none.

    A process that exits while it is read is left out.
    """
    found: dict[int, int] = {}
    try:
        below = psutil.Process(os.getpid() if root is None else root).children(recursive=True)
    except psutil.Error:
        return found
    for process in below:
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = os.getpgid(process.pid)
    return found


def kill_tree(rounds: int = 100) -> int:
    """SIGKILL every descendant and its process group until none is left; how many."""
    mine = os.getpgrp()
    killed: set[int] = set()
    for _ in range(rounds):
        found = descendants()
        if not found:
            break
        for pid, group in found.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if group != mine:
                    os.killpg(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.01)
    for pid in _children():  # reap the children, whose exit nobody else will wait for now
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    return len(killed)


def ended() -> int | None:
    """The signal that ended this verdict, or ``None``."""
    return _ended[0] if _ended else None


@contextlib.contextmanager
def ending_on_signals(code: int) -> Iterator[None]:
    """While inside: a SIGTERM, SIGINT, SIGHUP or SIGQUIT kills every descendant and
    raises ``Ended`` in the main thread; a second one exits at once with ``code``
    (never 0). Outside the main thread nothing is installed (and nothing changes)."""
    if code == 0:
        raise ValueError("a verdict ended by a signal never exits 0")

    def handler(signum: int, _frame: object) -> None:
        if _ended:  # a second signal while unwinding: no more waiting
            kill_tree()
            os._exit(code)
        _ended.append(signum)
        kill_tree()
        raise Ended(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _ended.clear()
    before = {sig: signal.signal(sig, handler) for sig in ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def refuse_if_ended() -> None:
    """Raise ``Ended`` once a signal ended the verdict: no new worker may start."""
    if _ended:
        raise Ended(_ended[0])


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
    refuse_if_ended()
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
