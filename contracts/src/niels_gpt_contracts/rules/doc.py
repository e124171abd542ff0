"""``RuleDoc``: what one rule id means, in the three texts SARIF shows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleDoc:
    """What a rule id means, as SARIF shows it.

    ``short``: one line naming the breach; ``full``: what the rule guards and
    why; ``help``: how to mend a breach.
    """

    short: str
    full: str
    help: str


GATE_FROM_BASE = (
    "The gate reads the stage's spec from the PR's base revision, so a PR cannot loosen "
    "its own rules."
)
