"""Pytest runs for the mutant gate: fork servers or fresh interpreters.

``Launcher`` runs one stage's tests, clean or with one mutated module laid
over the import path, in the environment a ``TestEnv`` describes: the working
tree with this interpreter (``contracts mutants``) or the PR verdict's
sandbox (``contracts pr``). With ``fork`` (the default on POSIX) ``jobs`` fork
servers (``zygote.py``) import torch and pytest once and fork a child a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from niels_gpt_contracts.decoding import Malformed, decode
from niels_gpt_contracts.mutants import zygote
from niels_gpt_contracts.mutants.catalogue import Mutant, write_overlay

OVERLAY_MISSED = zygote.OVERLAY_MISSED  # the overlay was not what imported
SERVER_DIED = -1000  # no exit status: the fork server itself went away
ZYGOTE = Path(zygote.__file__).resolve()


@dataclass(frozen=True)
class TestEnv:
    """Where and how the stage tests run.

    ``rootdir`` holds the test files (their ids are relative to it) and
    ``config`` the pytest configuration; ``sources`` holds the modules the
    mutants patch (``packages/<pkg>/src/...``); ``environ(overlay)`` gives the
    variables of one run (the overlay first on the import path); ``plugins``
    are ``-p`` arguments every run needs (the PR verdict loads its plugins
    explicitly because autoloading is off there); ``scratch``, where given (the
    PR verdict's sandbox ``tmp``), is the fork servers' working directory and
    holds every run's folder, so nothing a run does by default (a relative
    write, a cache in the working directory) lands where the checker started.
    """

    python: str
    rootdir: Path
    config: Path | None
    sources: Path
    environ: Callable[[Path | None], dict[str, str]]
    plugins: tuple[str, ...] = ()
    track: Callable[[int], contextlib.AbstractContextManager[None]] | None = None
    scratch: Path | None = None

    @classmethod
    def for_repo(cls, root: Path, python: str = sys.executable) -> TestEnv:
        """The working tree, with the interpreter's own environment (``nox -s mutants``)."""
        config = root / "pyproject.toml"
        return cls(python, root, config if config.is_file() else None, root, _env)


def _pytest_args(env: TestEnv, stage: str, tests: list[str], hypothesis: bool) -> list[str]:
    root = env.rootdir
    args = ["-x", "-q", "-m", "not slow", f"--invariant-prefix={stage}.", f"--rootdir={root}"]
    args += list(env.plugins)
    for plugin in ("cacheprovider", "randomly", "xdist"):
        args += ["-p", f"no:{plugin}"]
    # Seeded where the tests use hypothesis; elsewhere its plugin is not even loaded.
    args += ["--hypothesis-seed=0"] if hypothesis else ["-p", "no:hypothesispytest"]
    if env.config is not None:
        args += ["-c", str(env.config)]
    return [*args, *(str(root / t) for t in tests)]


def _env(overlay: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(overlay), env.get("PYTHONPATH", "")) if p
        )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Runs go in parallel, one a core: keep torch from oversubscribing.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


@dataclass
class Run:
    code: int | None  # None: timed out
    output: str
    seconds: float


class _Ready(msgspec.Struct, frozen=True):
    """The fork server's first line (``zygote.main``): its imports are done."""

    ready: Literal[True]


class _Reply(msgspec.Struct, frozen=True):
    """The fork server's answer to one run: the exit status (``None``: timed out)."""

    code: int | None
    seconds: float


