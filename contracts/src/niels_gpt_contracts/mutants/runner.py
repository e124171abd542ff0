"""Run each stage's tests clean, then once per mutant, in parallel.

Every run is a fresh ``python`` subprocess in its own temporary directory (so
the hypothesis example database of one mutant never leaks into another) that
runs pytest on the stage's test files with ``--invariant-prefix <stage>.``:
only tests claiming one of the stage's invariants run. A mutant run puts an
overlay directory holding the mutated module first on ``PYTHONPATH`` and
first checks that the import system really resolves the module to that copy;
if not, the run is an error, never a kill.

Verdicts from pytest's exit status: 1 (a test failed) kills the mutant, and
so do 2 and 4 (collection failed, or a test id the clean run collected is no
longer found: the mutated module raises on import); 0 means it survived;
anything else, or the per-mutant timeout, is an error. Mutant runs take the
clean run's tests fastest first and stop at the first failure; hypothesis
does not shrink a failing example there (a kill needs none). Kills are
cached in ``.mutants-cache.json`` under a key made of the mutant, the mutated
file, the stage's test files and the test configuration; a cached kill is not
run again unless the cache is disabled.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from niels_gpt_contracts.checks import invariants
from niels_gpt_contracts.checks.gate import load_specs
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.mutants import zygote
from niels_gpt_contracts.mutants.catalogue import (
    SRC_MARKER,
    Mutant,
    apply,
    catalogue,
    compile_problem,
    write_overlay,
)

Status = Literal["killed", "survived", "stale", "error"]
CACHE_FILE = ".mutants-cache.json"
CACHE_VERSION = 1
DEFAULT_TIMEOUT = 120.0
OVERLAY_MISSED = zygote.OVERLAY_MISSED  # the overlay was not what imported
SERVER_DIED = -1000  # no exit status: the fork server itself went away
ZYGOTE = Path(zygote.__file__).resolve()
# Files outside the stage that decide how its tests run (part of the cache key).
CONFIG_FILES = ("conftest.py", "pyproject.toml")


_FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass
class Verdict:
    mutant: Mutant
    status: Status
    reason: str
    cached: bool = False
    seconds: float = 0.0


@dataclass
class StageRun:
    """The clean run of one stage's claiming tests."""

    stage: str
    ok: bool
    reason: str
    seconds: float
    tests: list[str] = field(default_factory=list)


@dataclass
class MutantsResult:
    stages: list[str]
    clean: list[StageRun]
    verdicts: list[Verdict]

    @property
    def killed(self) -> int:
        return sum(v.status == "killed" for v in self.verdicts)

    @property
    def ok(self) -> bool:
        return all(v.status == "killed" for v in self.verdicts)


@dataclass
class Options:
    repo: Path = Path()
    stages: Sequence[str] = ()
    only: Sequence[str] = ()
    use_cache: bool = True
    jobs: int = 0
    timeout: float = DEFAULT_TIMEOUT
    python: str = sys.executable
    fork: bool = True
    progress: Callable[[str], None] | None = None


@dataclass
class _Plan:
    stage: str
    tests: list[str]
    mutants: list[Mutant]
    hypothesis: bool
    order: list[str] = field(default_factory=list)  # test ids, fastest first, from the clean run


def _sha(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogateescape"))
        digest.update(b"\0")
    return digest.hexdigest()


def _plugin_source() -> str:
    # Read, not imported: the CLI side of the checker stays apart from the plugin.
    return (Path(__file__).resolve().parents[1] / "pytest_plugin.py").read_text(encoding="utf-8")


class _Cache:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.entries: dict[str, dict[str, str]] = {}
        if path.is_file():
            with contextlib.suppress(ValueError, OSError):
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
                    self.entries = dict(data.get("kills", {}))

    def kill(self, name: str, key: str) -> str | None:
        entry = self.entries.get(name)
        if self.enabled and entry and entry.get("key") == key:
            return entry.get("reason", "")
        return None

    def record(self, verdicts: list[Verdict], keys: dict[str, str]) -> None:
        for v in verdicts:
            if v.cached:
                continue
            if v.status == "killed":
                self.entries[v.mutant.name] = {"key": keys[v.mutant.name], "reason": v.reason}
            else:
                self.entries.pop(v.mutant.name, None)
        payload = {"version": CACHE_VERSION, "kills": dict(sorted(self.entries.items()))}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def _pytest_args(root: Path, stage: str, tests: list[str], hypothesis: bool) -> list[str]:
    args = ["-x", "-q", "-m", "not slow", f"--invariant-prefix={stage}.", f"--rootdir={root}"]
    for plugin in ("cacheprovider", "randomly", "xdist"):
        args += ["-p", f"no:{plugin}"]
    # Seeded where the tests use hypothesis; elsewhere its plugin is not even loaded.
    args += ["--hypothesis-seed=0"] if hypothesis else ["-p", "no:hypothesispytest"]
    if (root / "pyproject.toml").is_file():
        args += ["-c", str(root / "pyproject.toml")]
    return [*args, *(str(root / t) for t in tests)]


_DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S.*?)\s*$", re.MULTILINE)


