"""Helpers shared by the reporters."""

from __future__ import annotations

from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Result, Violation


def ordered(violations: list[Violation]) -> list[Violation]:
    """Breaches on changed lines first, then located ones, then the rest."""
    return sorted(
        violations,
        key=lambda v: (not v.changed, v.path is None, v.line is None, v.path or "", v.line or 0),
    )


def location(v: Violation) -> str:
    if v.path is None:
        return "(no file)"
    return f"{v.path}:{v.line}" if v.line is not None else v.path


def summary(result: Result) -> str:
    """The one summary line every format ends with."""
    stages = result.stages
    broken = [s for s in stages if result.stage_status(s) == BROKEN]
    if any(o.stage not in stages and o.status == BROKEN for o in result.outcomes):
        broken.append("repo")
    kept = len(stages) - len([s for s in broken if s in stages])
    n = len(result.violations)
    verdict = "KEPT" if result.ok else "BROKEN"
    text = f"{verdict}: {len(stages)} stage{'s' * (len(stages) != 1)}, {kept} {KEPT}, "
    text += f"{len(broken)} {BROKEN}"
    if broken:
        text += f" ({', '.join(broken)})"
    text += f"; {n} violation{'s' * (n != 1)}"
    not_run = sorted(
        {
            o.check.split(":", 1)[1]
            for o in result.outcomes
            if o.status == NOT_RUN and o.check.startswith("device:")
        }
    )
    if not_run:
        text += f"; not run on {', '.join(not_run)} (a skip is not a pass)"
    if result.mode == "pr":
        text += f"; base {result.base[:12] if result.base else '?'}, "
        text += f"head {result.head[:12] if result.head else 'working tree'}"
    return text
