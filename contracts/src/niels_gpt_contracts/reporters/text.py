"""Plain text: one KEPT/BROKEN/NOT RUN line per stage and check, the
violations under their row, and a summary line. Every line goes through
``printable``, so a file name or message can never break a line or carry
terminal control sequences."""

from __future__ import annotations

from niels_gpt_contracts.reporters.common import location, ordered, printable, summary
from niels_gpt_contracts.result import Result


def lines(result: Result) -> list[str]:
    """The report, one printable line each (no line breaks inside)."""
    out: list[str] = []
    if result.mode == "pr":
        head = result.head[:12] if result.head else "the working tree"
        what = f"gating stage {result.stages[0]}"
        if any(o.check == "amendment" for o in result.outcomes):
            what = f"judging the spec amendment of {', '.join(result.stages) or 'no stage'}"
        out.append(
            f"contracts: {what} from merge-base {(result.merge_base or '')[:12]} to {head} "
            f"({result.changed_paths} changed paths)"
        )
    else:
        out.append(f"contracts: checking {len(result.stages)} stage(s) on the working tree")
    width = max((len(o.stage) for o in result.outcomes), default=0)
    for o in result.outcomes:
        out.append(f"{o.status:<7}  {o.stage:<{width}}  {o.check:<11}  {o.summary}")
        for v in ordered(o.violations):
            out.append(f"    {location(v)}: {v.rule}: {v.message}")
    out.append(summary(result))
    return [printable(line) for line in out]


def render(result: Result) -> str:
    return "\n".join(lines(result)) + "\n"


def render_error(message: str) -> str:
    return f"contracts: error: {printable(message)}\n"
