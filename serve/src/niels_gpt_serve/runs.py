"""Which run to serve: the one named, the demo, or the newest under ``runs/``.

A run is a ``niels-train --out`` folder: ``run.json`` and
``checkpoints/latest`` naming its newest checkpoint. Models are loaded with
the experiment's ``niels_gpt_experiments.loading.load_run``, never read here.
With no run named and none under ``runs/``, the demo model shipped in the
package is served (``shipped.py``), so a first start serves at once;
``--demo`` trains the same preset here instead (``demo.py``), into
``<runs>/demo``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from niels_gpt_serve.demo import DEMO_FLAGS, DEMO_RUN, demo_finished

__all__ = ["NotARunError", "ServeError", "choose_run", "newest_run", "train_demo"]


class ServeError(RuntimeError):
    """No model to serve: a bad ``--checkpoint`` or a demo training that failed."""


class NotARunError(ServeError):
    """``--checkpoint`` names no run folder: an input error (exit 2), not a failure."""


def _latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest"


def newest_run(runs: Path) -> Path | None:
    """The run under ``runs`` (at any depth) whose newest checkpoint was written last."""
    if not runs.is_dir():
        return None
    found = [p.parent.parent for p in runs.glob("**/checkpoints/latest") if p.is_file()]
    return max(found, key=lambda run: _latest(run).stat().st_mtime_ns, default=None)


def train_demo(runs: Path, say: Callable[[str], None]) -> Path:
    """``<runs>/demo``, trained first (``niels-train DEMO_FLAGS --out ... --resume``,
    with its progress bar) unless its run is finished.

    Raises:
        ServeError: the training failed (its own message is printed above), or was
            stopped by Ctrl+C (one line: the checkpoint kept, and how to resume).
    """
    out = runs / DEMO_RUN
    if demo_finished(out):
        return out
    from niels_gpt_experiments.cli import INTERRUPTED, train_main  # torch, the corpus: now

    say(
        f"niels-serve: training the demo model (niels-train {' '.join(DEMO_FLAGS)} "
        f"--out {out} --resume): minutes on one CPU core, by its load; kept in {out}, "
        "a checkpoint every 100 steps, and an interrupted training resumes"
    )
    try:
        code = train_main([*DEMO_FLAGS, "--out", str(out), "--resume"])
    except KeyboardInterrupt:
        code = INTERRUPTED
    if code == INTERRUPTED:  # niels-train saved the step under way and said so
        kept = _latest(out).read_text().strip() if _latest(out).is_file() else None
        where = f"its last checkpoint, {out / 'checkpoints' / kept}, is kept" if kept else (
            "no checkpoint was saved yet"
        )  # fmt: skip
        raise ServeError(
            f"the demo training stopped (Ctrl+C): {where}; niels-serve --demo resumes it"
        ) from None
    if code != 0 or not _latest(out).is_file():
        raise ServeError(f"niels-train --out {out} (the demo model) failed (exit status {code})")
    return out


def choose_run(
    checkpoint: Path | None,
    runs: Path,
    say: Callable[[str], None] = print,
    demo: bool = False,
    shipped: bool = True,
) -> Path | None:
    """The run folder to serve: ``checkpoint``; the demo, trained, when ``demo``; else the
    newest run under ``runs``; with none, None (serve the shipped model) when ``shipped``
    says the package has one, else the demo, trained.

    Raises:
        NotARunError: ``checkpoint`` is not a run folder.
        ServeError: the demo's training failed.
    """
    if checkpoint is not None:
        if not (checkpoint / "run.json").is_file():
            raise NotARunError(
                f"--checkpoint must be a niels-train run folder (with run.json and "
                f"checkpoints/), got {str(checkpoint)!r}"
            )
        return checkpoint
    found = None if demo else newest_run(runs)
    if found is not None:
        say(f"niels-serve: serving the newest run under {runs}/: {found}")
        return found
    if shipped and not demo:
        return None
    return train_demo(runs, say)


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