def _fastest_first(output: str) -> list[str]:
    """Test ids from a ``--durations=0`` report, quickest first (stable by name).

    Mutant runs stop at the first failure (``-x``), so running the cheap tests
    first makes a typical kill take a fraction of the suite.
    """
    total: dict[str, float] = {}
    for seconds, nodeid in _DURATION.findall(output):
        total[nodeid] = total.get(nodeid, 0.0) + float(seconds)
    return sorted(total, key=lambda n: (total[n], n))


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
class _Run:
    code: int | None  # None: timed out
    output: str
    seconds: float


@dataclass
class _Server:
    proc: subprocess.Popen[str]
    ready: bool = False

    def ask(self, request: dict[str, object]) -> dict[str, object] | None:
        """Send one request; the reply, or None when the server is gone."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None:
            return None
        try:
            if not self.ready:
                self.ready = stdout.readline().startswith('{"ready"')
                if not self.ready:
                    return None
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            reply = stdout.readline()
        except OSError:
            return None
        return json.loads(reply) if reply else None


class _Launcher:
    """Runs pytest for a plan, with or without an overlay, one run per call.

    With ``fork`` (the default on POSIX): ``jobs`` fork servers (``zygote.py``)
    import torch and pytest once and fork a child per run, which saves seconds
    of imports a run. Otherwise a fresh ``python`` subprocess per run.
    """

    def __init__(self, opts: Options, root: Path, jobs: int, preload: Sequence[str]) -> None:
        self.opts = opts
        self.root = root
        self.preload = tuple(preload)
        self.fork = opts.fork and hasattr(os, "fork")
        self.servers: queue.Queue[_Server] = queue.Queue()
        self.started: list[_Server] = []
        if self.fork:
            for _ in range(jobs):
                self._start()

    def _start(self) -> None:
        proc = subprocess.Popen(
            [self.opts.python, str(ZYGOTE), *self.preload],
            env=_env(None),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        server = _Server(proc)
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

    def run(self, p: _Plan, overlay_for: tuple[Mutant, str] | None) -> _Run:
        with tempfile.TemporaryDirectory(prefix="niels-mutant-") as tmp:
            work = Path(tmp)
            overlay: Path | None = None
            module, want = "", ""
            if overlay_for is not None:
                mutant, source = overlay_for
                overlay = work / "overlay"
                want = str(write_overlay(mutant, source, overlay))
                module = mutant.module
            if overlay_for is None:  # the clean run: also time every test
                args = _pytest_args(self.root, p.stage, p.tests, p.hypothesis)
                args += ["--durations=0", "--durations-min=0"]
            else:
                args = _pytest_args(self.root, p.stage, p.order or p.tests, p.hypothesis)
            if self.fork:
                # Preloaded plugin packages (hypothesis) are imported before pytest
                # could mark them for assertion rewriting; that is expected here.
                args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
                r = self._forked(work, overlay, module, want, args)
            else:
                r = self._spawned(work, overlay, module, want, args)
            return _Run(r.code, _relative_ids(r.output, work, self.root), r.seconds)

    def _forked(
        self, work: Path, overlay: Path | None, module: str, want: str, args: list[str]
    ) -> _Run:
        log = work / "pytest.log"
        request: dict[str, object] = {
            "cwd": str(work),
            "overlay": str(overlay) if overlay else "",
            "module": module,
            "want": want,
            "args": args,
            "log": str(log),
            "timeout": self.opts.timeout,
        }
        server = self.servers.get()
        reply = server.ask(request)
        if reply is None:
            self._start()  # replace the broken server for the runs still to come
            return _Run(SERVER_DIED, "the fork server died", 0.0)
        self.servers.put(server)
        output = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        code = reply["code"]
        seconds = reply["seconds"]
        return _Run(
            code if isinstance(code, int) else None,
            output,
            float(seconds) if isinstance(seconds, (int, float)) else 0.0,
        )

    def _spawned(
        self, work: Path, overlay: Path | None, module: str, want: str, args: list[str]
    ) -> _Run:
        request = {"overlay": str(overlay) if overlay else "", "module": module, "want": want}
        cmd = [self.opts.python, str(ZYGOTE), "--once", json.dumps({**request, "args": args})]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=_env(overlay),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=self.opts.timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            code = None
        return _Run(code, out.decode("utf-8", "replace"), time.monotonic() - start)


def _relative_ids(output: str, work: Path, root: Path) -> str:
    """pytest names tests relative to the run's directory; name them from the repo root."""
    prefix = os.path.relpath(root, work).replace(os.sep, "/") + "/"
    return output.replace(prefix, "")


