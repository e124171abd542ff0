"""A BROKEN oracle row that explains itself (trusted side; decides nothing).

Three things turn the Judge's numbers into a reason a reader can act on:

- ``differs`` and ``relation`` put words in front of a violation's numbers:
  which invariant broke (``causality: ...``, from a relation's ``says`` text
  or its kind), which axis of the domain shows it (``at T=2``, ``at input
  scale 30``), and what kind of answer changed (an exception, a NaN, a
  gradient, a second derivative);
- ``summarise`` keeps the rows of the stage the PR changed and folds the
  rows of each stage that depends on it into ONE line saying they follow
  from it (the untouched stages fail because they call the changed one);
- ``smallest`` picks, of the PR stage's differing calls, the one with the
  smallest inputs: the call the reproducer is built from (``verdict.repro``).

Words come from the trusted driver's call names, descriptions and relations
(the base's driver, never the PR's), and from the answers' dtypes and NaNs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.oracle_run import Call
from niels_gpt_contracts.stagespec import Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
ORACLE_FOLLOWS = Rule(
    "oracle.follows",
    "A stage that calls the changed one fails the oracle too.",
    "A stage that depends on the stage the PR changes calls its code, so a change of "
    "behaviour there shows up in every dependant's calls. One line per dependant says "
    "so instead of repeating the numbers against files the PR never touched; the "
    "changed stage's own rows say what broke.",
    "Fix the changed stage's rows; the dependants' follow.",
)

ORACLE_DIFFERS = Rule(
    "oracle.differs",
    "The PR's code answers an oracle call unlike the base's code.",
    "The checker drives each closure stage's public API with inputs drawn from a "
    "secret per-verdict seed over the spec's whole domain, in a plain Python process "
    "that looks like a user's, and compares the tensors with the same calls on the "
    "base's code (or the spec's float64 reference) within dtype-derived bounds. A "
    "difference beyond the bound, another exception type or other outputs is a "
    "change of behaviour that no test has to catch.",
    "Reproduce it with the call and inputs the message names (contracts pr "
    "--oracle-seed N replays the seed); make the code compute what the base's does.",
)

ORACLE_INVARIANT = Rule(
    "oracle.invariant",
    "An invariant the oracle checks does not hold on the PR's code.",
    "Where no second implementation can stand in (dropout in training), the oracle's "
    "driver checks the spec's invariants between calls: later tokens never change "
    "earlier outputs, rows of a batch are independent, a padded row equals the row "
    "alone, a cached call equals the uncached one, probabilities are causal.",
    "Reproduce the two calls the message names and make the invariant hold.",
)

FOLLOWS = ORACLE_FOLLOWS.id
DIFFERS = ORACLE_DIFFERS.id
INVARIANT = ORACLE_INVARIANT.id
SIZE = re.compile(r"(?<![\w.])(B|T|t|scale)[= ](\d+(?:\.\d+)?)")  # not cfg.T=
SCALE = re.compile(r"\bscale[= ]?(\d+(?:\.\d+)?)")
RELATION_WORDS = {
    "upper_zero": "causality: the probabilities put weight on later positions",
    "zero": "masked positions are not zero",
    "equal": "an invariant between two calls does not hold",
}


@dataclass(frozen=True)
class Failed:
    """One call of ``stage`` whose answer differed (``exact``: against the float64 reference)."""

    stage: str
    name: str
    desc: str
    exact: bool


def _side(exact: bool) -> str:
    return "the float64 reference" if exact else "the base"


def _axis(name: str, desc: str) -> str:
    """Where in the domain the call sits, in words: ``at input scale 30``, ``at T=2``."""
    scale = SCALE.search(desc)
    if scale:
        return f" at input scale {scale.group(1)}"
    sizes = {k.upper() if k == "t" else k: v for k, v in SIZE.findall(desc)}
    if "T" in sizes:
        return f" at T={sizes['T']}" + (f", B={sizes['B']}" if "B" in sizes else "")
    return ""


def _special(got: Call, want: Call) -> str | None:
    """``NaN`` or ``inf`` when one of ``got``'s outputs has one where ``want``'s is finite."""
    for key, w in want.outputs.items():
        g = got.outputs.get(key)
        if g is None or g.data.shape != w.data.shape or g.data.dtype.kind != "f":
            continue
        finite = np.isfinite(w.data.astype(np.float64))
        if bool(np.isnan(g.data[finite]).any()):
            return "NaN"
        if bool(np.isinf(g.data[finite]).any()):
            return "inf"
    return None


def _what(name: str, desc: str) -> str:
    """What kind of answer changed, with its verb: ``gradient differs``."""
    text = f"{name} {desc}".lower().replace("no_grad", "")
    if any(w in text for w in ("grad2", "second", "double backward", "hessian")):
        return "second derivative differs"
    if "backward" in text or "grad" in text:
        return "gradient differs"
    if "generate" in text:
        return "generated tokens differ"
    if "trace" in text:
        return "traced activations differ"
    return "output differs"


def differs(name: str, desc: str, got: Call, want: Call, *, exact: bool) -> str:
    """Words for a call whose answer differs: what changed and where.

    >>> # "raised ValueError where the base raised TypeError"
    >>> # "NaN at input scale 30 where the base's answer is finite"
    >>> # "output differs from the base's at T=2, B=1"
    """
    side = _side(exact)
    if got.error != want.error:
        if got.error and want.error:
            return f"raised {got.error} where {side} raised {want.error}"
        if got.error:
            return f"raised {got.error} where {side} returned"
        return f"returned where {side} raised {want.error}"
    axis = _axis(name, desc)
    special = _special(got, want)
    if special:
        return f"{special}{axis or ' in ' + name} where {side}'s answer is finite"
    return f"{_what(name, desc)} from {side}'s{axis}"


def relation(rel: Mapping[str, Any]) -> str:
    """Words for a relation that failed: its driver's ``says`` text, else its kind's."""
    says = rel.get("says")
    if isinstance(says, str) and says.strip():
        return " ".join(says.split())[:200]
    return RELATION_WORDS.get(str(rel.get("kind")), "an invariant does not hold")


def size(failed: Failed) -> tuple[float, ...]:
    """How big a call's inputs are, from its description: (T, B, scale), unknowns large."""
    found = {k.upper() if k == "t" else k: float(v) for k, v in SIZE.findall(failed.desc)}
    big = float("inf")
    return (found.get("T", big), found.get("B", big), found.get("scale", big))


