"""The one result model every reporter renders.

A run produces ``Outcome`` rows (one per stage and check, each KEPT, BROKEN or
NOT RUN) and the ``Violation`` records behind the BROKEN ones. Rule ids are
stable strings: a fixed one is a ``rules.Rule`` defined beside the code that
emits it (``reporters.rule_index`` reads the registry), a spec's rule ``<id>``
(``static.<id>``, ``runtime.<id>``) by the spec that defines it
(``SpecRule``, kept in ``Result.spec_rules`` stage by stage).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from niels_gpt_contracts.rules import RuleDoc, SpecRule

__all__ = [
    "BROKEN",
    "KEPT",
    "NOT_RUN",
    "REPORT_SCHEMA_VERSION",
    "Outcome",
    "Result",
    "RuleDoc",
    "SpecRule",
    "Status",
    "Violation",
]

Status = Literal["KEPT", "BROKEN", "NOT RUN"]
KEPT: Status = "KEPT"
BROKEN: Status = "BROKEN"
NOT_RUN: Status = "NOT RUN"
# How a row the verdict skipped after its first BROKEN one begins (``verdict.pipeline``):
# such a row says nothing of its device, so the summary does not call it a skip.
STOPPED = "not run: the verdict stopped at the first BROKEN row"

# Version of the JSON report (``--format json`` of ``check`` and ``mutants``)
# that ``specs/report.schema.json`` describes; bump both together.
REPORT_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Violation:
    """One broken rule, placed as precisely as the check can.

    ``line`` is 1-based, or ``None`` when the breach is about a whole file (a
    forbidden path) or about nothing on disk (an unclaimed invariant).
    ``changed`` marks breaches on lines or paths the PR changed; reporters that
    must pick (GitHub shows ten annotations per step) put those first.
    """

    rule: str
    path: str | None
    line: int | None
    message: str
    stage: str
    check: str
    changed: bool = False


@dataclass
class Outcome:
    """The verdict of one check on one stage."""

    stage: str
    check: str
    status: Status
    summary: str
    violations: list[Violation] = field(default_factory=list)


@dataclass
class Result:
    """Everything one ``contracts check`` run found.

    Attributes:
        mode: ``"tree"`` (every stage on a tree) or ``"pr"`` (one stage gated).
        outcomes: one row per stage and check, in the order they ran.
        stages: the stages judged, in order.
        base, head, merge_base: the revisions of a PR gate (``head`` is
            ``None`` for the working tree).
        changed_paths: how many paths the PR changed (PR gate only).
        required_devices: devices whose NOT RUN counts as BROKEN.
        spec_rules: the spec-defined rules of the judged stages, by
            ``(stage, rule id)``; they describe ``static.<id>`` stage by stage.
        phases: ``(phase, seconds)`` in the order the phases ran (``contracts
            pr``); ``seconds``: the whole run's wall time, when measured.
    """

    mode: Literal["tree", "pr"]
    outcomes: list[Outcome] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    base: str | None = None
    head: str | None = None
    merge_base: str | None = None
    changed_paths: int | None = None
    required_devices: tuple[str, ...] = ()
    spec_rules: dict[tuple[str, str], SpecRule] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)
    seconds: float | None = None

    @property
    def violations(self) -> list[Violation]:
        return [v for o in self.outcomes for v in o.violations]

    @property
    def ok(self) -> bool:
        return all(o.status != BROKEN for o in self.outcomes)

    def stage_status(self, stage: str) -> Status:
        """BROKEN if any row is; NOT RUN for a pending stage (no package yet); else KEPT."""
        rows = [o for o in self.outcomes if o.stage == stage]
        if any(o.status == BROKEN for o in rows):
            return BROKEN
        if any(o.check == "stage" and o.status == NOT_RUN for o in rows):
            return NOT_RUN
        return KEPT

    def add_spec_rule(self, rule: SpecRule) -> None:
        self.spec_rules[(rule.stage, rule.rule)] = rule
