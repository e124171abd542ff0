"""Every fixed rule id the checker emits, gathered from the modules that emit them.

Each emitting module describes its own ids in a ``RULE_DOCS`` table beside
the code that raises them; ``RULES`` merges those tables here, in the report
layer, which may import every layer below it. An id described twice is a
checker bug and fails at import (``gather``). ``rule_doc`` and ``spec_rule``
say how one violation is described: by the spec that defines its rule
(``static.<id>``, ``runtime.<id>``; two stages may word the same id
differently), else by ``RULES``, else as ``unregistered``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType

from niels_gpt_contracts.checks import (
    amendment,
    api,
    api_source,
    autoload,
    coverage,
    device_branches,
    devices,
    invariants,
    modules,
    name_rules,
    names,
    paths,
    source,
    staleness,
)
from niels_gpt_contracts.mutants import fates
from niels_gpt_contracts.result import Result
from niels_gpt_contracts.rules import RuleDoc, SpecRule
from niels_gpt_contracts.verdict import (
    explain,
    mutation,
    oracle,
    oracle_aftermath,
    oracle_compare,
    protocol_rules,
    ratchet,
    removed,
    weakened,
)

EMITTERS: tuple[ModuleType, ...] = (
    paths,
    autoload,
    modules,
    source,
    name_rules,
    names,
    api,
    api_source,
    invariants,
    amendment,
    devices,
    device_branches,
    staleness,
    coverage,
    ratchet,
    removed,
    weakened,
    mutation,
    fates,
    oracle,
    oracle_compare,
    oracle_aftermath,
    explain,
    protocol_rules,
)


def gather(tables: Iterable[tuple[str, Mapping[str, RuleDoc]]]) -> dict[str, RuleDoc]:
    """The ``(module name, RULE_DOCS)`` tables merged into one.

    Raises:
        ValueError: an id two modules describe (naming it and both modules).
    """
    merged: dict[str, RuleDoc] = {}
    owner: dict[str, str] = {}
    for module, table in tables:
        for rule, doc in table.items():
            if rule in merged:
                raise ValueError(f"rule {rule!r} is described in {owner[rule]} and in {module}")
            merged[rule], owner[rule] = doc, module
    return merged


RULES: dict[str, RuleDoc] = gather((m.__name__, m.RULE_DOCS) for m in EMITTERS)


def unregistered(rule: str) -> RuleDoc:
    """The description of an id no module describes (reporters never crash on one)."""
    return RuleDoc(
        f"Rule {rule}.",
        f"Rule {rule!r} has no registered description (a checker bug: add it to the "
        "RULE_DOCS table of the module that emits it).",
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
    return RULES.get(rule) or unregistered(rule)
