"""Run CI's nox sessions side by side on a small machine, each when what it needs is done.

``.ci/run`` calls this after installing nox. Every session below runs as
``nox -s NAME`` (with its arguments) once the sessions it ``needs`` have
passed; at most ``--slots`` run at a time, started in the order listed, so
the longest chains go first. A session's output goes to ``.ci-logs/NAME.log``
and is printed whole when it ends, under a line with its wall time and the
CPU it used. Every session runs unless one it needs failed; the exit status
is 1 if any session failed or was not run, else 0. ``--full`` (``.ci/run
--full``) adds the slow judges a landing run leaves out (see ``SESSIONS``).

The CPU is counted in a cgroup v1 ``cpuacct`` group of the session's own
where the machine allows it (root): it then covers every descendant,
pytest-xdist's workers and the checker's sandbox workers included. Elsewhere
only the wall time is printed. On a shared 2-core machine the CPU all
sessions use together sets the run's length more than any one wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".ci-logs"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@dataclass(frozen=True)
class Session:
    """One ``nox -s`` call: its name, the arguments after ``--``, what must pass first,
    and whether only ``--full`` runs it."""

    name: str
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    full_only: bool = False


def tier(sessions: tuple[Session, ...], full: bool) -> tuple[Session, ...]:
    """The sessions one run starts: all of them with ``full``, else those not ``full_only``."""
    return sessions if full else tuple(s for s in sessions if not s.full_only)


# In starting order. lint builds the shared dev environment every other
# session with "lint" in its needs runs in; the wheel sessions build their own
# venvs (and the wheels, once, in .nox/_wheelhouse) and start at once.
# A landing run (``.ci/run``) is meant to fit twelve minutes of this 2-core
# machine: the README's test command, the gate and the app from its wheels
# (about 1420 CPU-s in a clean-clone run, 2026-12-07: 739 s on its two cores,
# just over the target). ``.ci/run --full`` adds the rest (over two hours),
# with their CPU-s in a clean-clone run: the experiment from its wheels (156),
# every README's examples from their install lines (129), the hooks through
# pre-commit (47), the mutant proof of all 273 catalogued bugs (422), every
# scenario rather than none (75; 43 of them took 5800 in one run), the
# workflow replay (325), each float64 reference at a seed drawn for the run
# (120, measured alone) and the Hugging Face Llama peer from the wheels
# (test-peers).
SESSIONS = (
    Session("lint"),
    Session("test-serve"),
    Session("test-experiments", full_only=True),
    Session("test-contracts", needs=("lint",)),
    Session("test-scenarios", needs=("lint",), full_only=True),
    Session("test-reseeded", needs=("lint",), full_only=True),
    Session("mutants", needs=("lint",), full_only=True),
    Session("test-cpu", needs=("lint",)),
    Session("test-mps", needs=("lint",)),
    Session("contracts", needs=("test-cpu", "test-mps")),  # reads their reports
    Session("test-workflow", needs=("lint",), full_only=True),
    Session("test-readmes", needs=("lint",), full_only=True),
    Session("typecheck", needs=("lint",)),
    Session("test-hooks", needs=("lint",), full_only=True),
    Session("test-peers", full_only=True),
)


@dataclass
class Running:
    """A started session: its process, log, start time and CPU group (if any)."""

    session: Session
    process: subprocess.Popen[bytes]
    log: Path
    started: float
    group: Path | None = None


def _group(name: str) -> Path | None:
    """A fresh cpuacct group for one session, or None where none can be made."""
    if not os.access(CPUACCT, os.W_OK):
        return None
    group = CPUACCT / f"ci-{os.getpid()}-{name}"
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def _kill_strays(group: Path) -> int:
    """Kill what a finished session left running in its group; how many there were.

    nox's exit does not wait for every descendant (pytest-xdist workers, a
    server a test started): those still in the group are killed, so no
    session's leftovers eat the next one's CPU.
    """
    strays = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(strays)


def _remove(group: Path) -> None:
    """Remove an ended session's group once the kernel lets go of it (EBUSY while a
    process in it is still being reaped); one it keeps for seconds stays behind,
    which costs nothing and fails nothing."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.2)


def start(session: Session) -> Running:
    """``nox -s NAME [-- ARGS]`` with its output to its log, in its own CPU group."""
    log = LOGS / f"{session.name}.log"
    command = ["nox", "-s", session.name, *(("--", *session.args) if session.args else ())]
    group = _group(session.name)

    def enter_group() -> None:  # in the child, before exec: its descendants follow
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=enter_group
        )
    print(f"ci: started nox -s {session.name} {' '.join(session.args)}".rstrip(), flush=True)
    return Running(session, process, log, time.monotonic(), group)


def finish(run: Running, status: int) -> str:
    """Print the ended session's log and its figures; return its one-line summary."""
    wall = time.monotonic() - run.started
    cpu = ""
    if run.group is not None:
        strays = _kill_strays(run.group)
        seconds = int((run.group / "cpuacct.usage").read_text()) / 1e9
        _remove(run.group)
        cpu = f", {seconds:.1f} s CPU"
        if strays:
            cpu += f", {strays} process(es) it left behind killed"
    outcome = "passed" if status == 0 else f"FAILED (exit status {status})"
    line = f"ci: nox -s {run.session.name} {outcome}: {wall:.0f} s wall{cpu}"
    sys.stdout.write(f"===== {run.session.name} =====\n{run.log.read_text(errors='replace')}")
    print(line, flush=True)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=3, help="sessions at once (default 3)")
    parser.add_argument(
        "--full", action="store_true", help="every session, the slow judges too (see SESSIONS)"
    )
    options = parser.parse_args()
    slots = options.slots
    if slots < 1:
        parser.error(f"--slots must be at least 1, got {slots}")
    sessions = tier(SESSIONS, options.full)
    listed = [s.name for s in sessions]
    for i, session in enumerate(sessions):  # needs name earlier sessions: nothing waits forever
        unknown = set(session.needs) - set(listed[:i])
        if unknown:
            parser.error(f"{session.name} needs {sorted(unknown)}, not listed before it")
    LOGS.mkdir(exist_ok=True)
    began = time.monotonic()
    waiting, running = list(sessions), list[Running]()
    passed: set[str] = set()
    failed: set[str] = set()
    summary: list[str] = []
    while waiting or running:
        for session in [s for s in waiting if failed & set(s.needs)]:
            waiting.remove(session)
            failed.add(session.name)
            summary.append(f"ci: nox -s {session.name} NOT RUN: a session it needs failed")
            print(summary[-1], flush=True)
        for session in [s for s in waiting if set(s.needs) <= passed][: slots - len(running)]:
            waiting.remove(session)
            running.append(start(session))
        ended = [(run, run.process.poll()) for run in running]
        for run, status in ended:
            if status is None:
                continue
            running.remove(run)
            summary.append(finish(run, status))
            (passed if status == 0 else failed).add(run.session.name)
            if status == 0:  # its venvs and scratch are never reused by this run
                shutil.rmtree(ROOT / ".nox" / run.session.name / "tmp", ignore_errors=True)
        if all(status is None for _, status in ended):
            time.sleep(1)
    print(f"===== summary: {time.monotonic() - began:.0f} s =====")
    print("\n".join(summary), flush=True)
    return 0 if passed == {s.name for s in sessions} else 1


if __name__ == "__main__":
    sys.exit(main())