def smallest(failed: Sequence[Failed], stage: str, count: int = 3) -> list[Failed]:
    """Up to ``count`` of ``stage``'s differing calls, smallest inputs first (stable)."""
    mine = [f for f in failed if f.stage == stage]
    return sorted(mine, key=size)[:count]


def summarise(
    found: Sequence[Violation],
    owners: Sequence[str],
    pr_stage: str,
    depends: Mapping[str, set[str]],
) -> list[Violation]:
    """Keep the PR stage's rows; fold each failing dependant's rows into one line.

    ``owners[i]`` is the stage ``found[i]`` is about; ``depends[s]`` is every
    stage ``s`` depends on, directly or not. A dependant's rows are folded only
    when the PR's stage has rows of its own (else nothing explains them, and
    they stay whole), and never its ``oracle.error`` or runtime rows, which say
    something of their own.

    Raises:
        ValueError: ``found`` and ``owners`` differ in length.
    """
    if len(found) != len(owners):
        raise ValueError(f"{len(found)} violations for {len(owners)} owners")
    if pr_stage not in owners:
        return list(found)
    out: list[Violation] = []
    folded: dict[str, list[Violation]] = {}
    for v, owner in zip(found, owners, strict=True):
        foldable = v.rule in (DIFFERS, INVARIANT)
        if owner != pr_stage and pr_stage in depends.get(owner, set()) and foldable:
            if owner not in folded:
                folded[owner] = []
                out.append(v)  # placeholder: replaced below, keeps the stage order
            folded[owner].append(v)
        else:
            out.append(v)
    for owner, rows in folded.items():
        n = Counter(r.rule for r in rows)
        parts = [f"{n[DIFFERS]} differing call(s)"] if n[DIFFERS] else []
        parts += [f"{n[INVARIANT]} broken invariant(s)"] if n[INVARIANT] else []
        line = (
            f"{owner}: follows from {pr_stage}: {' and '.join(parts)} there too; {owner} "
            f"depends on {pr_stage}, which this PR changes (see {pr_stage}'s rows)"
        )
        at = out.index(rows[0])
        out[at] = replace(rows[0], rule=FOLLOWS, path=None, line=None, message=line)
    return out


def depends(
    specs: Mapping[str, Spec], uses: Mapping[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Every stage each stage depends on or uses (its files import it: ``uses``, from
    ``checks.context.importers``, the edges the PR's closure follows), directly or
    through others."""
    out: dict[str, set[str]] = {}

    def edges(stage: str) -> list[str]:
        declared = list(specs[stage].depends_on) if stage in specs else []
        return sorted({*declared, *(uses or {}).get(stage, ())})

    def walk(stage: str, trail: tuple[str, ...] = ()) -> set[str]:
        if stage in out:
            return out[stage]
        found: set[str] = set()
        for dep in edges(stage):
            if dep not in trail:
                found |= {dep, *walk(dep, (*trail, stage))}
        out[stage] = found
        return found

    for stage in specs:
        walk(stage)
    return out
