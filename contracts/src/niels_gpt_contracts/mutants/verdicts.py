"""What mutant runs produce: a verdict per mutant, the clean runs, and how pytest's
exit status and output are read.

Verdicts from pytest's exit status: 1 (a test failed) kills the mutant, and
so do 2 and 4 (collection failed, or a test id the clean run collected is no
longer found: the mutated module raises on import); 0 means it survived;
anything else, or the per-mutant timeout, is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from niels_gpt_contracts.mutants.catalogue import Mutant
from niels_gpt_contracts.mutants.launcher import OVERLAY_MISSED, SERVER_DIED, Run

Status = Literal["killed", "survived", "stale", "error", "pending"]

# "FAILED <node id> - <message>": a parametrised id may hold spaces, not " - ".
_FAILED_LINE = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)
_DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S.*?)\s*$", re.MULTILINE)


@dataclass
class Verdict:
    mutant: Mutant
    status: Status
    reason: str
    cached: bool = False
    seconds: float = 0.0


@dataclass
class StageRun:
    """A clean run of one stage's claiming tests (all of them, or its hinted ones)."""

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
    not_run: list[Mutant] = field(default_factory=list)  # stopped at the first survivor

    @property
    def killed(self) -> int:
        return sum(v.status == "killed" for v in self.verdicts)

    @property
    def ok(self) -> bool:
        return not self.not_run and all(v.status == "killed" for v in self.verdicts)


@dataclass
class Plan:
    """One stage's mutants and the tests (ids under the rootdir) that must kill them."""

    stage: str
    tests: list[str]
    mutants: list[Mutant]
    hypothesis: bool
    order: list[str] = field(default_factory=list)  # test ids, fastest first, from the clean run


def fastest_first(output: str) -> list[str]:
    """Test ids from a ``--durations=0`` report, quickest first (stable by name).

    Mutant runs stop at the first failure (``-x``), so running the cheap tests
    first makes a typical kill take a fraction of the suite.
    """
    total: dict[str, float] = {}
    for seconds, nodeid in _DURATION.findall(output):
        total[nodeid] = total.get(nodeid, 0.0) + float(seconds)
    return sorted(total, key=lambda n: (total[n], n))


def first_failure(output: str) -> str:
    m = _FAILED_LINE.search(output)
    if m:
        return f"{m.group(1).lower()}: {m.group(2)}"
    tail = [line for line in output.strip().splitlines() if line.strip()]
    return tail[-1][:200] if tail else "no output"


def judge(mutant: Mutant, run: Run, timeout: float) -> Verdict:
    if run.code is None:
        return Verdict(mutant, "error", f"timeout after {timeout:g} s", seconds=run.seconds)
    if run.code == 0:
        return Verdict(mutant, "survived", "every claiming test passed", seconds=run.seconds)
    if run.code == 1:
        return Verdict(mutant, "killed", first_failure(run.output), seconds=run.seconds)
    if run.code in (2, 4):  # the same selection collected cleanly, so the mutant broke it
        why = first_failure(run.output)
        return Verdict(mutant, "killed", f"collection failed ({why})", seconds=run.seconds)
    if run.code in (SERVER_DIED, OVERLAY_MISSED):
        return Verdict(mutant, "error", run.output.strip()[-300:], seconds=run.seconds)
    return Verdict(
        mutant,
        "error",
        f"pytest exited {run.code}: {first_failure(run.output)}",
        seconds=run.seconds,
    )
