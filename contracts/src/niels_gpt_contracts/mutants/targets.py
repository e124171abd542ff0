"""Whether every catalogued mutant still finds its text in a tree, read without running.

A mutant patches its module by text (``find`` -> ``replace``); when the code
moves on and the text is gone, the mutant tests nothing, and the tests it
stood for go unproven. The mutant runner reports that as ``mutant.stale``
when it runs (``nox -s mutants``, a PR's verdict), which a landing run does
not; ``stale_targets`` finds the same thing from the tree's text alone, so
``contracts check`` on main (CI's ``contracts`` session) refuses a tree
whose code has left a mutant behind. Grouped-query attention's reshaped
attention core left eleven mutants of three stages stale on main before this
check existed.

A mutant an amendment marked ``retarget = true`` is expected to go stale
when its stage's PR rewrites the code: it is counted apart (``pending``),
not refused here; the mutant gate (``mutant.pending``) still fails on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.mutants.catalogue import apply, catalogue
from niels_gpt_contracts.mutants.fates import MUTANT_STALE
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.stagespec import Spec

CHECK = "mutants"


@dataclass
class Targets:
    """A stage's mutants read against a tree: how many apply, the stale ones' violations,
    and the marked ones that no longer apply (``pending``)."""

    applied: int = 0
    stale: list[Violation] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)

    def summary(self) -> str:
        marked = f"; {len(self.pending)} marked for re-targeting" if self.pending else ""
        return f"{self.applied} mutant(s) find their text in the code{marked}"


def stale_targets(spec: Spec, tree: Tree) -> Targets:
    """Apply each of ``spec``'s mutants to ``tree``'s text of its file, in memory.

    Raises:
        SpecErrors: the catalogue itself is malformed (``catalogue``).
    """
    spec_text = tree.read(spec.path)
    out = Targets()
    for mutant in catalogue(spec, spec_text):
        applied = apply(mutant, tree.read(mutant.file))
        if applied.source is not None:
            out.applied += 1
        elif mutant.retarget:
            out.pending.append(mutant.id)
        else:
            why = applied.stale or "stale"
            message = f"mutant {mutant.id} tests nothing: {why}"
            out.stale.append(
                Violation(MUTANT_STALE.id, spec.path, mutant.line, message, spec.id, CHECK)
            )
    return out
