"""What mutant runs produce: each mutant's fate, the clean runs, how pytest's
exit status and output are read, and the ``mutant.*`` violations of a run.

A mutant's fate (``Fate``: killed, survived, stale, error or pending;
"verdict" is the gate's word for a whole judgement) from pytest's exit
status: 1 (a test failed) kills the mutant, and so do 2 and 4 (collection
failed, or a test id the clean run collected is no longer found: the mutated
module raises on import); 0 means it survived; anything else, or the
per-mutant timeout, is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from niels_gpt_contracts.mutants.catalogue import Mutant
from niels_gpt_contracts.mutants.launcher import OVERLAY_MISSED, SERVER_DIED, Run
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule

Status = Literal["killed", "survived", "stale", "error", "pending"]

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
MUTANT_SURVIVED = Rule(
    "mutant.survived",
    "A catalogued bug was not caught by the stage's tests.",
    "Each stage's spec lists known bugs (mutants); the tests that claim the stage's "
    "invariants must fail on every one of them.",
    "Strengthen the tests (claiming the right invariant) until they fail on the "
    "mutant; never delete the mutant.",
)

MUTANT_STALE = Rule(
    "mutant.stale",
    "A catalogued bug no longer applies to the code.",
    "A mutant's find text must occur in its module exactly as often as it says; when "
    "the code moves on, the mutant tests nothing until it is rewritten.",
    "Rewrite the mutant's find/replace against the current source.",
)

MUTANT_PENDING = Rule(
    "mutant.pending",
    "A mutant is still marked for re-targeting.",
    "A maintainers' amendment may mark mutants whose code its stage PR rewrites "
    "(retarget = true): that PR's verdict reports them NOT RUN. Outside that verdict the "
    "mark means a known bug goes unchecked, so the mutant gate fails on it.",
    "Rewrite the mutant's find/replace at the new code (the same bug), prove it killed "
    "(nox -s mutants -- --stage S) and remove the mark, in a maintainers' commit.",
)

MUTANT_ERROR = Rule(
    "mutant.error",
    "A mutant run ended in error.",
    "A run that times out or crashes does not show the bug was caught, so it counts "
    "against the gate.",
    "Look at the reason in the message; fix the tests or the timeout.",
)

# The rule a mutant's fate breaks, by its status.
BY_STATUS: dict[Status, Rule] = {
    "survived": MUTANT_SURVIVED,
    "stale": MUTANT_STALE,
    "error": MUTANT_ERROR,
    "pending": MUTANT_PENDING,
}

# "FAILED <node id> - <message>": a parametrised id may hold spaces, not " - ".
_FAILED_LINE = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)
_DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S.*?)\s*$", re.MULTILINE)


@dataclass
class Fate:
    """What became of one mutant: its status, why, and whether a kept proof decided it."""

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
    fates: list[Fate]
    not_run: list[Mutant] = field(default_factory=list)  # stopped at the first survivor

    @property
    def killed(self) -> int:
        return sum(v.status == "killed" for v in self.fates)

    @property
    def ok(self) -> bool:
        return not self.not_run and all(v.status == "killed" for v in self.fates)


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


def judge(mutant: Mutant, run: Run, timeout: float) -> Fate:
    if run.code is None:
        return Fate(mutant, "error", f"timeout after {timeout:g} s", seconds=run.seconds)
    if run.code == 0:
        return Fate(mutant, "survived", "every claiming test passed", seconds=run.seconds)
    if run.code == 1:
        return Fate(mutant, "killed", first_failure(run.output), seconds=run.seconds)
    if run.code in (2, 4):  # the same selection collected cleanly, so the mutant broke it
        why = first_failure(run.output)
        return Fate(mutant, "killed", f"collection failed ({why})", seconds=run.seconds)
    if run.code in (SERVER_DIED, OVERLAY_MISSED):
        return Fate(mutant, "error", run.output.strip()[-300:], seconds=run.seconds)
    return Fate(
        mutant,
        "error",
        f"pytest exited {run.code}: {first_failure(run.output)}",
        seconds=run.seconds,
    )


def summary(result: MutantsResult) -> str:
    """``killed K/N``, with the other statuses counted and the mutants not run."""
    n = len(result.fates)
    counts = {
        s: sum(v.status == s for v in result.fates)
        for s in ("survived", "stale", "error", "pending")
    }
    extra = ", ".join(f"{c} {s}" for s, c in counts.items() if c)
    text = f"killed {result.killed}/{n}" + (f" ({extra})" if extra else "")
    if result.not_run:
        text += f"; {len(result.not_run)} not run (stopped at the first mutant not killed)"
    return text


def violations(result: MutantsResult) -> list[Violation]:
    """One ``mutant.<status>`` violation a mutant not killed, on its line in its spec."""
    return [
        Violation(
            rule=BY_STATUS[v.status].id,
            path=v.mutant.spec_path,
            line=v.mutant.line,
            message=f"{v.mutant.name}: {v.mutant.text} -> {v.status}: {v.reason}",
            stage=v.mutant.stage,
            check="mutants",
        )
        for v in result.fates
        if v.status != "killed"
    ]
