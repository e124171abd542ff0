"""The one result model every reporter renders.

A run produces ``Outcome`` rows (one per stage and check, each KEPT, BROKEN or
NOT RUN) and the ``Violation`` records behind the BROKEN ones. Rule ids are
stable strings: the fixed ones are listed in ``RULES``; a spec's static rule
``<id>`` appears as ``static.<id>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Status = Literal["KEPT", "BROKEN", "NOT RUN"]
KEPT: Status = "KEPT"
BROKEN: Status = "BROKEN"
NOT_RUN: Status = "NOT RUN"

# Fixed rule ids and what each one guards (SARIF rule descriptions).
RULES: dict[str, str] = {
    "path.meta": "Meta paths (specs/, contracts/, CI, nox, constraints, root pyproject) "
    "belong to no stage; no stage PR may change them.",
    "path.forbidden": "The path matches the stage's must_not_change patterns.",
    "path.not-allowed": "The path matches none of the stage's may_change patterns.",
    "path.line-scope": "The file may change only on lines its line-scoped permission allows.",
    "path.autoload": "A stage PR adds or changes code that Python or pytest loads without an "
    "import: conftest.py, sitecustomize.py, *.pth, ini files, entry points, build hooks.",
    "path.symlink": "A stage PR adds or changes a symbolic link; stages ship regular files.",
    "module.unlisted": "A file under the stage's src/ is not among the modules its spec lists.",
    "module.shadowed": "A file under the stage's src/ sits at the path of a module another "
    "stage owns.",
    "module.missing": "A module the stage's spec lists is absent.",
    "module.undeclared-import": "A stage module imports a module of a stage it does not "
    "depend on (or of no stage).",
    "source.import": "A stage module imports outside the allowed modules (the stages' "
    "namespace, public torch, pure-computation stdlib).",
    "source.dynamic": "A stage module builds names or code at run time, or reaches "
    "interpreter internals, so its behaviour cannot be read from its source.",
    "api.missing": "A public object the spec lists cannot be imported.",
    "api.kind": "A public object is not of the kind the spec says.",
    "api.signature": "A public signature differs from the spec (names, kinds, defaults, "
    "annotations).",
    "api.exports": "A module does not export exactly the names the spec lists.",
    "api.fields": "A class does not declare exactly the annotated fields the spec lists.",
    "api.identity": "A re-exported object is not the very object the spec names.",
    "api.probe": "The API could not be inspected (import or probe failure).",
    "api.source": "The signature inspect reports differs from the def that runs (an assigned "
    "__signature__, a hiding decorator), or the running code is not in the tree.",
    "invariant.unclaimed": "A spec invariant is claimed by no test.",
    "invariant.unknown": "A test claims an invariant id that no spec declares.",
    "invariant.malformed": "An invariant marker is not a single string literal '<stage>.<id>'.",
    "stage.unspecified": "A stage package under packages/ has no spec in specs/.",
    "tests.failed": "A reference test (the base's, or a maintainer's acceptance test) or one "
    "of the PR's own tests fails on the PR's code.",
    "tests.skipped": "A reference test skips on the PR's code but runs on the base's code.",
    "tests.missing": "A reference test the base collects never runs on the PR's code.",
    "tests.error": "A test run of the verdict could not be read (collection error, time limit, "
    "no report); nothing it would have proved counts.",
    "mutant.survived": "A catalogued bug of the stage survives its tests.",
    "mutant.stale": "A catalogued bug no longer applies to the code (its find text is gone).",
    "mutant.error": "A mutant run failed for a reason other than a test failure.",
    "sandbox.tampered": "A file of the checker, of the sandbox interpreter or of the verdict's "
    "workspace changed while the PR's code ran.",
    "device.failed": "A test claiming the invariant failed on the device.",
    "device.incomplete": "The device run ended in error before the invariant was verified.",
    "device.not-run": "The invariant was not verified on a device the run requires.",
    "device.stale": "The device report was produced from another tree than the one judged.",
    "device.partial": "The device report covers a narrowed test selection (-k, -m, node ids, -x).",
}


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
        rule_texts: descriptions of spec-defined rule ids (``static.<id>``).
    """

    mode: Literal["tree", "pr"]
    outcomes: list[Outcome] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    base: str | None = None
    head: str | None = None
    merge_base: str | None = None
    changed_paths: int | None = None
    required_devices: tuple[str, ...] = ()
    rule_texts: dict[str, str] = field(default_factory=dict)

    @property
    def violations(self) -> list[Violation]:
        return [v for o in self.outcomes for v in o.violations]

    @property
    def ok(self) -> bool:
        return all(o.status != BROKEN for o in self.outcomes)

    def stage_status(self, stage: str) -> Status:
        rows = [o for o in self.outcomes if o.stage == stage]
        return BROKEN if any(o.status == BROKEN for o in rows) else KEPT

    def rule_text(self, rule: str) -> str:
        return RULES.get(rule) or self.rule_texts.get(rule) or rule
