"""Static rules, read from source with ``ast`` (nothing is imported).

Each kind of rule is one module of ``rules.kinds`` (its keys, words and
check); this module runs the static ones over a tree and places what they
find as ``Violation`` rows, marking those on lines the PR changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import rule_kinds
from niels_gpt_contracts.stagespec import Spec


def check_static(
    spec: Spec, tree: Tree, changed_lines: Mapping[str, set[int]] | None = None
) -> list[Violation]:
    """Every static rule of ``spec`` on ``tree``; ``changed_lines`` marks PR lines.

    Runtime rules (``forbidden_ops``) are judged by ``contracts pr``, which runs
    their drivers; they are skipped here.
    """
    files = tree.files()
    kinds = rule_kinds()
    out: list[Violation] = []
    for rule in spec.rules:
        check = kinds[rule.kind].check
        if check is None:
            continue
        for path, line, message in check(rule.params, tree, files):
            changed = bool(
                changed_lines is not None
                and path is not None
                and path in changed_lines
                and (line is None or line in changed_lines[path])
            )
            out.append(
                Violation(
                    rule.rule_id,
                    path,
                    line,
                    f"{message} [{rule.message}]",
                    spec.id,
                    "static",
                    changed=changed,
                )
            )
    return out
