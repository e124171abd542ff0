"""One pytest run in the sandbox, and the per-test report it leaves.

The run loads exactly these plugins, with autoloading off: the checker's own
(``--device``, the ``invariant`` marker, the per-test report), hypothesis's
(for a fixed ``--hypothesis-seed``) and, for parallel runs, xdist's. Its
configuration is the one the caller writes (the base's, never the PR's), its
hypothesis example database lives in the run's scratch folder, and its result
is read from the JSON report (decoded by type here), not from the exit status alone.
The run's folder (its working directory) is made in the sandbox's ``tmp``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from niels_gpt_contracts.decoding import Malformed, decode, one_line
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox

PLUGINS = (
    "niels_gpt_contracts.pytest_plugin",
    "niels_gpt_contracts.ops_plugin",
    "_hypothesis_pytestplugin",
)
OUTCOMES = ("passed", "failed", "skipped")


class TestOutcome(msgspec.Struct, frozen=True):
    """One test's outcome and its claims (an entry of the report's ``tests``)."""

    outcome: Literal["passed", "failed", "skipped"]
    invariants: tuple[str, ...] = ()
    reason: str = ""
    ops: tuple[str, ...] = ()  # forbidden ops its call dispatched (--record-ops)


class Counts(msgspec.Struct, frozen=True):
    """One invariant's tally in the report's ``invariants``."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failed_tests: tuple[str, ...] = ()


class _Report(msgspec.Struct, frozen=True):
    """What the plugin's ``--invariant-report`` holds that a run is read for."""

    device: str
    tests: dict[str, TestOutcome]
    collected: list[str]
    invariants: dict[str, Counts]


@dataclass
class PytestRun:
    """What one run produced. ``problem`` is set when the run itself went wrong."""

    label: str
    device: str
    code: int | None
    seconds: float
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    counts: dict[str, Counts] = field(default_factory=dict)
    output: str = ""
    problem: str | None = None

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


def _parse(raw: bytes, device: str) -> _Report:
    """The plugin's report, decoded by type.

    Raises:
        Malformed: not JSON, not a report (msgspec's reason), or another device's.
    """
    report = decode(raw, _Report, "expected a per-test report")
    if report.device != device:
        raise Malformed(
            one_line(f"expected a report for device {device!r}, found {report.device!r}")
        )
    return report


def run(
    box: Sandbox,
    *,
    label: str,
    rootdir: Path,
    config: Path,
    targets: Sequence[str],
    roots: Sequence[Path],
    device: str,
    jobs: int = 1,
    timeout: float = 1800.0,
    collect_only: bool = False,
    record_ops: Mapping[str, list[str]] | None = None,
) -> PytestRun:
    """Run pytest on ``targets`` (paths or node ids under ``rootdir``) with ``roots`` importable.

    ``record_ops``: ``{"patterns", "tests"}`` for ``ops_plugin`` (forbidden ops per test).
    """
    with tempfile.TemporaryDirectory(prefix="contracts-run-", dir=box.tmp) as tmp:
        scratch = Path(tmp)
        report = scratch / "report.json"
        args = [
            box.python,
            "-m",
            "pytest",
            "-c",
            str(config),
            f"--rootdir={rootdir}",
            "-p",
            "no:cacheprovider",
            *(a for p in PLUGINS for a in ("-p", p)),
            f"--device={device}",
            f"--invariant-report={report}",
            "--hypothesis-seed=0",
            "-q",
            "--tb=short",
            "-rfE",
        ]
        if record_ops:
            request = scratch / "record-ops.json"
            request.write_text(json.dumps(dict(record_ops)), encoding="utf-8")
            args.append(f"--record-ops={request}")
        if collect_only:
            args.append("--collect-only")
        elif jobs > 1:
            args += ["-p", "xdist.plugin", f"--numprocesses={jobs}"]
        args += [str(rootdir / t) for t in targets]
        env = box.environ(roots, {"HYPOTHESIS_STORAGE_DIRECTORY": str(scratch / "hypothesis")})
        done = processes.run(args, env=env, cwd=scratch, timeout=timeout)
        result = PytestRun(label, device, done.code, done.seconds, output=done.stdout + done.stderr)
        if done.timed_out:
            result.problem = f"timed out after {timeout:g} s"
            return result
        if done.code not in (0, 1, 5):  # 5: nothing collected, judged by the caller
            result.problem = f"pytest exited {done.code} (usage, collection or internal error)"
        try:
            parsed = _parse(report.read_bytes(), device)
        except (OSError, Malformed) as err:
            result.problem = result.problem or f"no readable per-test report ({one_line(str(err))})"
            return result
        result.tests, result.collected, result.counts = (
            parsed.tests,
            parsed.collected,
            parsed.invariants,
        )
        return result
