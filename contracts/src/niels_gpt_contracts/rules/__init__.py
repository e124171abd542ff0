"""What a rule is: ``Rule`` (a fixed rule id, its documentation, registered where
it is defined), ``RuleDoc`` (the three texts SARIF shows of a rule id) and
``SpecRule`` (a rule a stage's spec defines, described by that spec) and
``RuleKind`` (a kind of spec rule, one module of ``rules.kinds``).

A fixed rule is a ``Rule`` object defined beside the code that emits it
(``checks.ownership.paths`` defines ``path.meta``, ``verdict.ratchet`` ``tests.failed``);
defining it registers it (``registered``), the way ruff keeps a rule's
documentation with its implementation. A spec-defined id (``static.<id>``,
``runtime.<id>``) is described by its spec, stage by stage: two stages may
define the same id with different texts. This package imports nothing from
the checker, so every layer may use it.
"""

from __future__ import annotations

from niels_gpt_contracts.rules.doc import GATE_FROM_BASE, RuleDoc
from niels_gpt_contracts.rules.registry import Rule, registered
from niels_gpt_contracts.rules.spec_rules import RuleKind, SpecRule, rule_kinds

__all__ = [
    "GATE_FROM_BASE",
    "Rule",
    "RuleDoc",
    "RuleKind",
    "SpecRule",
    "registered",
    "rule_kinds",
]
