"""Plan and run each stage's mutants: ``contracts mutants`` and the PR verdict's phase.

Every run is a fresh pytest in its own temporary directory (so the hypothesis
example database of one mutant never leaks into another), forked from a
server that imported torch and pytest once (``launcher``), running the
stage's test files with ``--invariant-prefix <stage>.``: only tests claiming
one of the stage's invariants run. A mutant run puts an overlay directory
holding the mutated module first on the import path and first checks that
the import system really resolves the module to that copy; if not, the run
is an error, never a kill. Mutant runs stop at the first failure; hypothesis
does not shrink a failing example there (a kill needs none).

``execute`` decides what runs (``schedule``): a kill proven before under the
same proof key (``proof``: all stage code in normal form, the tests, the
configuration, the checker and the environment) is reused from the store
(``store``, ``.mutants-cache.json`` for the working tree); a hinted mutant
(``hints``) runs its hinted test first; the rest run every claiming test,
fastest first. What a run means is read in ``fates``.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.checks.evidence import invariants
from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.mutants import hints as hint_file
from niels_gpt_contracts.mutants import proof
from niels_gpt_contracts.mutants.catalogue import SRC_MARKER, apply, catalogue, compile_problem
from niels_gpt_contracts.mutants.fates import Fate, MutantsResult, Plan, Status
from niels_gpt_contracts.mutants.launcher import Launcher, TestEnv
from niels_gpt_contracts.mutants.schedule import Outcome, Scheduler, Todo
from niels_gpt_contracts.mutants.store import Cache
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import Spec

__all__ = ["Cache", "Fate", "MutantsResult", "Options", "Plan", "Status", "execute", "run"]

PENDING = (
    "marked retarget = true by an amendment: re-target it at the new code (the same bug) "
    "and remove the mark"
)
CACHE_FILE = ".mutants-cache.json"
DEFAULT_TIMEOUT = 120.0
# Files outside the stage that decide how its tests run (part of the proof key).
CONFIG_FILES = ("conftest.py", "pyproject.toml")


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
    stop_early: bool = False  # no new run once a mutant is not killed
    write_hints: bool = False  # rewrite specs/mutant-hints.json from the kills


@dataclass
class Work:
    """Everything ``execute`` needs besides the environment and the store."""

    plans: list[Plan]
    keys: proof.ProofKeys
    hints: Mapping[str, str]  # committed hints (specs/mutant-hints.json)
    preload: Sequence[str]
    known: frozenset[str] = frozenset()  # every catalogued mutant of the tree


def stage_tests(claims: Sequence[invariants.Claim], stage: str) -> list[str]:
    return sorted({c.path for c in claims if c.id and c.id.startswith(f"{stage}.")})


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
    skip_retarget: bool = False,
) -> Plan:
    """One stage's mutants (``only``: some of them) and the tests that must kill them.

    ``skip_retarget``: leave out the mutants an amendment marked ``retarget``
    (a PR verdict: NOT RUN there, never killed).
    """
    mutants = catalogue(spec, spec_text)
    if skip_retarget:  # a PR verdict whose base marked them: NOT RUN there, never killed
        mutants = [m for m in mutants if not m.retarget]
    if only:
        mutants = [m for m in mutants if m.name in only or m.id in only]
    if mutants and not tests:
        raise ConfigError(f"stage {spec.id!r} has mutants but no test claims its invariants")
    uses_hypothesis = any("hypothesis" in (read(t) or "") for t in tests)
    return Plan(spec.id, tests, mutants, uses_hypothesis)


def first_party(files: Sequence[str]) -> set[str]:
    """Top-level names the stage packages provide (never preloaded by fork servers)."""
    return {
        f.split(SRC_MARKER, 1)[1].split("/")[0]
        for f in files
        if f.startswith("packages/") and SRC_MARKER in f
    }


def code_files(files: Sequence[str]) -> list[str]:
    """Every stage module of a tree: what a test may import, so what decides a kill."""
    return sorted(
        f for f in files if f.startswith("packages/") and SRC_MARKER in f and f.endswith(".py")
    )


def test_files(files: Sequence[str]) -> list[str]:
    """Every Python file of the tests' folders (the tests and what they may import)."""
    return sorted(
        f
        for f in files
        if f.endswith(".py") and "/tests/" in f and f.startswith(("packages/", "specs/"))
    )


def site_paths(python: str, names: Iterable[str]) -> list[str]:
    """``python``'s import path outside the stages' own folders (see ``Sandbox.site_paths``)."""
    return Sandbox(python, Path(), Path(), tuple(names)).site_paths()


