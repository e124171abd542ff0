"""The verdict as a list of phases: cheapest first, timed, streamed, stopped early.

A ``Phase`` is a name, the rows (checks) it gives, and a function of the
verdict's state that returns (or yields) ``Outcome`` rows; it may also append
rows to ``state.result`` itself (the ``static_verdict`` helpers do). ``run``
runs the phases in order and, for each one:

- hands every new row to ``on_row`` as soon as it is there, with the
  seconds since the first phase began, so that a long verdict can show what
  it knows while it runs (the CLI prints it with the text reporter's
  ``progress_lines``; this module renders nothing);
- records how long the phase took (``Result.phases``; the text and JSON
  reports print it);
- after a phase that gave a BROKEN row, stops unless ``full``: every later
  phase is given one ``NOT RUN`` row per check it would have given, naming
  the row that stopped the verdict, except phases marked ``always`` (the
  sandbox guard, which must judge whatever of the PR's code ran).

Adding a phase (for instance the differential oracle): write its function in
a module of its own, ``def phase(v: State) -> Iterator[Outcome]``, and insert
``Phase("oracle", ("oracle",), phase)`` into the list ``verdict.pr.phases``
builds, at the place its cost gives it (cheap checks first: a verdict stops
at the first BROKEN row, so a cheap phase that can fail should come early).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from niels_gpt_contracts.result import BROKEN, NOT_RUN, STOPPED, Outcome, Result

# Called with each new row and the seconds since the first phase began.
OnRow = Callable[[Outcome, float], None]


@dataclass(frozen=True)
class Phase:
    """One step of the verdict and the checks (row names) it reports."""

    name: str
    checks: tuple[str, ...]
    run: Callable[[Any], Iterable[Outcome] | None]
    always: bool = False  # runs even after the verdict stopped (the sandbox guard)


def run(
    phases: Sequence[Phase],
    state: Any,
    result: Result,
    stage: str,
    on_row: OnRow,
    *,
    full: bool,
) -> None:
    """Run ``phases`` on ``state``, adding their rows and times to ``result``."""
    shown = len(result.outcomes)
    began = time.monotonic()

    def show() -> None:
        nonlocal shown
        for o in result.outcomes[shown:]:
            on_row(o, time.monotonic() - began)
        shown = len(result.outcomes)

    show()  # rows given before the phases (none today)
    stopped: str | None = None
    for phase in phases:
        if stopped is not None and not phase.always:
            why = f"{STOPPED} ({stopped}); --full runs it"
            result.outcomes.extend(Outcome(stage, c, NOT_RUN, why) for c in phase.checks)
            show()
            continue
        start = time.monotonic()
        first = len(result.outcomes)
        for outcome in phase.run(state) or ():
            result.outcomes.append(outcome)
            show()
        result.phases.append((phase.name, time.monotonic() - start))
        show()
        broken = [o for o in result.outcomes[first:] if o.status == BROKEN]
        if broken and stopped is None and not full:
            stopped = broken[0].check
