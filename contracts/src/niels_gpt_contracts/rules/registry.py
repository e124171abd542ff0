"""``Rule``: one fixed rule id with its documentation, registered where it is defined.

A module that emits a rule defines it once, at module level, beside the check
that raises it (``PATH_META = Rule("path.meta", short, full, help)``) and
emits ``PATH_META.id``; defining the object registers it, as ruff's rules and
import-linter's contract classes are found by being declared. ``registered``
is the registry: every rule whose module has been imported. The report layer
(``reporters.rule_index``) imports the emitting packages first, so the
registry it reads is whole.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from niels_gpt_contracts.rules.doc import RuleDoc

RULE_ID = re.compile(r"[a-z]+\.[a-z][a-z0-9-]*")
"""A fixed rule id: ``<family>.<name>``, lower case, words joined by ``-``."""

_REGISTRY: dict[str, Rule] = {}


@dataclass(frozen=True)
class Rule:
    """A fixed rule id, what SARIF shows of it, and the module that defines it.

    ``short``: one line naming the breach; ``full``: what the rule guards and
    why; ``help``: how to mend a breach. ``owner`` (set on creation) is the
    defining module's name.

    Raises:
        ValueError: ``id`` is not ``<family>.<name>``, or another module
            already defines it (naming the id and both modules).
    """

    id: str
    short: str
    full: str
    help: str
    owner: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not RULE_ID.fullmatch(self.id):
            raise ValueError(f"rule id {self.id!r} is not <family>.<name> (lower case, '-')")
        if not self.owner:
            # __post_init__ <- the dataclass __init__ <- the defining module.
            object.__setattr__(self, "owner", sys._getframe(2).f_globals.get("__name__", "?"))
        register(self)

    @property
    def doc(self) -> RuleDoc:
        """The three texts SARIF shows of this rule."""
        return RuleDoc(self.short, self.full, self.help)


def register(rule: Rule) -> None:
    """Add ``rule`` to the registry; its own module may define it again (a reload).

    Raises:
        ValueError: a rule of the same id from another module is registered.
    """
    known = _REGISTRY.get(rule.id)
    if known is not None and known.owner != rule.owner:
        raise ValueError(f"rule {rule.id!r} is defined in {known.owner} and in {rule.owner}")
    _REGISTRY[rule.id] = rule


def registered() -> dict[str, Rule]:
    """Every rule defined so far, by id (a copy: the registry changes only by definition)."""
    return dict(_REGISTRY)