def plan(opts: Options) -> tuple[Path, Work]:
    """Load the working tree's specs and decide what runs."""
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
    files = tree.files()
    claims = invariants.scan_claims(tree)
    plans = []
    for stage in chosen:
        spec = specs[stage]
        plans.append(
            plan_stage(spec, tree.read(spec.path), stage_tests(claims, stage), tree.read, opts.only)
        )
    code = {f: tree.read(f) or "" for f in code_files(files)}
    tests = {f: tree.read(f) or "" for f in test_files(files)}
    config = [tree.read(p) or "" for p in CONFIG_FILES]
    env = proof.environment(site_paths(opts.python, namespaces(specs)))
    keys = proof.ProofKeys(code, tests, [*config, *proof.checker_files()], env)
    ran = [tests[t] for p in plans for t in p.tests if t in tests]
    preload = preload_modules([*config, *ran], first_party(files))
    known = frozenset(m.name for s in specs.values() for m in catalogue(s, tree.read(s.path)))
    committed = hint_file.parse(tree.read(hint_file.HINTS_PATH))
    return repo.root, Work(plans, keys, committed, preload, known)


def run(opts: Options) -> MutantsResult:
    """Every mutant not killed before under the same key.

    Raises:
        ConfigError: unknown stage, malformed spec, or a clean run that fails.
    """
    root, work = plan(opts)
    cache = Cache(root / CACHE_FILE, opts.use_cache)
    result = execute(work, TestEnv.for_repo(root, opts.python), cache, opts)
    if opts.write_hints:
        write_hints(root, work, cache)
    return result


def write_hints(root: Path, work: Work, cache: Cache) -> None:
    """Rewrite ``specs/mutant-hints.json``: the killing test of every mutant that has one.

    The store's tests (this run's kills, and earlier ones) over the committed
    hints; a hint of a mutant no spec catalogues any more is dropped.
    """
    found = {**work.hints, **{n: e["test"] for n, e in cache.entries.items() if e.get("test")}}
    text = hint_file.render({n: t for n, t in found.items() if n in work.known})
    (root / hint_file.HINTS_PATH).write_text(text, encoding="utf-8")


def execute(work: Work, env: TestEnv, cache: Cache, opts: Options) -> MutantsResult:
    """Run the plans in ``env``; mutated modules are read from ``env.sources``."""
    say = opts.progress or (lambda _line: None)
    jobs = max(1, opts.jobs or os.cpu_count() or 1)
    out = Outcome()
    keys: dict[str, str] = {}
    todo: list[Todo] = []
    for p in work.plans:
        tested = set(p.tests)
        for m in p.mutants:
            if m.retarget:  # main must never carry one: a known bug left unchecked
                out.fates[m.name] = Fate(m, "pending", PENDING)
                continue
            path = env.sources / m.file
            text = path.read_text("utf-8", "surrogateescape") if path.is_file() else None
            applied = apply(m, text)
            if applied.source is None:
                out.fates[m.name] = Fate(m, "stale", applied.stale or "stale")
                continue
            problem = compile_problem(m, applied.source)
            if problem:
                out.fates[m.name] = Fate(m, "error", problem)
                continue
            keys[m.name] = work.keys.key(m.name, m.file, applied.source, p.tests)
            cached = cache.kill(m.name, keys[m.name])
            if cached is not None:
                out.fates[m.name] = Fate(m, "killed", cached, cached=True)
                continue
            hint = cache.hint(m.name) or work.hints.get(m.name)
            usable = hint is not None and hint.split("::", 1)[0] in tested
            todo.append(Todo(m, applied.source, hint if usable else None))
    decided_bad = any(v.status != "killed" for v in out.fates.values())
    if opts.stop_early and decided_bad:
        out.not_run += [t.mutant for t in todo]
    elif todo:
        hinted = sum(t.hint is not None for t in todo)
        say(f"mutants to run: {len(todo)} ({hinted} with a hint); {len(out.fates)} decided")
        launcher = Launcher(
            env, min(jobs, len(todo)), work.preload, timeout=opts.timeout, fork=opts.fork
        )
        try:
            Scheduler(launcher, work.plans, jobs, opts.timeout, say, opts.stop_early).run(todo, out)
        finally:
            launcher.close()
    ordered = [out.fates[m.name] for p in work.plans for m in p.mutants if m.name in out.fates]
    cache.record(ordered, keys)
    return MutantsResult([p.stage for p in work.plans], out.clean, ordered, out.not_run)
