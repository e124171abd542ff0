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
import itertools
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from filelock import FileLock

from niels_gpt_contracts.checks import invariants
from niels_gpt_contracts.checks.loading import load_specs
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, Tree, WorkingTree
from niels_gpt_contracts.mutants.catalogue import (
    SRC_MARKER,
    Mutant,
    apply,
    catalogue,
    compile_problem,
)
from niels_gpt_contracts.mutants.launcher import OVERLAY_MISSED, SERVER_DIED, Launcher, Run, TestEnv
from niels_gpt_contracts.spec import Spec

Status = Literal["killed", "survived", "stale", "error"]
CACHE_FILE = ".mutants-cache.json"
CACHE_VERSION = 1
DEFAULT_TIMEOUT = 120.0
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
class Plan:
    """One stage's mutants and the tests (ids under the rootdir) that must kill them."""

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


def plugin_source() -> str:
    # Read, not imported: the CLI side of the checker stays apart from the plugin.
    return (Path(__file__).resolve().parents[1] / "pytest_plugin.py").read_text(encoding="utf-8")


class Cache:
    """Proven kills by mutant name: ``{"key", "reason"}``, in one JSON file.

    Read once, when made (the PR verdict makes it before any of the PR's code
    runs, so nothing that code writes is believed). ``record`` writes under a
    file lock: it re-reads the file, lays this run's kills over it (another
    verdict sharing the cache may have written since), drops the entries this
    run found not killed under the same key, and renames a private temporary
    file into place, so concurrent runs never see half a file nor lose each
    other's kills.
    """

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.entries = _read_kills(path)

    def kill(self, name: str, key: str) -> str | None:
        entry = self.entries.get(name)
        if self.enabled and entry and entry.get("key") == key:
            return entry.get("reason", "")
        return None

    def record(self, verdicts: list[Verdict], keys: dict[str, str]) -> None:
        new = {v.mutant.name: v for v in verdicts if not v.cached}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path.with_name(self.path.name + ".lock")):
            entries = _read_kills(self.path)
            for name, v in new.items():
                if v.status == "killed":
                    entries[name] = {"key": keys[name], "reason": v.reason}
                elif entries.get(name, {}).get("key") == keys[name]:
                    entries.pop(name)
            payload = {"version": CACHE_VERSION, "kills": dict(sorted(entries.items()))}
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(payload, indent=1) + "\n")
            os.replace(tmp, self.path)
        self.entries = entries


def _read_kills(path: Path) -> dict[str, dict[str, str]]:
    if path.is_file():
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
                return dict(data.get("kills", {}))
    return {}


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


def _first_failure(output: str) -> str:
    m = _FAILED_LINE.search(output)
    if m:
        return f"{m.group(1).lower()}: {m.group(2)}"
    tail = [line for line in output.strip().splitlines() if line.strip()]
    return tail[-1][:200] if tail else "no output"


def _judge(mutant: Mutant, run: Run, timeout: float) -> Verdict:
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


def stage_tests(tree: Tree, stage: str) -> list[str]:
    paths = {c.path for c in invariants.scan_claims(tree) if c.id and c.id.startswith(f"{stage}.")}
    return sorted(paths)


def preload_modules(texts: Sequence[str], first_party: set[str]) -> list[str]:
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


def plan_stage(
    spec: Spec,
    spec_text: str | None,
    tests: list[str],
    read: Callable[[str], str | None],
    only: Sequence[str] = (),
    key_parts: Sequence[str] = (),
) -> tuple[Plan, dict[str, str]]:
    """The plan of one stage and the cache key of each of its mutants.

    ``read`` gives a file's text by repository path (module files and tests);
    ``key_parts`` are more texts that decide a kill (configuration, plugin,
    the rest of the code under test).
    """
    mutants = catalogue(spec, spec_text)
    if only:
        mutants = [m for m in mutants if m.name in only or m.id in only]
    if mutants and not tests:
        raise ConfigError(f"stage {spec.id!r} has mutants but no test claims its invariants")
    test_texts = [f"{t}\n{read(t) or ''}" for t in tests]
    keys = {
        m.name: _sha(
            str(CACHE_VERSION), m.definition(), read(m.file) or "", *key_parts, *test_texts
        )
        for m in mutants
    }
    uses_hypothesis = any("hypothesis" in t for t in test_texts)
    return Plan(spec.id, tests, mutants, uses_hypothesis), keys


