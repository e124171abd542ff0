"""The rule registry: what every rule id means.

Each fixed id has one ``RuleDoc`` in ``RULES``: a short text, a full
description and help on mending a breach (SARIF shows all three). A rule a
stage's spec defines (``static.<id>``, ``runtime.<id>``) is described by that
spec, stage by stage (``SpecRule``): two stages may define the same id with
different texts. A new fixed id is one entry in ``RULES``; a test fails while
an id the checker emits is unregistered.

The entries live by family, one module each, and ``RULES`` merges them:
``static`` (paths, modules, source, API, invariant claims, stage specs,
amendments), ``runs`` (tests, devices, mutants, the sandbox guard) and
``oracle``; ``doc`` holds ``RuleDoc``, ``spec_rules`` the spec-defined rules.
"""

from __future__ import annotations

from niels_gpt_contracts.rules.doc import RuleDoc
from niels_gpt_contracts.rules.oracle import ORACLE
from niels_gpt_contracts.rules.runs import RUNS
from niels_gpt_contracts.rules.spec_rules import SPEC_RULE_KINDS, SpecRule
from niels_gpt_contracts.rules.static import STATIC

__all__ = ["RULES", "SPEC_RULE_KINDS", "RuleDoc", "SpecRule", "unregistered"]

# Every fixed rule id, one entry each. A new id needs one entry in its family's
# module (the tests check that every id the checker can emit is registered).
RULES: dict[str, RuleDoc] = {**STATIC, **RUNS, **ORACLE}


def unregistered(rule: str) -> RuleDoc:
    """The description of an id nobody registered (reporters never crash on one)."""
    return RuleDoc(
        f"Rule {rule}.",
        f"Rule {rule!r} has no registered description (a checker bug: register it in "
        "niels_gpt_contracts.rules.RULES).",
        "See the result's message.",
    )
