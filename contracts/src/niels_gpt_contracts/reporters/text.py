"""Plain text: one KEPT/BROKEN/NOT RUN line per stage and check, the
violations under their row, and a summary line. Every line goes through
``printable``, so a file name or message can never break a line or carry
terminal control sequences."""

from __future__ import annotations

from niels_gpt_contracts.reporters.common import location, ordered, printable, summary
from niels_gpt_contracts.result import Outcome, Result


def row_lines(o: Outcome, width: int) -> list[str]:
    """One row and its violations, printable (also streamed while a verdict runs)."""
    out = [f"{o.status:<7}  {o.stage:<{width}}  {o.check:<11}  {o.summary}"]
    out += [f"    {location(v)}: {v.rule}: {v.message}" for v in ordered(o.violations)]
    return [printable(line) for line in out]


def progress_lines(o: Outcome, seconds: float) -> list[str]:
    """``row_lines`` of a row streamed while a verdict runs, each after ``[  12.3 s] ``.

    ``seconds``: since the verdict's first phase began (``verdict.pipeline``).
    """
    return [f"[{seconds:6.1f} s] {line}" for line in row_lines(o, len(o.stage))]


def timing(result: Result) -> str | None:
    """``time: static 0.4 s, ...; total 93.1 s``: how long each phase took, if timed."""
    if not result.phases:
        return None
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.phases)
    total = f"; total {result.seconds:.1f} s" if result.seconds is not None else ""
    return f"time: {parts}{total}"


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
        out += row_lines(o, width)
    took = timing(result)
    if took is not None:
        out.append(took)
    out.append(summary(result))
    return [printable(line) for line in out]


def render(result: Result) -> str:
    return "\n".join(lines(result)) + "\n"


def render_error(message: str) -> str:
    return f"contracts: error: {printable(message)}\n"
