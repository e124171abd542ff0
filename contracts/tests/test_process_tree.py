"""The process tree the sandbox ends: read through psutil, zombies left out,
every descendant killed whatever session it moved to."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil  # type: ignore[import-untyped]

from niels_gpt_contracts.sandbox import processes

ESCAPES = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
    " start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended), waiting up to 10 s for it to end."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.01)
    return True


def test_every_descendant_is_seen_with_its_group_and_killed() -> None:
    child = subprocess.Popen([sys.executable, "-c", ESCAPES], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = processes.descendants()
        assert found[child.pid] == os.getpgid(child.pid)
        assert found[grandchild] == grandchild  # its own session: it leads its group
        assert child.pid in processes._children() and grandchild not in processes._children()
        assert processes.kill_tree() >= 2
        child.wait(timeout=10)  # reaped by kill_tree already
        assert not _alive(child.pid) and not _alive(grandchild)
        assert not set(processes.descendants()) & {child.pid, grandchild}
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_zombie_is_no_live_descendant() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while psutil.Process(done.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert done.pid not in processes.descendants()
    assert done.pid in processes._children()
    done.wait()
    assert processes.descendants(done.pid) == {}  # gone: nothing below it
