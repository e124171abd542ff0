"""Invariant x device outcomes, from the reports ``test-<device>`` sessions write.

A report is ``reports/invariants-<device>.json`` (see the pytest plugin). A
device without a report, or whose tests for an invariant were all skipped,
did not verify that invariant: its row is NOT RUN, never KEPT, and it is
BROKEN when the run requires that device (``--require-device``).

A report also says what it was produced from (``fingerprint``): the tree of
stage sources and tests it ran on, and whether its test selection was
narrowed (``-k``, ``-m``, node ids, ``-x``...). A report from another tree
(``device.stale``) or a narrowed one (``device.partial``) proves nothing
about the tree being judged: NOT RUN, or BROKEN when the device is required.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from niels_gpt_contracts.checks.evidence.staleness import (
    DEVICE_PARTIAL,
    DEVICE_STALE,
    fresh_failures,
    stale_section,
)
from niels_gpt_contracts.decoding import Malformed, convert
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.fingerprint import Fingerprint
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
DEVICE_FAILED = Rule(
    "device.failed",
    "A test proving an invariant failed on a device.",
    "The invariant report of a device's test session shows a failing test that "
    "claims the invariant.",
    "Run the named tests on that device (nox -s test-<device>) and fix the failure.",
)

DEVICE_INCOMPLETE = Rule(
    "device.incomplete",
    "A device run ended in error before the invariant was verified.",
    "The device's test session ended with a non-zero pytest status and no passing "
    "test verified the invariant, so it cannot count as kept.",
    "Fix the error that stopped the run, then run the device session again.",
)

DEVICE_NOT_RUN = Rule(
    "device.not-run",
    "An invariant was not verified on a device the run requires.",
    "With --require-device, a device with no report, or whose tests for an invariant "
    "were all skipped, is broken rather than not run: a skip is not a pass.",
    "Run the stage's tests on the device, and make sure the invariant's tests do not skip there.",
)

DEVICES = ("cpu", "mps", "cuda")


@dataclass
class DeviceReport:
    device: str
    path: str
    exitstatus: int
    invariants: dict[str, dict[str, Any]] = field(default_factory=dict)
    tree: str | None = None  # None: produced by the verdict itself, nothing to compare
    narrowed_by: tuple[str, ...] = ()
    # Format 2 (device_report): per-stage sections and per-test outcomes with keys.
    sections: dict[str, dict[str, Any]] | None = None
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Counts(msgspec.Struct):
    passed: int = 0
    failed: int = 0
    skipped: int = 0


class _Selection(msgspec.Struct):
    narrowed_by: list[str]


class _Source(msgspec.Struct):
    tree: str
    selection: _Selection


class _Section(msgspec.Struct):
    collected: list[Any] = []


class _Report(msgspec.Struct):
    """The shape of a device report (``pytest_plugin``, ``device_report``); what is
    read is kept as parsed, this only says it is well formed."""

    device: Literal["cpu", "mps", "cuda"]
    invariants: dict[str, _Counts]
    exitstatus: int = 0
    source: _Source | None = None
    format: int | None = None
    sections: dict[str, _Section] | None = None
    tests: dict[str, dict[str, Any]] | None = None


def load_report(path: Path, device: str | None = None) -> DeviceReport:
    """Read one report and decode it by type (``_Report``).

    Raises:
        ConfigError: no file, not JSON, not a report (msgspec's reason, one line),
            another device than ``device``, or a format-2 report without its
            sections and tests.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(
            f"{path}: expected an invariant report, found none ({err.strerror})"
        ) from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}:{err.lineno}: expected JSON, found a syntax error: {err.msg}"
        ) from None
    try:
        report = convert(data, _Report, "expected an invariant report")
    except Malformed as err:
        raise ConfigError(f"{path}: {err}") from None
    if device is not None and report.device != device:
        raise ConfigError(f"{path}: expected device {device!r}, found {report.device!r}")
    if report.format == 2 and (report.sections is None or report.tests is None):
        raise ConfigError(f"{path}: expected 'sections' and 'tests' objects in a format-2 report")
    narrowed: tuple[str, ...]
    if report.source is None:
        tree, narrowed = "", ("an old report that does not say what it was produced from",)
    else:
        tree, narrowed = report.source.tree, tuple(report.source.selection.narrowed_by)
    sections, tests = (data["sections"], data["tests"]) if report.format == 2 else (None, {})
    return DeviceReport(
        report.device,
        str(path),
        report.exitstatus,
        data["invariants"],
        tree,
        narrowed,
        sections,
        tests,
    )


def load_reports(directory: Path | None, files: list[Path]) -> dict[str, DeviceReport | None]:
    """Reports by device: from ``directory`` (missing files are NOT RUN) and ``files``."""
    reports: dict[str, DeviceReport | None] = {}
    if directory is not None:
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"--reports: expected a directory, found a file at {directory}")
        for device in DEVICES:
            candidate = directory / f"invariants-{device}.json"
            reports[device] = load_report(candidate, device) if candidate.exists() else None
    for path in files:
        report = load_report(path)
        reports[report.device] = report
    return reports


