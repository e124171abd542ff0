"""What the bench says while it runs: a line per section and per step, never a silent minute.

``section(name)`` and ``note(text)`` print ``[bench  12.3 s] ...`` to stderr
(the table goes to stdout). While a progress is running, a heartbeat thread
repeats the last step with its elapsed time whenever nothing was printed
for ``HEARTBEAT_S`` seconds, so a long step (a compile, a slow candidate on
a busy machine) still shows that it is alive.

``without_native_lines(pattern)`` drops lines that native code writes to
file descriptor 2 and that match ``pattern`` (the profiler's ``USDT: ...
profiler_start/stop`` lines, two per profiled step); every other line is
written back to stderr when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

__all__ = ["HEARTBEAT_S", "note", "running", "section", "without_native_lines"]

HEARTBEAT_S = 20.0


class _Progress:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.last_line = self.t0
        self.last_text = ""
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def say(self, text: str, *, remember: bool = True) -> None:
        with self.lock:
            now = time.perf_counter()
            print(f"[bench {now - self.t0:6.1f} s] {text}", file=sys.stderr, flush=True)
            self.last_line = now
            if remember:
                self.last_text = text.strip()

    def beat(self) -> None:
        while not self.stop.wait(1.0):
            quiet = time.perf_counter() - self.last_line
            if quiet >= HEARTBEAT_S and self.last_text:
                short = self.last_text if len(self.last_text) <= 60 else self.last_text[:57] + "..."
                self.say(f"  ... {quiet:.0f} s without a line, still in: {short}", remember=False)


_CURRENT: _Progress | None = None


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Time the lines from here, with the heartbeat on, until the block ends."""
    global _CURRENT
    progress = _CURRENT = _Progress()
    thread = threading.Thread(target=progress.beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        progress.stop.set()
        thread.join()
        _CURRENT = None


def section(name: str) -> None:
    """A section of the bench starts."""
    if _CURRENT is not None:
        _CURRENT.say(name)


def note(text: str) -> None:
    """A step inside the current section starts (silent outside ``running``)."""
    if _CURRENT is not None:
        _CURRENT.say(f"  {text}")


@contextlib.contextmanager
def without_native_lines(pattern: re.Pattern[str]) -> Iterator[None]:
    """Drop what native code writes to fd 2 and matches ``pattern``; pass the rest on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines():
                if not pattern.search(line):
                    print(line, file=sys.stderr)
