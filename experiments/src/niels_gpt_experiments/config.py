"""Everything a training run is made of, as one frozen dataclass."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from niels_gpt.config import ModelConfig
from niels_gpt_experiments.checkpoint import CheckpointError
from niels_gpt_experiments.corpus import CorpusSpec
from niels_gpt_experiments.models import ModelKind, matched_v0_d_ff

__all__ = [
    "AUTOCAST_DTYPES",
    "QUICK",
    "Precision",
    "SettingsChangedError",
    "TrainConfig",
    "check_same_run",
    "default_warmup",
    "quick",
]

V = 256  # byte-level: one token per byte

Precision = Literal["fp32", "bf16", "fp16"]

# The warm-up when --warmup is not given: a tenth of the run, at most 100 steps,
# so a short run (--steps 100, 50, 5) spends most of its steps past the warm-up.
MAX_DEFAULT_WARMUP = 100
WARMUP_FRACTION = 10


def default_warmup(steps: int) -> int:
    """``min(100, steps // 10)``: the warm-up of a run that does not set one."""
    return min(MAX_DEFAULT_WARMUP, steps // WARMUP_FRACTION)


AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Fields that decide the loss curve itself. A resumed run must agree with its
# checkpoint on every one of them; the rest (cadence, device, world size,
# accumulation, compile, precision, where to stop) may change between runs.
RUN_DEFINING = (
    "model",
    "T",
    "C",
    "L",
    "H",
    "H_kv",
    "d_ff",
    "dropout",
    "corpus",
    "include",
    "val_permille",
    "steps",
    "batch_size",
    "lr",
    "min_lr_ratio",
    "warmup",
    "weight_decay",
    "betas",
    "grad_clip",
    "seed",
)


@dataclass(frozen=True)
class TrainConfig:
    """One ``niels-train`` run. ``batch_size`` is the global batch in rows of
    ``T`` tokens per optimizer step, across all ranks and accumulation steps.

    ``d_ff`` is v1's SwiGLU width (default ``3 * C``); a v0 model takes the GELU
    width that matches v1's parameter count at that ``d_ff``.
    ``checkpoint_every=None`` checkpoints at every evaluation and at the end.
    ``checkpoint_minutes`` also checkpoints after any step that ends that many
    minutes after the last checkpoint (or the start), so a slow machine loses
    at most that much of a run (0: off). ``progress_seconds`` is the interval
    of the progress lines printed where the output is not a terminal.
    ``warmup=None`` warms up for ``default_warmup(steps)`` = ``min(100, steps // 10)``
    steps. ``overwrite`` lets a fresh run replace the run already in ``out_dir``
    (without it, and without ``resume``, such a run is refused).

    Raises:
        ValueError: a value out of range (checked on construction).
    """

    model: ModelKind = "v1"
    T: int = 256
    C: int = 256
    L: int = 4
    H: int = 4
    H_kv: int | None = None  # key/value heads (grouped-query attention); None: H
    d_ff: int | None = None
    dropout: float = 0.0
    attention: Literal["explicit", "fast"] = "explicit"
    corpus: Path | None = None
    include: tuple[str, ...] = ("*.py",)
    val_permille: int = 50
    data_dir: Path | None = None
    steps: int = 2000
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int | None = None  # None: default_warmup(steps)
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    precision: Precision = "fp32"
    compile: bool = False
    fsdp: bool = False
    device: str = "auto"
    seed: int = 0
    eval_every: int = 200
    eval_batches: int = 8
    sample_tokens: int = 128
    prompt: str = "def "
    temperature: float = 0.8
    top_k: int | None = 40
    checkpoint_every: int | None = None
    checkpoint_minutes: float = 5.0
    keep_checkpoints: int = 2
    out_dir: Path = field(default=Path("runs/niels-train"))
    resume: bool = False
    stop_after: int | None = None
    progress: bool = True
    progress_seconds: float = 15.0
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.model not in ("v0", "v1"):
            raise ValueError(f"model must be 'v0' or 'v1', got {self.model!r}")
        if self.attention not in ("explicit", "fast"):
            raise ValueError(f"attention must be 'explicit' or 'fast', got {self.attention!r}")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {self.precision!r}")
        positive = (
            "steps",
            "batch_size",
            "grad_accum",
            "eval_every",
            "eval_batches",
            "keep_checkpoints",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.warmup is not None and not 0 <= self.warmup <= self.steps:
            raise ValueError(
                f"--warmup must be in [0, --steps] = [0, {self.steps}], got {self.warmup}; "
                f"leave it out for min({MAX_DEFAULT_WARMUP}, steps // {WARMUP_FRACTION}) = "
                f"{default_warmup(self.steps)}"
            )
        if not (self.lr > 0 and 0 <= self.min_lr_ratio <= 1 and self.weight_decay >= 0):
            raise ValueError(
                f"need lr > 0, 0 <= min_lr_ratio <= 1, weight_decay >= 0; got lr={self.lr}, "
                f"min_lr_ratio={self.min_lr_ratio}, weight_decay={self.weight_decay}"
            )
        if self.grad_clip < 0 or self.temperature < 0 or self.sample_tokens < 0:
            raise ValueError(
                f"grad_clip, temperature and sample_tokens must be >= 0, got {self.grad_clip}, "
                f"{self.temperature}, {self.sample_tokens}"
            )
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ValueError(
                f"--stop-after must be in [1, --steps] = [1, {self.steps}], got {self.stop_after}"
            )
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if not self.checkpoint_minutes >= 0:  # NaN is refused too
            raise ValueError(
                f"checkpoint_minutes must be >= 0 (0: off), got {self.checkpoint_minutes}"
            )
        if not self.progress_seconds >= 0:
            raise ValueError(f"progress_seconds must be >= 0, got {self.progress_seconds}")
        if self.fsdp and self.precision == "fp16":
            raise ValueError(
                "--fsdp with fp16 is not supported: a gradient scaler would have to agree on "
                "overflow across shards; use --precision bf16"
            )
        if not self.prompt.encode():
            raise ValueError("prompt must not be empty")
        self.model_config()  # the model sizes must make a valid ModelConfig

    def model_config(self) -> ModelConfig:
        """The stage ``ModelConfig`` of this run's model (``V=256``)."""
        v1 = ModelConfig(
            V=V,
            T=self.T,
            C=self.C,
            L=self.L,
            H=self.H,
            d_ff=self.d_ff or 3 * self.C,
            dropout=self.dropout,
            H_kv=self.H_kv,
        )
        if self.model == "v1":
            return v1
        return dataclasses.replace(v1, d_ff=matched_v0_d_ff(v1))

    @property
    def warmup_steps(self) -> int:
        """The warm-up this run uses: ``warmup``, or ``default_warmup(steps)`` when unset."""
        return default_warmup(self.steps) if self.warmup is None else self.warmup

    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(path=self.corpus, include=self.include, val_permille=self.val_permille)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.T

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values (paths as strings, tuples as lists)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                str(value)
                if isinstance(value, Path)
                else (list(value) if isinstance(value, tuple) else value)
            )
        return out


QUICK: dict[str, Any] = {
    "T": 64,
    "C": 64,
    "L": 2,
    "H": 2,
    "steps": 20,
    "batch_size": 8,
    "eval_every": 10,
    "eval_batches": 2,
    "sample_tokens": 24,
}


def quick(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` shrunk to a run of seconds (what ``--quick`` does)."""
    return dataclasses.replace(cfg, **QUICK)


def _effective(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as the run used them: an unset warm-up is the default it got."""
    warmup = settings.get("warmup")
    steps = settings.get("steps")
    if warmup is None and isinstance(steps, int):
        return {**settings, "warmup": default_warmup(steps)}
    return settings


class SettingsChangedError(CheckpointError):
    """``--resume`` with run-defining settings other than the checkpoint's (an input error)."""


def check_same_run(saved_json: str, cfg: TrainConfig) -> None:
    """Refuse to resume a checkpoint whose run-defining settings differ from ``cfg``'s.

    Raises:
        SettingsChangedError: the settings that changed, each ``name old -> new``.
    """
    saved, now = _effective(json.loads(saved_json)), _effective(cfg.as_json())
    changed = [
        f"{k} {saved.get(k)!r} -> {now[k]!r}" for k in RUN_DEFINING if saved.get(k) != now[k]
    ]
    if changed:
        raise SettingsChangedError(
            "--resume needs the checkpoint's own settings; changed: " + "; ".join(changed)
        )