def _test_path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _unusable(
    report: DeviceReport, tree: str | None, spec: Spec | None = None
) -> tuple[str, str] | None:
    """``(rule, why)`` when the report cannot speak for the tree under judgement.

    A format-2 report judged against a ``Fingerprint`` is judged stage by stage
    (``staleness``); any other by its whole tree and selection.
    """
    if spec is not None and report.sections is not None and isinstance(tree, Fingerprint):
        ids = {f"{spec.id}.{inv.id}" for inv in spec.invariants}
        return stale_section(
            report.device, report.path, report.sections, report.tests, ids, spec.id, tree.stages
        )
    if report.narrowed_by:
        return DEVICE_PARTIAL.id, (
            f"the {report.device} report ({report.path}) covers a narrowed selection "
            f"({'; '.join(report.narrowed_by)}): rerun the whole test-{report.device} session"
        )
    if tree is not None and report.tree is not None and report.tree != tree:
        return DEVICE_STALE.id, (
            f"the {report.device} report ({report.path}) was produced from another tree "
            f"({report.tree[:12] or 'unknown'}, the tree judged is {tree[:12]}): "
            f"rerun test-{report.device}"
        )
    return None


def device_outcome(
    spec: Spec,
    device: str,
    report: DeviceReport | None,
    required: bool,
    tree: str | None = None,
) -> Outcome:
    """The invariant x device row of ``spec``; ``tree``: the fingerprint being judged."""
    check = f"device:{device}"
    ids = [f"{spec.id}.{inv.id}" for inv in spec.invariants]
    lines = {f"{spec.id}.{inv.id}": inv.line for inv in spec.invariants}
    unusable = _unusable(report, tree, spec) if report is not None else None
    if report is not None and unusable is not None and isinstance(tree, Fingerprint):
        # A failure recorded on this very tree stands, whatever else is stale.
        fresh = fresh_failures(report.tests, set(ids), tree.stages)
        if fresh:
            vs = [
                Violation(
                    DEVICE_FAILED.id,
                    _test_path(tests[0]),
                    None,
                    f"invariant {inv!r}: {len(tests)} test(s) failed on {device}: "
                    f"{', '.join(tests)}",
                    spec.id,
                    check,
                )
                for inv, tests in fresh.items()
            ]
            return Outcome(spec.id, check, BROKEN, f"failed on this tree; {unusable[1]}", vs)
    if report is None or unusable is not None:
        rule, why = unusable or (DEVICE_NOT_RUN.id, f"no report for {device} (tests not run there)")
        if required:
            v = Violation(
                rule, spec.path, None, f"{why}, but the run requires {device}", spec.id, check
            )
            return Outcome(spec.id, check, BROKEN, why, [v])
        return Outcome(spec.id, check, NOT_RUN, why)
    if not ids:
        return Outcome(spec.id, check, KEPT, "no invariants declared")
    failed: list[Violation] = []
    unverified: list[str] = []
    for inv in ids:
        counts = report.invariants.get(inv, {})
        if counts.get("failed", 0):
            tests = counts.get("failed_tests") or counts.get("tests") or []
            path = _test_path(tests[0]) if tests else spec.path
            failed.append(
                Violation(
                    DEVICE_FAILED.id,
                    path,
                    None if tests else lines[inv],
                    f"invariant {inv!r}: {counts['failed']} test(s) failed on "
                    f"{device}: {', '.join(map(str, tests)) or '(tests not named in the report)'}",
                    spec.id,
                    check,
                )
            )
        elif not counts.get("passed", 0):
            unverified.append(inv)
    verified = len(ids) - len(failed) - len(unverified)
    summary = f"{verified}/{len(ids)} invariants passed on {device}"
    if failed:
        return Outcome(spec.id, check, BROKEN, summary, failed)
    if not unverified:
        return Outcome(spec.id, check, KEPT, summary)
    summary += f"; not verified (skipped or absent): {', '.join(unverified)}"
    section = (report.sections or {}).get(spec.id, {})
    status = section.get("exitstatus", report.exitstatus)
    if status != 0:
        vs = [
            Violation(
                DEVICE_INCOMPLETE.id,
                spec.path,
                lines[inv],
                f"invariant {inv!r} not "
                f"verified on {device}: the run ended with pytest exit status "
                f"{status} ({report.path})",
                spec.id,
                check,
            )
            for inv in unverified
        ]
        return Outcome(spec.id, check, BROKEN, summary, vs)
    if required:
        vs = [
            Violation(
                DEVICE_NOT_RUN.id,
                spec.path,
                lines[inv],
                f"invariant {inv!r} was skipped on {device}, which the run requires",
                spec.id,
                check,
            )
            for inv in unverified
        ]
        return Outcome(spec.id, check, BROKEN, summary, vs)
    return Outcome(spec.id, check, NOT_RUN, summary)
