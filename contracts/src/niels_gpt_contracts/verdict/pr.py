"""``contracts pr``: the whole verdict on one stage's PR, in order.

1. Nothing of the PR runs yet: the base's specs, the diff, paths and
   self-loading files, module ownership, readable source, static rules and
   invariant claims (``checks``); every checker module is imported and
   hashed (``integrity``).
2. Trees are written out of git objects into a workspace: the head's
   sources, the reference tests (``plan``), the PR's own tests, the base's
   runtime-rule drivers; the base's root ``conftest.py`` and pytest settings.
3. In the sandbox (``sandbox``), per device: the API probe (cpu), the
   runtime-rule drivers, the reference tests, the PR's tests, and on the
   base's code the collection of the reference tests and the re-run of any
   test the PR's code skipped (``ratchet``). Then the mutants of every
   closure stage, killed by the reference tests.
4. The checker's files, the sandbox interpreter's import path and the
   workspace must be unchanged (``sandbox.tampered``), and the ``Result`` is
   built in memory from validated data.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from niels_gpt_contracts import device_probe
from niels_gpt_contracts.checks import amendment, api, devices, gate, invariants, pr_context
from niels_gpt_contracts.checks.modules import namespaces
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants.runner import Cache
from niels_gpt_contracts.result import Outcome, Result, Violation
from niels_gpt_contracts.sandbox import (
    confine,
    env_trust,
    processes,
    pytest_run,
    runtime_probe,
    workspace,
)
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.spec import Spec
from niels_gpt_contracts.verdict import (
    integrity,
    oracle,
    plan,
    ratchet,
    runtime,
    runtime_tests,
    weakened,
)
from niels_gpt_contracts.verdict.mutation import CACHE_NAME, run_mutants

Say = Callable[[str], None]


@dataclass
class PrRequest:
    """What ``contracts pr`` was asked."""

    repo: Path
    base: str
    head: str | None
    stage: str | None = None
    python: str | None = None
    cache: Path = Path(".contracts-cache")
    devices: tuple[str, ...] = ("cpu",)
    require_devices: tuple[str, ...] = ()
    jobs: int = 0
    mutants: bool = True
    timeout: float = 1800.0
    oracle_seed: int | None = None  # None: a fresh secret seed (verdict.oracle)


@dataclass
class Workspace:
    root: Path
    head: Path  # the head's packages/*/src
    base: Path  # the base's packages/*/src (skip re-runs, collection)
    ref: Path  # reference tests + base conftest.py and pyproject.toml
    pr: Path  # the PR's own test files + the same trusted conftest and config
    drivers: Path  # the base's specs/<stage>/ runtime drivers

    def watched(self) -> list[str]:
        return [str(p) for p in (self.head, self.base, self.ref, self.pr, self.drivers)]


def _write_workspace(ctx: pr_context.PrContext, p: plan.Plan, root: Path) -> Workspace:
    w = Workspace(root, root / "head", root / "base", root / "ref", root / "pr", root / "drivers")
    head_files, base_files = ctx.head_tree.files(), ctx.base_tree.files()
    # Only the modules the base's specs give each stage are written: a file at
    # another stage's path, an unlisted helper, a .pth or a planted .pyc never
    # reaches an interpreter (the modules check names them).
    owned = {f for s in ctx.specs.values() for f in s.module_files}
    workspace.write(ctx.head_tree, [f for f in head_files if f in owned], w.head)
    workspace.write(ctx.base_tree, [f for f in base_files if f in owned], w.base)
    workspace.write(ctx.base_tree, p.reference_from_base, w.ref)
    workspace.write(ctx.head_tree, p.reference_from_head, w.ref)
    workspace.write(ctx.head_tree, p.pr_support, w.pr)
    drivers = [f for s in p.closure for f in base_files if f.startswith(f"specs/{s.id}/")]
    workspace.write(ctx.base_tree, [f for f in drivers if "/tests/" not in f], w.drivers)
    for name in ("conftest.py", "pyproject.toml"):
        text = ctx.base_tree.read(name)
        for where in (w.ref, w.pr):
            if text is not None:
                workspace.write_text(where, name, text)
    if ctx.base_tree.read("pyproject.toml") is None:
        raise ConfigError("expected the base's root pyproject.toml (pytest settings), found none")
    return w


def _outcome(stage: str, check: str, found: list[Violation], kept: str) -> Outcome:
    if found:
        return Outcome(stage, check, "BROKEN", f"{len(found)} violation(s)", found)
    return Outcome(stage, check, "KEPT", kept)


def _device_counts(runs: list[pytest_run.PytestRun]) -> devices.DeviceReport:
    """One invariant x device report from the runs of one device."""
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        for inv, counts in run.counts.items():
            into = merged.setdefault(inv, dict.fromkeys(pytest_run.OUTCOMES, 0))
            for key in pytest_run.OUTCOMES:
                into[key] += int(counts.get(key, 0))
            into["failed_tests"] = [*into.get("failed_tests", []), *counts.get("failed_tests", [])]
    status = max((r.code or 0) if r.problem is None else 2 for r in runs)
    return devices.DeviceReport(runs[0].device, "(contracts pr runs)", status, merged)


@dataclass
class _Runner:
    """Pytest runs of one verdict: the sandbox, the workspace, the limits."""

    box: Sandbox
    w: Workspace
    jobs: int
    timeout: float

    def on(
        self, code: Path, targets: list[str], device: str, *, pr: bool = False, **kw: Any
    ) -> pytest_run.PytestRun:
        """Tests ``targets`` with the sources under ``code`` importable."""
        root = self.w.pr if pr else self.w.ref
        return pytest_run.run(
            self.box,
            label="PR tests" if pr else "reference",
            rootdir=root,
            config=root / "pyproject.toml",
            targets=targets,
            roots=workspace.src_roots(code),
            device=device,
            timeout=self.timeout,
            **kw,
        )


def _tests_on(
    r: _Runner, p: plan.Plan, device: str, say: Say
) -> tuple[list[Violation], list[pytest_run.PytestRun]]:
    """The ratchet on one device: reference run, PR run, base collection and skip re-runs."""
    at = ratchet.Where(p.stage.id, f"tests:{device}")
    targets = p.reference_targets
    say(f"reference tests on {device}: {len(targets)} files over the PR's code")
    ops = runtime_tests.request(p)  # forbidden ops recorded in the stages' own tests
    ref = r.on(r.w.head, targets, device, jobs=r.jobs, record_ops=ops)
    base_collect = r.on(r.w.base, targets, device, collect_only=True)
    skipped = ratchet.skipped(ref)
    base_skips: list[str] = []
    if skipped:
        say(f"re-running {len(skipped)} skipped reference test(s) on the base's code")
        again = r.on(r.w.base, skipped, device)
        base_skips = [
            n for n in skipped if n in again.tests and again.tests[n].outcome == "skipped"
        ]
    collected = base_collect.collected or None
    found = ratchet.judge_reference(ref, at, base_skips=base_skips, base_collected=collected)
    found += runtime_tests.judge(
        p, ref, lambda ids: r.on(r.w.base, ids, device, record_ops=ops), p.stage.id, at.check
    )
    runs = [ref]
    if p.pr_tests:
        say(f"the PR's own tests on {device}: {len(p.pr_tests)} files")
        pr = r.on(r.w.head, p.pr_tests, device, pr=True, jobs=r.jobs)
        found += ratchet.judge_pr_tests(pr, at)
        runs.append(pr)
    return found, runs


def _tests_summary(runs: list[pytest_run.PytestRun]) -> str:
    ref, *pr = runs
    skipped = len(ratchet.skipped(ref))
    text = f"{len(ref.tests) - skipped} reference tests pass on the PR's code"
    if skipped:
        text += f" ({skipped} skipped, as on the base)"
    if pr:
        text += f"; {len(pr[0].tests)} of the PR's own tests pass"
    return text


def _device_usable(
    result: Result, spec: Spec, device: str, box: Sandbox, request: PrRequest
) -> bool:
    """Probe ``device`` by computing on it; record why when it cannot run the tests."""
    found = device_probe.probe(device, python=box.python)
    if found.ok:
        return True
    why = f"{device} not usable here, tests not run: {found.reason}"
    if device in request.require_devices:
        v = Violation("device.not-run", spec.path, None, why, spec.id, f"device:{device}")
        result.outcomes.append(Outcome(spec.id, f"device:{device}", "BROKEN", why, [v]))
    else:
        result.outcomes.append(Outcome(spec.id, f"device:{device}", "NOT RUN", why))
    return False


def _tampered(stage: str, paths: list[str]) -> Outcome:
    message = "changed while the PR's code ran: the PR's code wrote outside its sandbox"
    found = [Violation("sandbox.tampered", p, None, message, stage, "sandbox") for p in paths[:20]]
    return _outcome(stage, "sandbox", found, "checker, interpreter and workspace unchanged")


def _interpreter(given: str) -> str:
    """``--python`` as an absolute path: the sandbox's runs start in other folders.

    A bare name is looked up on PATH. The path is made absolute, never resolved
    through links: a venv's ``python`` is a link, and resolving it would leave
    the venv. Raises ``ConfigError`` when nothing executable is there.
    """
    found = shutil.which(given)
    if found is None:
        raise ConfigError(
            f"--python: expected an executable python interpreter, found none at {given!r}"
        )
    return os.path.abspath(found)


def run(request: PrRequest, say: Say) -> Result:
    """The verdict; ``ConfigError`` when it cannot be given (exit 2, never a pass)."""
    # This process writes no bytecode: every new file on the watched paths is the PR's.
    sys.dont_write_bytecode = True
    python_given = _interpreter(request.python) if request.python else None
    if request.stage is None:  # 'Spec:' trailers: a maintainers' amendment, judged statically
        judged = amendment.judge(request.repo, request.base, request.head)
        if judged is not None:
            return judged
    integrity.preload()
    processes.become_subreaper()
    ctx = pr_context.open_pr(request.repo, request.base, request.head, request.stage)
    spec = ctx.spec
    result = ctx.result(request.require_devices)
    gate.judge_pr_static(ctx, result)
    rejected = {v.path for v in result.violations if v.path is not None}
    p = plan.make_plan(
        spec, ctx.specs, ctx.changes, ctx.base_tree.files(), ctx.head_tree.files(), rejected
    )
    gate.add_rule_texts(result, p.closure)
    claims = invariants.scan_claims(ctx.head_tree)
    claims += invariants.scan_claims(ctx.base_tree, p.reference_from_base)
    jobs = max(1, request.jobs or os.cpu_count() or 1)
    request.cache.mkdir(parents=True, exist_ok=True)
    kills = Cache(request.cache / CACHE_NAME, True)  # read now, before any PR code runs
    with tempfile.TemporaryDirectory(prefix="contracts-pr-") as tmp:
        w = _write_workspace(ctx, p, Path(tmp))
        constraints = ctx.base_tree.read("constraints.txt") or ""
        python = python_given or env_trust.build(request.cache, constraints, say)
        box = Sandbox.prepare(python, w.root / "sandbox", namespaces(ctx.specs), threads=1)
        guard = integrity.Guard.take([*box.trusted_paths(), *w.watched(), str(box.boot)])
        box, confinement = confine.confined(
            box, [*guard.roots, guard.package, request.cache, request.repo]
        )
        say(f"sandbox interpreter {python} ({confinement}); workspace {w.root}")
        owned = [f for s in ctx.specs.values() for f in s.module_files]
        found_api = api.check_api([spec], ctx.head_tree, box.python, box.environ([]), owned)
        processes.reap_orphans()
        gate.stage_checks(
            result,
            spec,
            ctx.specs,
            ctx.head_tree,
            claims,
            found_api,
            ctx.changed_lines,
            (box.python, box.environ([])),
        )
        code = (w.head, w.base)
        result.outcomes.append(oracle.judge(ctx, p, box, code, say, request.oracle_seed))
        runner = _Runner(box, w, jobs, request.timeout)
        rules = p.rules()
        for device in request.devices:
            usable = device == "cpu" or _device_usable(result, spec, device, box, request)
            if not usable:
                continue
            probe = runtime_probe.run(
                box,
                [rule for _, rule in rules],
                device=device,
                drivers_root=w.drivers,
                roots=workspace.src_roots(w.head),
            )
            broken = runtime.judge(rules, probe, spec.id)
            kept = f"{len(rules)} runtime rule(s) hold"
            result.outcomes.append(_outcome(spec.id, f"runtime:{device}", broken, kept))
            found, runs = _tests_on(runner, p, device, say)
            kept = _tests_summary(runs)
            result.outcomes.append(_outcome(spec.id, f"tests:{device}", found, kept))
            required = device in request.require_devices
            report = _device_counts(runs)
            result.outcomes.append(devices.device_outcome(spec, device, report, required))
        if request.mutants:
            mutants_row = run_mutants(ctx, p, w, box, request, kills, say)
            result.outcomes.append(mutants_row)
            row = weakened.judge(ctx, p, box, w.root, kills, mutants_row, jobs, say)
            result.outcomes.append(row)
        else:
            why = "skipped (--skip-mutants: a device job beside a full verdict)"
            result.outcomes.append(Outcome(spec.id, "mutants", "NOT RUN", why))
        tampered = guard.changes()
    if tampered and python_given is None:
        # Never reuse an environment the PR's code may have poisoned.
        env_trust.discard(Path(python).parent.parent)
    result.outcomes.append(_tampered(spec.id, tampered))
    return result
