"""Which run to serve: the one named, the newest under ``runs/``, or a fresh ``--quick`` one.

A run is a ``niels-train --out`` folder: ``run.json`` and
``checkpoints/latest`` naming its newest checkpoint. Models are loaded with
the experiment's ``niels_gpt_experiments.loading.load_run``, never read here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["ServeError", "choose_run", "newest_run", "train_quick"]

QUICK_RUN = "quick"


class ServeError(RuntimeError):
    """No model to serve: a bad ``--checkpoint`` or a ``--quick`` run that failed."""


def _latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest"


def newest_run(runs: Path) -> Path | None:
    """The run under ``runs`` (at any depth) whose newest checkpoint was written last."""
    if not runs.is_dir():
        return None
    found = [p.parent.parent for p in runs.glob("**/checkpoints/latest") if p.is_file()]
    return max(found, key=lambda run: _latest(run).stat().st_mtime_ns, default=None)


def train_quick(runs: Path, say: Callable[[str], None]) -> Path:
    """Train ``niels-train --quick --out runs/quick --resume`` here, with its progress bar.

    Raises:
        ServeError: the run failed (its own message is printed above).
    """
    from niels_gpt_experiments.cli import train_main  # torch and the corpus load only now

    out = runs / QUICK_RUN
    say(
        f"niels-serve: no run under {runs}/ yet, so training the --quick model first "
        f"(niels-train --quick --out {out}); a minute or two the first time"
    )
    code = train_main(["--quick", "--out", str(out), "--resume"])  # an interrupted one goes on
    if code != 0 or not _latest(out).is_file():
        raise ServeError(f"niels-train --quick --out {out} failed (exit status {code})")
    return out


def choose_run(checkpoint: Path | None, runs: Path, say: Callable[[str], None] = print) -> Path:
    """The run folder to serve (see the module docstring).

    Raises:
        ServeError: ``checkpoint`` is not a run folder, or the quick run failed.
    """
    if checkpoint is not None:
        if not (checkpoint / "run.json").is_file():
            raise ServeError(
                f"--checkpoint must be a niels-train run folder (with run.json and "
                f"checkpoints/), got {str(checkpoint)!r}"
            )
        return checkpoint
    found = newest_run(runs)
    if found is not None:
        say(f"niels-serve: serving the newest run under {runs}/: {found}")
        return found
    return train_quick(runs, say)


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
