"""Name the command-line flag behind a settings error.

``TrainConfig`` and the stage's ``ModelConfig`` check their values and say
which *field* is wrong (``ModelConfig.C must be divisible by H``); a user of
``niels-train`` or ``niels-ablate`` typed flags (``--width``, ``--heads``).
``with_flags`` puts the flags a message is about, with their values, in
front of it, so every input error names what to change on the command line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["TRAIN_FLAGS", "flags_named", "folder_problem", "with_flags"]

# TrainConfig's fields (and ModelConfig's, by the names it uses in messages) -> niels-train's flag.
TRAIN_FLAGS: dict[str, str] = {
    "T": "--context",
    "C": "--width",
    "L": "--layers",
    "H": "--heads",
    "d_ff": "--d-ff",
    "dropout": "--dropout",
    "model": "--model",
    "attention": "--attention",
    "precision": "--precision",
    "include": "--include",
    "corpus": "--corpus",
    "val_permille": "--val-permille",
    "data_dir": "--data-dir",
    "steps": "--steps",
    "batch_size": "--batch-size",
    "grad_accum": "--grad-accum",
    "lr": "--lr",
    "min_lr_ratio": "--min-lr-ratio",
    "warmup": "--warmup",
    "weight_decay": "--weight-decay",
    "betas": "--beta1/--beta2",
    "grad_clip": "--grad-clip",
    "device": "--device",
    "seed": "--seed",
    "eval_every": "--eval-every",
    "eval_batches": "--eval-batches",
    "sample_tokens": "--sample-tokens",
    "prompt": "--prompt",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_minutes": "--checkpoint-minutes",
    "progress_seconds": "--progress-seconds",
    "keep_checkpoints": "--keep-checkpoints",
    "out_dir": "--out",
    "stop_after": "--stop-after",
    "fsdp": "--fsdp",
}

# A field's name as a word of its own: not part of a flag (``--steps``) or a longer name.
_WORD = re.compile(r"(?<![\w-])([A-Za-z_]+)(?![\w-])")


def flags_named(message: str, flags: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(field, flag)`` of every field ``message`` names, first mention first, leaving out
    flags the message already spells."""
    found: dict[str, str] = {}
    for match in _WORD.finditer(message):
        name = match.group(1)
        flag = flags.get(name)
        if flag is not None and flag not in message and name not in found:
            found[name] = flag
    return list(found.items())


def with_flags(
    message: str, flags: Mapping[str, str], value: Callable[[str], object] | None = None
) -> str:
    """``message`` with the flags it is about in front: ``--heads 3, --width 256: ...``.

    ``value(field)`` gives the value shown beside a flag (none when it returns
    ``None`` or a bool); a message that names no known field comes back as it was.
    """
    named = flags_named(message, flags)
    if not named:
        return message
    parts = []
    for field, flag in named:
        shown = value(field) if value is not None else None
        plain = shown is None or isinstance(shown, (bool, tuple, list))
        parts.append(flag if plain else f"{flag} {shown}")
    return f"{', '.join(parts)}: {message}"


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (or become) a folder: it, or the nearest of its parents that
    exists, is not a folder. ``None`` when it can (permissions are left to the run)."""
    path = path.expanduser()
    if path.exists():
        return None if path.is_dir() else f"{path} exists and is not a folder"
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is not a folder"
    return None