def plan(opts: Options) -> tuple[Path, list[Plan], dict[str, str], list[str]]:
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
    config = [tree.read(p) or "" for p in CONFIG_FILES]
    plans: list[Plan] = []
    keys: dict[str, str] = {}
    sources: list[str] = [t for t in config if t]
    for stage in chosen:
        spec = specs[stage]
        tests = stage_tests(tree, stage)
        p, k = plan_stage(
            spec, tree.read(spec.path), tests, tree.read, opts.only, [plugin_source(), *config]
        )
        plans.append(p)
        keys.update(k)
        sources += [tree.read(t) or "" for t in tests]
    return repo.root, plans, keys, preload_modules(sources, first_party(tree.files()))


def first_party(files: Sequence[str]) -> set[str]:
    """Top-level names the stage packages provide (never preloaded by fork servers)."""
    return {
        f.split(SRC_MARKER, 1)[1].split("/")[0]
        for f in files
        if f.startswith("packages/") and SRC_MARKER in f
    }


def run(opts: Options) -> MutantsResult:
    """Clean runs first (each must pass), then every mutant not killed before.

    Raises:
        ConfigError: unknown stage, malformed spec, or a clean run that fails.
    """
    root, plans, keys, preload = plan(opts)
    cache = Cache(root / CACHE_FILE, opts.use_cache)
    return execute(plans, keys, preload, TestEnv.for_repo(root, opts.python), cache, opts)


def execute(
    plans: list[Plan],
    keys: dict[str, str],
    preload: Sequence[str],
    env: TestEnv,
    cache: Cache,
    opts: Options,
) -> MutantsResult:
    """Run the plans in ``env``; mutated modules are read from ``env.sources``."""
    jobs = max(1, opts.jobs or os.cpu_count() or 1)
    verdicts: dict[str, Verdict] = {}
    todo: list[tuple[Mutant, str]] = []
    for p in plans:
        for m in p.mutants:
            cached = cache.kill(m.name, keys[m.name])
            if cached is not None:
                verdicts[m.name] = Verdict(m, "killed", cached, cached=True)
                continue
            path = env.sources / m.file
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
        launcher = Launcher(
            env, min(jobs, len(todo)), preload, timeout=opts.timeout, fork=opts.fork
        )
        try:
            clean = _run_all(opts, launcher, plans, todo, verdicts, jobs)
        finally:
            launcher.close()
    ordered = [verdicts[m.name] for p in plans for m in p.mutants]
    cache.record(ordered, keys)
    return MutantsResult([p.stage for p in plans], clean, ordered)


def _run_all(
    opts: Options,
    launcher: Launcher,
    plans: list[Plan],
    todo: list[tuple[Mutant, str]],
    verdicts: dict[str, Verdict],
    jobs: int,
) -> list[StageRun]:
    say = opts.progress or (lambda _line: None)
    plan_of = {p.stage: p for p in plans}
    busy = [p.stage for p in plans if any(m.stage == p.stage for m, _ in todo)]

    def clean_run(stage: str) -> StageRun:
        p = plan_of[stage]
        r = launcher.run(p.stage, p.tests, p.hypothesis, None)
        if r.code == 0:
            p.order = _fastest_first(r.output)
            return StageRun(stage, True, "passed", r.seconds, p.tests)
        why = "timeout" if r.code is None else _first_failure(r.output)
        return StageRun(stage, False, why, r.seconds, p.tests)

    done = itertools.count(1)

    def mutant_run(item: tuple[Mutant, str]) -> Verdict:
        m = item[0]
        p = plan_of[m.stage]
        run = launcher.run(p.stage, p.order or p.tests, p.hypothesis, item)
        verdict = _judge(m, run, opts.timeout)
        # Progress, not the report: the report's MUTANT lines come at the end.
        say(f"  [{next(done)}/{len(todo)}] {m.name}: {verdict.status} in {verdict.seconds:.1f} s")
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
