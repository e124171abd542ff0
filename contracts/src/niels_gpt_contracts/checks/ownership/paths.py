"""Path rules: which changed paths a stage's PR may carry.

Each changed path is judged in this order, first match wins:

1. a meta path (``stagespec.META_PATTERNS``) -> ``path.meta``;
2. a ``must_not_change`` pattern -> ``path.forbidden``;
3. a ``may_change`` pattern -> allowed;
4. a ``line_scoped`` permission -> allowed only if every changed line is one
   the permission covers (``path.line-scope``); an added, deleted, renamed or
   retyped file is never covered;
5. anything else -> ``path.not-allowed``.

A rename is judged as both of its paths; deletions and type changes
(file <-> symlink) count like any other change.
"""

from __future__ import annotations

from niels_gpt_contracts.checks.ownership import lines
from niels_gpt_contracts.gitdiff import Change, Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import GATE_FROM_BASE, Rule
from niels_gpt_contracts.stagespec import META_SPEC, LineScope, Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
PATH_META = Rule(
    "path.meta",
    "A stage PR changed a meta path.",
    "Meta paths (specs/, contracts/, .github/, .ci/, noxfile.py and noxkit/, "
    "constraints.txt, the root pyproject.toml, .pre-commit-hooks.yaml) decide how every "
    "stage is judged, so "
    "they belong to no stage and no stage PR may add, change or delete them.",
    "Move the meta change into its own PR, which a maintainer reviews and merges; keep "
    "the stage PR to the stage's own paths.",
)

PATH_FORBIDDEN = Rule(
    "path.forbidden",
    "The PR changed a path the stage must not change.",
    "The path matches the stage's must_not_change patterns, which win over every "
    "permission. " + GATE_FROM_BASE,
    "Revert the change to this path; if the stage really needs it, change the spec "
    "first in a separate, reviewed PR.",
)

PATH_NOT_ALLOWED = Rule(
    "path.not-allowed",
    "The PR changed a path outside the stage's allowlist.",
    "The path matches none of the stage's may_change patterns nor a line-scoped "
    "permission. " + GATE_FROM_BASE,
    "Revert the change, or move it to a PR of the stage that owns the path.",
)

PATH_LINE_SCOPE = Rule(
    "path.line-scope",
    "A file changed beyond what its line-scoped permission allows.",
    "Some files outside the stage may change only on certain lines (for example: only "
    "to add a keyword argument to a call). Both versions are parsed and compared; "
    "every other line must stay identical, and the file may only be edited in place.",
    "Undo the edits the permission does not cover (the message names the permission "
    "and what it allows); keep the file's path and type.",
)

_VERB = {
    "A": "added",
    "D": "deleted",
    "M": "modified",
    "T": "changed type (file <-> symlink)",
    "C": "copied",
    "U": "unmerged",
}


def _verb(change: Change, path: str) -> str:
    if change.status == "R":
        return (
            f"renamed to {change.path!r}"
            if path == change.old_path
            else f"renamed from {change.old_path!r}"
        )
    if change.status == "C" and path == change.path:
        return f"copied from {change.old_path!r}"
    return _VERB.get(change.status, f"changed (git status {change.status})")


def check_paths(
    spec: Spec, changes: list[Change], base: Tree, head: Tree
) -> tuple[list[Violation], int]:
    """Violations of the path rules, and how many changed paths were judged."""
    out: list[Violation] = []
    judged = 0
    scoped: list[tuple[str, LineScope, Change]] = []

    def add(rule: str, path: str, message: str, line: int | None = None) -> None:
        out.append(Violation(rule, path, line, message, spec.id, "paths", changed=True))

    for change in changes:
        for path in change.paths():
            if change.status == "C" and path == change.old_path:
                continue  # a copy's source is unchanged
            judged += 1
            verb = _verb(change, path)
            if META_SPEC.match_file(path):
                add(
                    PATH_META.id,
                    path,
                    f"{verb}: a meta path (specs, checker, CI, nox, "
                    "constraints, root pyproject) that no stage PR may change",
                )
            elif spec.must_not_match.match_file(path):
                add(
                    PATH_FORBIDDEN.id,
                    path,
                    f"{verb}: matches must_not_change of stage {spec.id!r} ({spec.path})",
                )
            elif spec.may_match.match_file(path):
                continue
            else:
                scope = next((s for s in spec.line_scoped if s.matcher.match_file(path)), None)
                if scope is None:
                    add(
                        PATH_NOT_ALLOWED.id,
                        path,
                        f"{verb}: outside the may_change patterns of "
                        f"stage {spec.id!r} ({spec.path})",
                    )
                elif change.status != "M":
                    add(
                        PATH_LINE_SCOPE.id,
                        path,
                        f"{verb}: under line-scoped permission "
                        f"{scope.id!r} a file may only be edited in place ({scope.description})",
                    )
                else:
                    scoped.append((path, scope, change))

    if scoped:
        before = base.read_many(p for p, _, _ in scoped)
        after = head.read_many(p for p, _, _ in scoped)
        for path, scope, _change in scoped:
            old, new = before.get(path), after.get(path)
            if old is None or new is None:
                add(
                    PATH_LINE_SCOPE.id,
                    path,
                    f"not a readable text file on both sides, so "
                    f"permission {scope.id!r} cannot cover it ({scope.description})",
                )
                continue
            for line, problem in lines.judge(scope, old, new):
                add(
                    PATH_LINE_SCOPE.id,
                    path,
                    f"{problem} (permission {scope.id!r}: {scope.description})",
                    line,
                )
    return out, judged
