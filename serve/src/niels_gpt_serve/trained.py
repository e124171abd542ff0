"""How trained the served model is, read from its run folder (never assumed).

``niels-train --out RUN`` writes ``RUN/run.json`` (its settings: ``config.steps``
is the length of the run it planned) and ``RUN/metrics.jsonl`` (one line a step,
and ``{"step", "val_loss", "tokens"}`` at every evaluation). The served
checkpoint is at some step; its validation loss is the evaluation at that step,
or, when the run evaluated elsewhere, the last one before it (``val_step`` says
which). Nothing here is hard-coded about a preset: a run that lacks a figure
shows it as unknown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BARELY_TRAINED_LOSS", "UNIFORM_LOSS", "Training", "read_training"]

#: The loss of a model that gives every one of the 256 bytes the same probability (nats).
UNIFORM_LOSS = math.log(256)
#: Above this validation loss (nats a byte) the page calls the model barely trained:
#: it has learnt little beyond how often each byte occurs, so greedy text is mostly
#: spaces and letters, and its attention rows are about uniform.
BARELY_TRAINED_LOSS = 2.5


@dataclass(frozen=True)
class Training:
    """What the run folder says about the served checkpoint.

    Attributes:
        step: the optimizer step of the served checkpoint.
        steps: the steps the run planned (``run.json`` ``config.steps``), or None.
        val_loss: mean validation cross-entropy in nats a byte, or None if never measured.
        val_step: the step ``val_loss`` was measured at (<= ``step``), or None.
        tokens: training tokens seen by ``step`` (from the metrics), or None.
    """

    step: int
    steps: int | None = None
    val_loss: float | None = None
    val_step: int | None = None
    tokens: int | None = None

    @property
    def barely_trained(self) -> bool:
        """No validation loss, or one above ``BARELY_TRAINED_LOSS``."""
        return self.val_loss is None or self.val_loss > BARELY_TRAINED_LOSS

    def summary(self) -> str:
        """One plain sentence for the page: steps, tokens, validation loss, and a verdict."""
        of = f" of {self.steps}" if self.steps is not None and self.steps != self.step else ""
        seen = f" ({self.tokens:,} tokens)" if self.tokens is not None else ""
        text = f"Trained for {self.step}{of} steps{seen}; "
        if self.val_loss is None or self.val_step is None:
            text += "no validation loss recorded."
        else:
            at = "" if self.val_step == self.step else f" at step {self.val_step}"
            text += (
                f"validation loss {self.val_loss:.3f} nats a byte{at} "
                f"(uniform guessing: {UNIFORM_LOSS:.3f})."
            )
        if self.barely_trained:
            text += (
                " This model is barely trained: its text is mostly noise and its "
                "attention close to uniform."
            )
        return text


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _records(path: Path) -> list[Mapping[str, object]]:
    """The lines of ``metrics.jsonl`` that are JSON objects with an int ``step``."""
    if not path.is_file():
        return []
    found: list[Mapping[str, object]] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed run
        if isinstance(record, dict) and _int(record.get("step")) is not None:
            found.append(record)
    return found


def _loss(record: Mapping[str, object]) -> float | None:
    value = record.get("val_loss")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def read_training(run_dir: Path, step: int, meta: Mapping[str, object]) -> Training:
    """How trained checkpoint ``step`` of ``run_dir`` is (``meta``: its ``run.json``).

    Never raises on a missing or damaged ``metrics.jsonl``: the figures it
    would give are None.
    """
    config = meta.get("config")
    steps = _int(config.get("steps")) if isinstance(config, dict) else None
    records = _records(run_dir / "metrics.jsonl")
    tokens = next((_int(r.get("tokens")) for r in records if r["step"] == step), None)
    measured = [(r["step"], loss) for r in records if (loss := _loss(r)) is not None]
    before = [(at, loss) for at, loss in measured if isinstance(at, int) and at <= step]
    if not before:
        return Training(step=step, steps=steps, tokens=tokens)
    val_step, val_loss = max(before, key=lambda pair: pair[0])
    return Training(step, steps, val_loss, val_step, tokens)
