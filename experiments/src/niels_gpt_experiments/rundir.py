"""The run folder (``--out``): what a run writes there, and who may write over it."""

from __future__ import annotations

import shutil

from niels_gpt_experiments.checkpoint import CheckpointError
from niels_gpt_experiments.config import TrainConfig

__all__ = ["RUN_FILES", "RunExistsError", "claim_out_dir"]

# What a run writes under --out; --overwrite removes exactly these.
RUN_FILES = ("run.json", "metrics.jsonl", "checkpoints")


class RunExistsError(CheckpointError):
    """``--out`` already holds a run, and neither ``--resume`` nor ``--overwrite`` was given."""


def claim_out_dir(cfg: TrainConfig, main: bool) -> None:
    """Refuse an ``out_dir`` that holds a run, unless resuming; with ``overwrite``, empty it.

    Only the run's own files (``RUN_FILES``) count and are removed; anything
    else in the folder is left alone. Rank 0 (``main``) removes them.

    Raises:
        RunExistsError: a run is there and ``cfg`` neither resumes nor overwrites.
    """
    present = [name for name in RUN_FILES if (cfg.out_dir / name).exists()]
    if not present or cfg.resume:
        return
    if not cfg.overwrite:
        raise RunExistsError(
            f"--out {cfg.out_dir} already holds a run ({', '.join(present)}): pass --resume "
            "to continue it, --overwrite to replace it, or another --out"
        )
    if main:
        for name in present:
            path = cfg.out_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