def _first_failure(output: str) -> str:
    m = _FAILED_LINE.search(output)
    if m:
        return f"{m.group(1).lower()}: {m.group(2)}"
    tail = [line for line in output.strip().splitlines() if line.strip()]
    return tail[-1][:200] if tail else "no output"


def _judge(mutant: Mutant, run: _Run, timeout: float) -> Verdict:
    if run.code is None:
        return Verdict(mutant, "error", f"timeout after {timeout:g} s", seconds=run.seconds)
    if run.code == 0:
        return Verdict(mutant, "survived", "every claiming test passed", seconds=run.seconds)
    if run.code == 1:
        return Verdict(mutant, "killed", _first_failure(run.output), seconds=run.seconds)
    if run.code in (2, 4):  # the same selection collected cleanly, so the mutant broke it
        why = _first_failure(run.output)
        return Verdict(mutant, "killed", f"collection failed ({why})", seconds=run.seconds)
    if run.code == SERVER_DIED:
        return Verdict(mutant, "error", run.output, seconds=run.seconds)
    if run.code == OVERLAY_MISSED:
        return Verdict(mutant, "error", run.output.strip()[-300:], seconds=run.seconds)
    return Verdict(
        mutant,
        "error",
        f"pytest exited {run.code}: {_first_failure(run.output)}",
        seconds=run.seconds,
    )


def _stage_tests(tree: WorkingTree, stage: str) -> list[str]:
    paths = {c.path for c in invariants.scan_claims(tree) if c.id and c.id.startswith(f"{stage}.")}
    return sorted(paths)


def _preload(texts: Sequence[str], first_party: set[str]) -> list[str]:
    """Top-level modules the tests import, minus the repository's own: the fork
    servers import these once; the code under test is imported fresh per run."""
    names = {"pytest"}
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(names - first_party - {"__future__"})


def plan(opts: Options) -> tuple[Path, list[_Plan], dict[str, str], list[str]]:
    """Load the specs and decide what runs; returns the repo root, plans, cache keys."""
    repo = GitRepo.discover(opts.repo)
    tree = WorkingTree(repo)
    specs = load_specs(tree)
    unknown = [s for s in opts.stages if s not in specs]
    if unknown:
        raise ConfigError(
            f"unknown stage {unknown[0]!r}: expected one of {', '.join(specs)}, "
            f"found no specs/{unknown[0]}.toml"
        )
    chosen = list(opts.stages) or [s for s in specs if specs[s].mutants]
    plugin = _plugin_source()
    config = [tree.read(p) or "" for p in CONFIG_FILES]
    plans: list[_Plan] = []
    keys: dict[str, str] = {}
    sources: list[str] = [t for t in config if t]
    for stage in chosen:
        spec = specs[stage]
        mutants = catalogue(spec, tree.read(spec.path))
        if opts.only:
            mutants = [m for m in mutants if m.name in opts.only or m.id in opts.only]
        tests = _stage_tests(tree, stage)
        if mutants and not tests:
            raise ConfigError(f"stage {stage!r} has mutants but no test claims its invariants")
        test_texts = [f"{t}\n{tree.read(t) or ''}" for t in tests]
        for m in mutants:
            keys[m.name] = _sha(
                str(CACHE_VERSION),
                m.definition(),
                tree.read(m.file) or "",
                plugin,
                *config,
                *test_texts,
            )
        uses_hypothesis = any("hypothesis" in t for t in test_texts)
        plans.append(_Plan(stage, tests, mutants, uses_hypothesis))
        sources += [tree.read(t) or "" for t in tests]
    first_party = {
        f.split(SRC_MARKER, 1)[1].split("/")[0]
        for f in tree.files()
        if f.startswith("packages/") and SRC_MARKER in f
    }
    return repo.root, plans, keys, _preload(sources, first_party)


