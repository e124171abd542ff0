"""The ``tests:<device>`` phase: the base's tests over the PR's code, the ratchet.

The reference run (the base's tests of every closure stage and the
acceptance tests, over the head's code, in parallel), the collection of the
same tests on the base's code and, where the PR's code skipped a test, its
re-run on the base's code (``ratchet``); the ops a ``tests = true`` runtime
rule forbids, recorded in the reference run and judged against the same
tests on the base's code (``runtime_tests``); then the PR's own added or
changed tests, and where the PR touched its stage's test folder, the whole of
that folder as the head has it: a test of the base's it no longer runs is
``tests.removed`` (``removed``). The collection on the base runs beside the
reference run, in a thread: it waits on a child process, and a machine of two cores has a core free
while the parallel run starts its workers.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from niels_gpt_contracts.checks.evidence import devices
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox import pytest_run, workspace
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.verdict import plan, ratchet, removed, runtime_tests
from niels_gpt_contracts.verdict.files import Workspace

Say = Callable[[str], None]


@dataclass
class Runner:
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


def tests_on(
    r: Runner, p: plan.Plan, device: str, say: Say
) -> tuple[list[Violation], list[pytest_run.PytestRun]]:
    """The ratchet on one device: reference run, PR run, base collection and skip re-runs."""
    at = ratchet.Where(p.stage.id, f"tests:{device}")
    targets = p.reference_targets
    say(f"reference tests on {device}: {len(targets)} files over the PR's code")
    ops = runtime_tests.request(p)  # forbidden ops recorded in the stages' own tests
    with ThreadPoolExecutor(max_workers=1) as beside:
        collecting = beside.submit(r.on, r.w.base, targets, device, collect_only=True)
        ref = r.on(r.w.head, targets, device, jobs=r.jobs, record_ops=ops)
        base_collect = collecting.result()
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
    head_targets = removed.head_targets(p)
    pr: pytest_run.PytestRun | None = None
    if head_targets:
        say(f"the PR's own tests on {device}: {len(head_targets)} files")
        pr = r.on(r.w.head, head_targets, device, pr=True, jobs=r.jobs)
        found += ratchet.judge_pr_tests(pr, at)
        runs.append(pr)
    base_ids = base_collect.collected or list(ref.tests)
    found += removed.judge(p, base_ids, base_skips, pr, at, device)
    return found, runs


def summary(runs: list[pytest_run.PytestRun]) -> str:
    ref, *pr = runs
    skipped = len(ratchet.skipped(ref))
    text = f"{len(ref.tests) - skipped} reference tests pass on the PR's code"
    if skipped:
        text += f" ({skipped} skipped, as on the base)"
    if pr:  # the PR's changed tests, or its stage's whole folder (``removed``)
        pr_skipped = len(ratchet.skipped(pr[0]))
        text += f"; {len(pr[0].tests) - pr_skipped} of the PR's own tests pass"
        if pr_skipped:
            text += f" ({pr_skipped} skipped, as on the base)"
    return text


def device_counts(runs: list[pytest_run.PytestRun]) -> devices.DeviceReport:
    """One invariant x device report from the runs of one device."""
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        for inv, counts in run.counts.items():
            into = merged.setdefault(inv, dict.fromkeys(pytest_run.OUTCOMES, 0))
            for key in pytest_run.OUTCOMES:
                into[key] += getattr(counts, key)
            into["failed_tests"] = [*into.get("failed_tests", []), *counts.failed_tests]
    status = max((r.code or 0) if r.problem is None else 2 for r in runs)
    return devices.DeviceReport(runs[0].device, "(contracts pr runs)", status, merged)
