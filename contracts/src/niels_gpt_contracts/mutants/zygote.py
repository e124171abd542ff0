"""Fork server for mutant runs: pay the heavy imports (torch, hypothesis, pytest)
once, then fork a fresh child per test run.

Run as a script (``python zygote.py NAME...``); it imports the named modules,
prints one ready line, then serves one JSON request a line on stdin:
``{"cwd", "overlay", "module", "want", "args", "log", "timeout"}``. For each it
forks a child that puts the overlay first on ``sys.path`` (and on
``PYTHONPATH`` for any subprocess a test starts), checks that ``module``
resolves to ``want``, and runs ``pytest.main(args)`` with its output in
``log``. The reply is ``{"code": exit status or null on timeout, "seconds"}``.

The modules under test must not be among the preloaded ones: they are
imported in each child, after the overlay is in place. This file imports
nothing from the checker so that the children stay clean.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

OVERLAY_MISSED = 97
CHILD_CRASHED = 96


def check_overlay(module: str, want: str) -> str | None:
    """Why ``module`` does not import from ``want``, or None when it does."""
    found = importlib.util.find_spec(module)
    origin = getattr(found, "origin", None)
    if origin is None or os.path.realpath(origin) != os.path.realpath(want):
        return f"overlay not imported: {module} resolves to {origin}"
    return None


class NoShrink:
    """pytest plugin: hypothesis stops at the first failing example (and the
    ``slow`` marker that mutant runs deselect is always known).

    A mutant is killed by any failure; shrinking that example to a minimal
    one only costs time. Applied after conftest files loaded their profile,
    on top of it, so example counts and deadlines stay the project's own.
    """

    def pytest_configure(self, config: Any) -> None:
        # Mutant runs deselect ``-m "not slow"``; a project that has no slow
        # tests need not register the marker for that (``--strict-markers``).
        config.addinivalue_line("markers", "slow: deselected in mutant runs")
        if "hypothesis" not in sys.modules:
            return
        from hypothesis import Phase, settings

        current = settings.default
        if current is None:
            return
        phases = [p for p in current.phases if p not in (Phase.shrink, Phase.explain)]
        settings.register_profile("niels-mutant-run", parent=current, phases=phases)
        settings.load_profile("niels-mutant-run")


def run_tests(req: dict[str, Any]) -> int:
    """Overlay first on the import path, check it took, then pytest; the exit status."""
    if req["overlay"]:
        sys.path.insert(0, req["overlay"])
        parts = [req["overlay"], os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in parts if p))
        importlib.invalidate_caches()
        problem = check_overlay(req["module"], req["want"])
        if problem:
            sys.stderr.write(problem + "\n")
            return OVERLAY_MISSED
    import pytest

    pytest.hookimpl(trylast=True)(NoShrink.pytest_configure)
    return int(pytest.main(req["args"], plugins=[NoShrink()]))


def _child(req: dict[str, Any]) -> None:
    code = CHILD_CRASHED
    try:
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(req["cwd"])
        code = run_tests(req)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        # Python put this file's folder first (not under -P/PYTHONSAFEPATH, where
        # sys.path[0] is PYTHONPATH's first entry and must stay): tests must not
        # import from the checker's folder.
        sys.path.pop(0)
    if sys.argv[1:2] == ["--once"]:  # one run in this process (no fork)
        sys.exit(run_tests(json.loads(sys.argv[2])))
    for name in sys.argv[1:]:
        # A preload only saves time; whatever fails here the child imports for real.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(req)
        code = _wait(pid, float(req["timeout"]))
        out.write(json.dumps({"code": code, "seconds": time.monotonic() - start}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
