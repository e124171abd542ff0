"""Checkpoints through ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a DCP directory ``<out>/checkpoints/step-NNNNNNN`` holding:

- ``model``, ``optimizer``: from ``get_state_dict``, keyed by parameter name
  with no wrapper prefix (DDP's ``module.``, ``torch.compile``'s
  ``_orig_mod.``), each tensor saved once in shards. DCP reshards on load, so
  a checkpoint written by N ranks (DDP or FSDP2) loads on M ranks in any mode.
- ``trainer``: one opaque blob (``torch.save`` bytes) with the step, the
  scheduler and gradient scaler states, every rank's RNG states and the run's
  configuration. It is gathered first, so every rank saves the same bytes.

``<out>/checkpoints/latest`` names the newest complete checkpoint; it is
written by rank 0 after DCP has finished, so a run killed mid-save resumes
from the one before.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.parallel import check_tied
from niels_gpt_experiments.runtime import Runtime, barrier

__all__ = ["CheckpointError", "latest", "load", "load_weights", "save"]

_LATEST = "latest"


class CheckpointError(RuntimeError):
    """No checkpoint where one was expected, or one from a different run."""


def checkpoints_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def latest(out_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir``, or ``None``."""
    pointer = checkpoints_dir(out_dir) / _LATEST
    if not pointer.is_file():
        return None
    path = checkpoints_dir(out_dir) / pointer.read_text().strip()
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"{str(pointer)!r} names {str(path)!r}, which is not a checkpoint")
    return path


@contextlib.contextmanager
def _single_process_ok(runtime: Runtime) -> Iterator[None]:
    """DCP warns on every single-process save and load that it assumes one
    process; that is exactly the intent here, so that one warning is muted."""
    with warnings.catch_warnings():
        if not runtime.distributed:
            warnings.filterwarnings(
                "ignore", message="torch.distributed is disabled", category=UserWarning
            )
        yield


def _pack(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _unpack(blob: bytes) -> dict[str, Any]:
    state = torch.load(io.BytesIO(blob), weights_only=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"trainer state must be a dict, got {type(state).__name__}")
    return state


def save(
    out_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    runtime: Runtime,
    keep: int,
) -> Path:
    """Write the checkpoint of ``step`` (a collective: every rank calls it).

    ``trainer_state`` must be identical on every rank. Older checkpoints beyond
    the newest ``keep`` are deleted.
    """
    name = f"step-{step:07d}"
    path = checkpoints_dir(out_dir) / name
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd, "trainer": _pack(trainer_state)}
    with _single_process_ok(runtime):
        dcp_save(state, checkpoint_id=path, no_dist=not runtime.distributed)
    barrier(runtime)
    if runtime.is_main:
        pointer = checkpoints_dir(out_dir) / _LATEST
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(name + "\n")
        tmp.replace(pointer)
        old = sorted(p for p in checkpoints_dir(out_dir).glob("step-*") if p.is_dir())
        for stale in old[:-keep]:
            shutil.rmtree(stale, ignore_errors=True)
    barrier(runtime)
    return path


def load(
    path: Path, model: GPT, optimizer: torch.optim.Optimizer, runtime: Runtime
) -> dict[str, Any]:
    """Load model and optimizer in place from ``path``; return the trainer state.

    The optimizer's state is created first (``get_state_dict`` does that with a
    zero-learning-rate step), so DCP has tensors to load into.

    Raises:
        CheckpointError: ``path`` holds no checkpoint.
        TiedWeightError: loading broke the embedding/head tie.
    """
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "trainer": b""}
    with _single_process_ok(runtime):
        dcp_load(state, checkpoint_id=path, no_dist=not runtime.distributed)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    check_tied(model)
    return _unpack(state["trainer"])


def load_weights(path: Path, model: nn.Module) -> dict[str, Any]:
    """Load only the model's weights from ``path`` in place; return the trainer state.

    No optimizer, no process group and no runtime: what a user who only wants
    the trained model needs. The optimizer's tensors in the checkpoint are
    left unread.

    Raises:
        CheckpointError: ``path`` holds no checkpoint.
        Whatever DCP raises on a damaged checkpoint (the caller words it).
    """
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}")
    state: dict[str, Any] = {"model": get_model_state_dict(model), "trainer": b""}
    with warnings.catch_warnings():  # one process on purpose, as in _single_process_ok
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled", category=UserWarning
        )
        dcp_load(state, checkpoint_id=path, no_dist=True)
    set_model_state_dict(model, state["model"])
    return _unpack(state["trainer"])
