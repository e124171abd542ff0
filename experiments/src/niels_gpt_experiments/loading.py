"""A trained run, ready for inference, in one call: ``load_run(run_dir)``.

    from niels_gpt_experiments.loading import load_run

    run = load_run("runs/v1")             # the newest checkpoint, eval mode, on the CPU
    logits = run.model(ids)               # ids: (B, t) int64 in [0, run.config.V)

No optimizer, no runtime and no process group are needed: only the model's
weights are read from the ``torch.distributed.checkpoint`` folder that
``checkpoints/latest`` names; the optimizer's state in it is left unread.

``run.json`` records the model (written by ``niels-train`` since format 2)::

    {"format": 2, "arch": "v1",
     "model_config": {"V": 256, "T": 256, "C": 256, "L": 4, "H": 4, "d_ff": 768,
                      "dropout": 0.0, "rope_theta": 10000.0},
     "config": {...every niels-train setting...}, "corpus": {...}, "params": 3279104}

``model_config`` is exactly the ``ModelConfig`` the run built (for v0 the
matched GELU width, not v1's). A run.json from before format 2 has no
``format``, ``arch`` or ``model_config``; it is read with the rule niels-train
used when it wrote it: ``V = 256`` (niels-train is byte-level and never had
another vocabulary), ``arch = config["model"]``, ``d_ff = config["d_ff"]`` or
``3 * C`` when null, and for v0 the GELU width ``matched_v0_d_ff`` gives. The
checkpoint's tensor shapes are compared with the model that config builds
before anything is loaded, so a rule that ever stopped matching fails by name
instead of loading into the wrong shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader

from niels_gpt.config import ModelConfig
from niels_gpt.device import resolve_device
from niels_gpt_experiments import checkpoint
from niels_gpt_experiments.models import MODEL_KINDS, ModelKind, build_model, matched_v0_d_ff
from niels_gpt_experiments.parallel import check_tied

__all__ = ["RUN_FORMAT", "LoadedRun", "RunLoadError", "load_run", "model_record", "read_model"]

RUN_FORMAT = 2  # run.json with "arch" and "model_config"; absent "format" means 1 (legacy)
LEGACY_V = 256  # the only vocabulary niels-train ever trained (bytes)
_SIZES = ("V", "T", "C", "L", "H", "d_ff")


class RunLoadError(checkpoint.CheckpointError, ValueError):
    """A run folder that cannot give a model: the message names what was expected and found."""


@dataclass(frozen=True)
class LoadedRun:
    """A trained model and what it was trained as.

    Attributes:
        model: ``GPT`` (v1) or ``GPTv0``, in eval mode, on the requested device,
            float32; maps ``(B, t)`` int64 ids to ``(B, t, V)`` logits.
        config: exactly the ``ModelConfig`` the run trained with.
        arch: ``"v0"`` or ``"v1"``.
        run_dir: the run folder.
        step: the optimizer step of the loaded checkpoint.
        meta: ``run.json`` as read.
        checkpoint: the checkpoint folder that was loaded.
    """

    model: torch.nn.Module
    config: ModelConfig
    arch: str
    run_dir: Path
    step: int
    meta: dict[str, object]
    checkpoint: Path


def model_record(arch: ModelKind, cfg: ModelConfig) -> dict[str, Any]:
    """The part of ``run.json`` that rebuilds the model: format, arch and every config field."""
    return {"format": RUN_FORMAT, "arch": arch, "model_config": dataclasses.asdict(cfg)}


def _read_meta(run_dir: Path) -> dict[str, object]:
    if not run_dir.exists():
        raise RunLoadError(f"run folder {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise RunLoadError(f"expected a run folder, got {str(run_dir)!r}, which is not a folder")
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunLoadError(
            f"expected {str(path)!r} (what niels-train --out writes): {str(run_dir)!r} is "
            "not a run folder"
        )
    try:
        meta = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunLoadError(f"{str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(meta, dict):
        raise RunLoadError(f"{str(path)!r} must hold a JSON object, got {type(meta).__name__}")
    return meta


def _arch(value: object, where: str) -> ModelKind:
    for kind in MODEL_KINDS:
        if value == kind:
            return kind
    raise RunLoadError(f"{where} must be one of {', '.join(MODEL_KINDS)}, got {value!r}")


def _fields(record: object, names: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise RunLoadError(f"{where} must be a JSON object, got {type(record).__name__}")
    missing = [n for n in names if n not in record]
    if missing:
        raise RunLoadError(f"{where} lacks {', '.join(missing)} (has: {', '.join(record)})")
    return record


def _model_config(fields: dict[str, Any], where: str) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise RunLoadError(f"{where} has fields ModelConfig does not know: {', '.join(unknown)}")
    try:
        return ModelConfig(**fields)
    except (TypeError, ValueError) as err:
        raise RunLoadError(f"{where} is not a valid ModelConfig: {err}") from None


def read_model(meta: Mapping[str, object]) -> tuple[ModelKind, ModelConfig]:
    """The arch and exact ``ModelConfig`` a ``run.json`` records (legacy rule in the module doc).

    Raises:
        RunLoadError: a field missing or invalid, an unknown arch or format.
    """
    version = meta.get("format", 1)
    if version == RUN_FORMAT:
        _fields(meta, ("arch", "model_config"), "run.json")
        arch = _arch(meta["arch"], "run.json 'arch'")
        fields = _fields(meta["model_config"], _SIZES, "run.json 'model_config'")
        return arch, _model_config(fields, "run.json 'model_config'")
    if version != 1:
        raise RunLoadError(
            f"run.json format must be 1 (legacy) or {RUN_FORMAT}, got {version!r}: "
            "written by a newer niels-train than this loader"
        )
    legacy = _fields(meta, ("config",), "run.json")
    config = _fields(legacy["config"], ("model", "T", "C", "L", "H"), "run.json 'config'")
    arch = _arch(config["model"], "run.json 'config.model'")
    sizes = {k: config[k] for k in ("T", "C", "L", "H")}
    d_ff = config.get("d_ff")
    if d_ff is None and isinstance(config["C"], int):
        d_ff = 3 * config["C"]
    v1 = _model_config(
        {"V": LEGACY_V, **sizes, "d_ff": d_ff, "dropout": config.get("dropout", 0.0)},
        "run.json 'config' (legacy format)",
    )
    return arch, (v1 if arch == "v1" else dataclasses.replace(v1, d_ff=matched_v0_d_ff(v1)))


def _check_shapes(path: Path, model: torch.nn.Module) -> None:
    """The checkpoint's model tensors against the built model's, by name and shape."""
    stored = {
        key.removeprefix("model."): tuple(getattr(entry, "size", ()))
        for key, entry in FileSystemReader(str(path)).read_metadata().state_dict_metadata.items()
        if key.startswith("model.")
    }
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    absent = sorted(set(built) - set(stored))
    extra = sorted(set(stored) - set(built))
    wrong = [
        f"{k}: checkpoint {stored[k]}, run.json's config {built[k]}"
        for k in built
        if k in stored and stored[k] != built[k]
    ]
    if absent or extra or wrong:
        found = "; ".join(
            [*wrong[:3], *(f"missing {k}" for k in absent[:3])]
            + [f"unexpected {k}" for k in extra[:3]]
        )
        raise RunLoadError(
            f"checkpoint {str(path)!r} does not match the model run.json describes: {found}"
        )


def _cause(err: BaseException) -> str:
    """One line for what went wrong; DCP wraps each rank's exception in a traceback text."""
    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def load_run(run_dir: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> LoadedRun:
    """Load the newest checkpoint of a ``niels-train`` run folder as a ready model.

    Args:
        run_dir: the folder ``niels-train --out`` wrote (``run.json``, ``checkpoints/``).
        device: ``cpu``, ``cuda``, ``mps``, ``auto`` or a ``torch.device``.

    Returns:
        A ``LoadedRun``: the model in eval mode on ``device`` and its exact config.

    Raises:
        RunLoadError (a ``CheckpointError`` and a ``ValueError``): not a run
            folder, a run.json without what the model needs, an unknown arch,
            no checkpoint, a damaged one, or one whose shapes differ.
        DeviceUnavailableError: ``device`` is not on this machine.
    """
    root = Path(run_dir)
    meta = _read_meta(root)
    arch, cfg = read_model(meta)
    target = resolve_device(device)
    try:
        found = checkpoint.latest(root)
    except checkpoint.CheckpointError as err:
        raise RunLoadError(str(err)) from None
    if found is None:
        raise RunLoadError(
            f"expected a checkpoint named by {str(root / 'checkpoints' / 'latest')!r}, found "
            "none: the run has not saved one yet"
        )
    model = build_model(arch, cfg)
    try:
        _check_shapes(found, model)
        state = checkpoint.load_weights(found, model)
    except RunLoadError:
        raise
    except (Exception, CheckpointException) as err:  # damaged: DCP and pickle raise many types
        raise RunLoadError(f"checkpoint {str(found)!r} could not be read ({_cause(err)})") from err
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise RunLoadError(f"checkpoint {str(found)!r} records step {step!r}, expected an int")
    check_tied(model)
    model.to(target).eval()
    return LoadedRun(model, cfg, arch, root, step, meta, found)