@dataclass
class _Server:
    proc: subprocess.Popen[str]
    ready: bool = False

    def ask(self, request: dict[str, object]) -> _Reply | str:
        """Send one request; the reply, or why there is none (the server is gone, or
        answered something else: either way it is not asked again)."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None:
            return "the fork server died"
        try:
            if not self.ready:
                decode(stdout.readline(), _Ready, "expected the fork server ready")
                self.ready = True
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            reply = stdout.readline()
        except OSError:
            return "the fork server died"
        except Malformed as err:
            return f"the fork server died before it was ready ({err})"
        if not reply:
            return "the fork server died"
        try:
            return decode(reply, _Reply, "expected the exit status of a run")
        except Malformed as err:
            return f"the fork server gave no exit status ({err})"


class Launcher:
    """Runs pytest for a plan, with or without an overlay, one run per call.

    With ``fork`` (the default on POSIX): ``jobs`` fork servers (``zygote.py``)
    import torch and pytest once and fork a child per run, which saves seconds
    of imports a run. Otherwise a fresh ``python`` subprocess per run.
    """

    def __init__(
        self,
        env: TestEnv,
        jobs: int,
        preload: Sequence[str],
        *,
        timeout: float,
        fork: bool = True,
    ) -> None:
        self.env = env
        self.timeout = timeout
        self.preload = tuple(preload)
        self.fork = fork and hasattr(os, "fork")
        self.tracking = contextlib.ExitStack()
        self.servers: queue.Queue[_Server] = queue.Queue()
        self.started: list[_Server] = []
        if self.fork:
            for _ in range(jobs):
                self._start()

    def _start(self) -> None:
        proc = subprocess.Popen(
            [self.env.python, str(ZYGOTE), *self.preload],
            env=self.env.environ(None),
            cwd=self.env.scratch,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        server = _Server(proc)
        if self.env.track is not None:
            self.tracking.enter_context(self.env.track(proc.pid))
        self.started.append(server)
        self.servers.put(server)

    def close(self) -> None:
        for server in self.started:
            with contextlib.suppress(OSError):
                if server.proc.stdin:
                    server.proc.stdin.close()
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
            if server.proc.stdout:
                server.proc.stdout.close()
        self.tracking.close()

    def run(
        self,
        stage: str,
        tests: list[str],
        hypothesis: bool,
        overlay_for: tuple[Mutant, str] | None,
        *,
        collect: bool = False,
    ) -> Run:
        """One pytest run of ``tests`` (ids relative to the rootdir), mutated when asked;
        ``collect``: only list the test ids the run would run (``--collect-only``)."""
        with tempfile.TemporaryDirectory(prefix="niels-mutant-", dir=self.env.scratch) as tmp:
            work = Path(tmp)
            overlay: Path | None = None
            module, want = "", ""
            if overlay_for is not None:
                mutant, source = overlay_for
                overlay = work / "overlay"
                want = str(write_overlay(mutant, source, overlay, self.env.sources))
                module = mutant.module
            args = _pytest_args(self.env, stage, tests, hypothesis)
            if collect:
                args.append("--collect-only")  # with -q: one test id a line
            elif overlay_for is None:  # the clean run: also time every test
                args += ["--durations=0", "--durations-min=0"]
            if self.fork:
                # Preloaded plugin packages (hypothesis) are imported before pytest
                # could mark them for assertion rewriting; that is expected here.
                args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
                r = self._forked(work, overlay, module, want, args)
            else:
                r = self._spawned(work, overlay, module, want, args)
            return Run(r.code, _relative_ids(r.output, work, self.env.rootdir), r.seconds)

    def _forked(
        self, work: Path, overlay: Path | None, module: str, want: str, args: list[str]
    ) -> Run:
        log = work / "pytest.log"
        request: dict[str, object] = {
            "cwd": str(work),
            "overlay": str(overlay) if overlay else "",
            "module": module,
            "want": want,
            "args": args,
            "log": str(log),
            "timeout": self.timeout,
        }
        server = self.servers.get()
        reply = server.ask(request)
        if isinstance(reply, str):
            self._start()  # replace the broken server for the runs still to come
            return Run(SERVER_DIED, reply, 0.0)
        self.servers.put(server)
        output = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        return Run(reply.code, output, reply.seconds)

    def _spawned(
        self, work: Path, overlay: Path | None, module: str, want: str, args: list[str]
    ) -> Run:
        request = {"overlay": str(overlay) if overlay else "", "module": module, "want": want}
        cmd = [self.env.python, str(ZYGOTE), "--once", json.dumps({**request, "args": args})]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=self.env.environ(overlay),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=self.timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            code = None
        return Run(code, out.decode("utf-8", "replace"), time.monotonic() - start)


def _relative_ids(output: str, work: Path, root: Path) -> str:
    """pytest names tests relative to the run's directory; name them from the repo root."""
    prefix = os.path.relpath(root, work).replace(os.sep, "/") + "/"
    return output.replace(prefix, "")
