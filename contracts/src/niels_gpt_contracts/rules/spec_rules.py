"""The rules a stage's spec defines (``static.<id>``, ``runtime.<id>``), described
by that spec: ``SpecRule`` and what each kind of rule checks (``SPEC_RULE_KINDS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from niels_gpt_contracts.rules.doc import GATE_FROM_BASE, RuleDoc

# What each kind of spec-defined static rule checks (rule descriptions).
SPEC_RULE_KINDS: dict[str, str] = {
    "import_as_module": "the module is bound as a module object and its listed attributes "
    "are only called through it, never imported or bound by name",
    "forbidden_name": "none of the listed names appears in the stage's code, as a name, an "
    "attribute, an import or a string argument",
    "forbidden_in_function": "no listed method or function is called inside the named "
    "function (and, where the rule says so, the local helpers it calls)",
    "dependencies": "the package's [project].dependencies name exactly the allowed distributions",
    "forbidden_ops": "no listed ATen op (or, where the rule says so, no dtype or device "
    "change) is dispatched while the rule's driver runs the stage's code",
}


@dataclass(frozen=True)
class SpecRule:
    """A rule one stage's spec defines (``static.<id>``), described by that spec.

    Two stages may define the same id with different texts; each keeps its own.
    """

    stage: str
    rule: str
    kind: str
    message: str
    spec_path: str
    line: int | None = None

    def doc(self) -> RuleDoc:
        where = f"{self.spec_path}:{self.line}" if self.line else self.spec_path
        what = SPEC_RULE_KINDS.get(self.kind, f"a rule of kind {self.kind!r}")
        return RuleDoc(
            self.message,
            f"Stage {self.stage!r} defines rule {self.rule!r} ({self.kind}: {what}) in "
            f"{where}: {self.message}. {GATE_FROM_BASE}",
            f"Change the code so that the rule holds again ({self.message}); the rule "
            f"itself changes only with the stage's spec, in a maintainer PR.",
        )