def run(opts: Options) -> MutantsResult:
    """Clean runs first (each must pass), then every mutant not killed before.

    Raises:
        ConfigError: unknown stage, malformed spec, or a clean run that fails.
    """
    root, plans, keys, preload = plan(opts)
    cache = _Cache(root / CACHE_FILE, opts.use_cache)
    jobs = max(1, opts.jobs or os.cpu_count() or 1)

    verdicts: dict[str, Verdict] = {}
    todo: list[tuple[Mutant, str]] = []
    for p in plans:
        for m in p.mutants:
            cached = cache.kill(m.name, keys[m.name])
            if cached is not None:
                verdicts[m.name] = Verdict(m, "killed", cached, cached=True)
                continue
            path = root / m.file
            text = path.read_text("utf-8", "surrogateescape") if path.is_file() else None
            applied = apply(m, text)
            if applied.source is None:
                verdicts[m.name] = Verdict(m, "stale", applied.stale or "stale")
                continue
            problem = compile_problem(m, applied.source)
            if problem:
                verdicts[m.name] = Verdict(m, "error", problem)
                continue
            todo.append((m, applied.source))

    clean: list[StageRun] = []
    if todo:  # a stage whose mutants are all cached or stale needs no clean run
        launcher = _Launcher(opts, root, min(jobs, len(todo)), preload)
        try:
            clean = _run_all(opts, launcher, plans, todo, verdicts, jobs)
        finally:
            launcher.close()
    ordered = [verdicts[m.name] for p in plans for m in p.mutants]
    cache.record(ordered, keys)
    return MutantsResult([p.stage for p in plans], clean, ordered)


def _run_all(
    opts: Options,
    launcher: _Launcher,
    plans: list[_Plan],
    todo: list[tuple[Mutant, str]],
    verdicts: dict[str, Verdict],
    jobs: int,
) -> list[StageRun]:
    say = opts.progress or (lambda _line: None)
    plan_of = {p.stage: p for p in plans}
    busy = [p.stage for p in plans if any(m.stage == p.stage for m, _ in todo)]

    def clean_run(stage: str) -> StageRun:
        p = plan_of[stage]
        r = launcher.run(p, None)
        if r.code == 0:
            p.order = _fastest_first(r.output)
            return StageRun(stage, True, "passed", r.seconds, p.tests)
        why = "timeout" if r.code is None else _first_failure(r.output)
        return StageRun(stage, False, why, r.seconds, p.tests)

    def mutant_run(item: tuple[Mutant, str]) -> Verdict:
        m = item[0]
        verdict = _judge(m, launcher.run(plan_of[m.stage], item), opts.timeout)
        say(f"MUTANT {m.name} {verdict.status} ({verdict.seconds:.1f} s)")
        return verdict

    clean: list[StageRun] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(clean_run, busy):
            clean.append(result)
            state = "passed" if result.ok else "FAILED"
            say(f"CLEAN {result.stage} {state} ({result.seconds:.1f} s)")
        failed = [c for c in clean if not c.ok]
        if failed:
            raise ConfigError(
                "the clean test run must pass before mutants mean anything: "
                + "; ".join(f"{c.stage}: {c.reason}" for c in failed)
            )
        for verdict in pool.map(mutant_run, todo):
            verdicts[verdict.mutant.name] = verdict
    return clean
