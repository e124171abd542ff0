"""Every fixed rule id the checker emits, read from the rule registry.

A fixed rule is a ``rules.Rule`` defined beside the check that emits it, and
defining it registers it. ``RULES`` imports every module of the packages that
emit rules (``RULE_PACKAGES``; their ``_``-prefixed modules are sandbox
scripts and define none) and reads the registry, here in the report layer,
which may import every layer below it. ``rule_doc`` and ``spec_rule`` say how
one violation is described: by the spec that defines its rule
(``static.<id>``, ``runtime.<id>``; two stages may word the same id
differently), else by ``RULES``, else as ``unregistered``.
"""

from __future__ import annotations

import importlib
import pkgutil

from niels_gpt_contracts.result import Result
from niels_gpt_contracts.rules import Rule, RuleDoc, SpecRule, registered

RULE_PACKAGES = (
    "niels_gpt_contracts.checks",
    "niels_gpt_contracts.verdict",
    "niels_gpt_contracts.mutants",
)


def emitting_modules() -> list[str]:
    """The names of every module of ``RULE_PACKAGES`` and of their subpackages
    (``checks.code``...), sandbox scripts (``_*``) left out."""
    names: list[str] = []
    for package in RULE_PACKAGES:
        path = importlib.import_module(package).__path__
        names += [
            m.name
            for m in pkgutil.walk_packages(path, f"{package}.")
            if not m.name.rsplit(".", 1)[1].startswith("_")
        ]
    return names


def discover() -> dict[str, Rule]:
    """Every rule the checker defines: its emitting modules imported, the registry read."""
    for name in emitting_modules():
        importlib.import_module(name)
    return registered()


RULES: dict[str, Rule] = discover()


def unregistered(rule: str) -> RuleDoc:
    """The description of an id no module defines (reporters never crash on one)."""
    return RuleDoc(
        f"Rule {rule}.",
        f"Rule {rule!r} has no registered description (a checker bug: define it as a "
        "rules.Rule beside the code that emits it).",
        "See the result's message.",
    )


def spec_rule(result: Result, rule: str, stage: str, path: str | None = None) -> SpecRule | None:
    """The spec rule behind a violation of ``rule`` reported under ``stage``.

    A stage's own rule first; else (a rule of a stage the reported one
    depends on, judged at run time) the one whose spec is ``path``, or the
    only rule with that id. None for a fixed id.
    """
    own = result.spec_rules.get((stage, rule))
    if own is not None or rule in RULES:
        return own
    same = [r for r in result.spec_rules.values() if r.rule == rule]
    at_path = [r for r in same if r.spec_path == path]
    found = at_path or same
    return found[0] if len(found) == 1 else None


def rule_doc(result: Result, rule: str, stage: str, path: str | None = None) -> RuleDoc:
    """How ``rule`` is described for a violation reported under ``stage``."""
    own = spec_rule(result, rule, stage, path)
    if own is not None:
        return own.doc()
    fixed = RULES.get(rule)
    return fixed.doc if fixed is not None else unregistered(rule)
