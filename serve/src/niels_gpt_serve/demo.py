"""The demo model: the preset that trained the model shipped in the package.

``niels-serve`` with no run serves the demo model shipped in the package
(``shipped.py``: ``model/demo.safetensors``, trained with these flags;
``model/demo.json`` records the exact command, its validation loss and the
machine). ``niels-serve --demo`` trains the same preset into ``<runs>/demo``
with ``niels-train`` on the running Python's standard library (its default
corpus) when that run has no finished checkpoint, checkpointing every 100
steps; an interrupted training resumes where it stopped, and a finished one
is kept for the next start. The preset was picked to train in minutes on one
busy CPU core (serve/README.md, "The demo model").
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEMO_FLAGS", "DEMO_RUN", "demo_finished"]

DEMO_RUN = "demo"

#: niels-train's flags for the demo (the corpus is niels-train's default, the stdlib).
DEMO_FLAGS: tuple[str, ...] = (
    *("--context", "128", "--width", "96", "--layers", "4", "--heads", "4"),
    *("--steps", "600", "--batch-size", "16", "--lr", "3e-3", "--warmup", "60"),
    *("--eval-every", "150", "--eval-batches", "8", "--sample-tokens", "80"),
    *("--checkpoint-every", "100", "--device", "cpu", "--seed", "0"),
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
