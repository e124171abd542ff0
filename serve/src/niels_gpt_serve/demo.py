"""The demo model: a run ``niels-serve`` trains once so the page has something to show.

``niels-serve --demo`` (and ``niels-serve`` with no run under ``--runs``) serves
``<runs>/demo``, training it first with ``niels-train`` on the running
Python's standard library (its default corpus) when it has no finished
checkpoint; an interrupted training resumes where it stopped, and a finished
one is kept for the next start. The preset was picked by measurement on a
shared 2-core CPU (serve/README.md, "The demo model"): long enough for
recognisable Python and heads that differ, short enough to wait for once.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEMO_FLAGS", "DEMO_RUN", "demo_finished"]

DEMO_RUN = "demo"

#: niels-train's flags for the demo (the corpus is niels-train's default, the stdlib).
DEMO_FLAGS: tuple[str, ...] = (
    *("--context", "128", "--width", "128", "--layers", "4", "--heads", "4"),
    *("--steps", "1000", "--batch-size", "16", "--lr", "3e-3", "--warmup", "100"),
    *("--eval-every", "250", "--eval-batches", "8", "--sample-tokens", "80"),
    *("--device", "cpu"),
)


def _latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest"


def demo_finished(run_dir: Path) -> bool:
    """Whether ``run_dir``'s newest checkpoint (``checkpoints/latest``, naming
    ``step-NNNNNNN``) is at the last step its ``run.json`` planned."""
    if not _latest(run_dir).is_file() or not (run_dir / "run.json").is_file():
        return False
    try:
        planned = json.loads((run_dir / "run.json").read_text())["config"]["steps"]
        newest = _latest(run_dir).read_text().strip()
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(planned, int) and newest == f"step-{planned:07d}"
