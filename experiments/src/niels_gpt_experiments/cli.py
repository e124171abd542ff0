"""``niels-train``: train a byte-level GPT (v0 or v1) on the standard library's sources.

    niels-train --quick                               # seconds, tiny model
    niels-train --model v0 --steps 2000 --out runs/v0
    niels-train --out runs/v0 --resume                # continue the same curve (or after Ctrl+C)
    torchrun --standalone --nproc_per_node=2 --no-python niels-train --quick
    torchrun --standalone --nproc_per_node=2 --no-python niels-train --quick --fsdp

Every flag defaults to ``TrainConfig``'s value; ``--quick`` swaps in a tiny
model and a 20-step run, and any flag given beside it still wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from niels_gpt_experiments.checkpoint import CheckpointError
from niels_gpt_experiments.checkpoint import latest as latest_checkpoint
from niels_gpt_experiments.config import QUICK, SettingsChangedError, TrainConfig
from niels_gpt_experiments.corpus import CorpusError
from niels_gpt_experiments.flags import TRAIN_FLAGS, folder_problem, with_flags
from niels_gpt_experiments.interrupt import TrainingInterrupted

__all__ = ["INTERRUPTED", "build_parser", "config_from_args", "interrupted_text", "train_main"]

#: niels-train's exit status on Ctrl+C: 128 + SIGINT, as a shell reports a command the
#: signal stopped, so a caller can tell "the user stopped it" (resumable) from a failure (1).
INTERRUPTED = 130

# (flag, TrainConfig field, type, help); every default is TrainConfig's.
_OPTIONS: tuple[tuple[str, str, Any, str], ...] = (
    ("--context", "T", int, "tokens per sequence (the model's T)"),
    ("--width", "C", int, "embedding width C"),
    ("--layers", "L", int, "number of blocks L"),
    ("--heads", "H", int, "attention heads H"),
    ("--kv-heads", "H_kv", int, "key/value heads, dividing H (grouped-query attention)"),
    ("--d-ff", "d_ff", int, "v1 SwiGLU width; v0 matches its parameter count"),
    ("--dropout", "dropout", float, "dropout probability"),
    ("--corpus", "corpus", Path, "a folder or text file instead of the standard library"),
    ("--val-permille", "val_permille", int, "thousandths of the corpus held out for validation"),
    ("--data-dir", "data_dir", Path, "token array cache"),
    ("--steps", "steps", int, "optimizer steps"),
    ("--batch-size", "batch_size", int, "global rows per step, over ranks and accumulation"),
    ("--grad-accum", "grad_accum", int, "micro-batches per step on each rank"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--min-lr-ratio", "min_lr_ratio", float, "final learning rate as a fraction of the peak"),
    ("--warmup", "warmup", int, "linear warm-up steps, at most --steps"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (matrices only)"),
    ("--grad-clip", "grad_clip", float, "clip the global gradient norm to this (0: off)"),
    ("--device", "device", str, "cpu, cuda, mps or auto"),
    ("--seed", "seed", int, "seed of the weights, the batches and the samples"),
    ("--eval-every", "eval_every", int, "steps between validation losses and samples"),
    ("--eval-batches", "eval_batches", int, "validation batches (of --batch-size rows)"),
    ("--sample-tokens", "sample_tokens", int, "bytes generated per sample (0: no samples)"),
    ("--prompt", "prompt", str, "sample prompt"),
    ("--temperature", "temperature", float, "temperature of the sampled continuation"),
    ("--top-k", "top_k", int, "top-k filter of the sampled continuation"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints"),
    (
        "--checkpoint-minutes",
        "checkpoint_minutes",
        float,
        "also checkpoint after a step ending this many minutes after the last checkpoint (0: off)",
    ),
    ("--keep-checkpoints", "keep_checkpoints", int, "how many checkpoints to keep"),
    ("--out", "out_dir", Path, "run directory: checkpoints, metrics.jsonl, run.json"),
    ("--stop-after", "stop_after", int, "stop (with a checkpoint) after this step; resume later"),
)


# Defaults whose value alone would not say what they mean.
_DEFAULT_TEXT = {
    "d_ff": "3*C",
    "H_kv": "H",
    "corpus": "the running Python's standard library",
    "data_dir": "$NIELS_GPT_DATA or ~/.cache/niels-gpt-experiments",
    "warmup": "min(100, steps // 10)",
    "checkpoint_every": "at every evaluation",
    "stop_after": "run to --steps",
    "prompt": "'def '",
}


def _with_default(name: str, text: str) -> str:
    """``text`` and TrainConfig's default of ``name`` (``%`` doubled for argparse)."""
    value = _DEFAULT_TEXT.get(name, getattr(TrainConfig(), name))
    return f"{text} (default: {value})".replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="niels-train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"tiny run: {QUICK}")
    parser.add_argument(
        "--model", choices=("v0", "v1"), help=_with_default("model", "v1 (RMSNorm, SwiGLU) or v0")
    )
    parser.add_argument(
        "--attention",
        choices=("explicit", "fast"),
        help=_with_default("attention", "fast: SDPA fast path"),
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16"),
        help=_with_default("precision", "autocast dtype"),
    )
    parser.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="file pattern in a --corpus folder (repeatable; default: *.py)",
    )
    b1, b2 = TrainConfig().betas
    parser.add_argument("--beta1", type=float, help=f"AdamW beta1 (default: {b1})")
    parser.add_argument("--beta2", type=float, help=f"AdamW beta2 (default: {b2})")
    for flag, name, kind, text in _OPTIONS:
        parser.add_argument(
            flag, dest=name, type=kind, metavar=name.upper(), help=_with_default(name, text)
        )
    parser.add_argument("--compile", action="store_true", default=None, help="torch.compile")
    parser.add_argument(
        "--fsdp",
        action="store_true",
        default=None,
        help="shard with FSDP2 (fully_shard) instead of DDP",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="continue from the newest checkpoint in --out, if any",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace the run already in --out (without this or --resume, it is refused)",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help="no progress bar or lines (evaluations are still printed)",
    )
    parser.add_argument(
        "--progress-seconds",
        dest="progress_seconds",
        type=float,
        metavar="SECONDS",
        help=_with_default(
            "progress_seconds",
            "where the output is not a terminal (a log, a pipe), a progress line this often "
            "instead of the bar",
        ),
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """``TrainConfig`` defaults, then ``--quick``'s, then every flag given.

    Raises:
        ValueError: a setting out of range; the message starts with the flags at
            fault and their values (``--width 256, --heads 3: ModelConfig.C ...``).
    """
    base = TrainConfig()
    given: dict[str, Any] = dict(QUICK) if args.quick else {}
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    given.update({k: v for k, v in vars(args).items() if k in names and v is not None})
    if args.include:
        given["include"] = tuple(args.include)
    if args.beta1 is not None or args.beta2 is not None:
        b1, b2 = base.betas
        given["betas"] = (
            args.beta1 if args.beta1 is not None else b1,
            args.beta2 if args.beta2 is not None else b2,
        )
    try:
        return dataclasses.replace(base, **given)
    except ValueError as err:
        text = _one_line(err)
        raise ValueError(
            with_flags(text, TRAIN_FLAGS, lambda f: given.get(f, getattr(base, f, None)))
        ) from err


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def train_main(argv: Sequence[str] | None = None) -> int:
    """Console script ``niels-train``.

    Exit 0 done; 130 (128 + SIGINT, the status a shell gives a command that
    Ctrl+C stopped) on Ctrl+C, after one line naming the checkpoint saved at
    the interrupt (the step under way finishes first; a second Ctrl+C stops at
    once and names the one before); 1 the run failed (a damaged checkpoint, the
    standard library's sources unreadable); 2 an input error, which names its flag: a bad value, a
    device this machine lacks, a ``--corpus`` that is missing or has nothing to
    train on, an ``--out`` that holds a run (``--resume``, ``--overwrite``), or a
    ``--resume`` whose flags differ from the checkpoint's. Errors are one line on
    stderr, never a traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    try:
        return _train_main(cfg)
    except TrainingInterrupted as stopped:
        if stopped.rank == 0:  # under torchrun, one line for the run, not one per rank
            print(f"niels-train: {interrupted_text(stopped, cfg.out_dir)}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:  # before the steps began (torch, the corpus, the model)
        if os.environ.get("RANK", "0") == "0":  # torchrun's rank, before any process group
            print(f"niels-train: {interrupted_text(None, cfg.out_dir)}", file=sys.stderr)
        return INTERRUPTED


def interrupted_text(stopped: TrainingInterrupted | None, out_dir: Path) -> str:
    """The one line of a run stopped by Ctrl+C: where it stopped, which checkpoint holds it.

    ``stopped`` is ``None`` for a Ctrl+C before the first step; the line then
    names the checkpoint already in ``out_dir``, if any.
    """
    resume = "continue with the same flags and --resume"
    if stopped is None:
        try:
            found = latest_checkpoint(out_dir)
        except CheckpointError:
            found = None
        if found is None:
            return "interrupted before the first step; no checkpoint written"
        return f"interrupted before the first step; the last checkpoint is {found}; {resume}"
    if stopped.checkpoint is None:
        return f"interrupted during step {stopped.step + 1}; no checkpoint written yet"
    if stopped.saved_now:
        return (
            f"interrupted: stopped after step {stopped.step}, saved {stopped.checkpoint}; {resume}"
        )
    return (
        f"interrupted during step {stopped.step + 1}; the last checkpoint is "
        f"{stopped.checkpoint}; {resume}"
    )


def _train_main(cfg: TrainConfig) -> int:
    from niels_gpt.device import DeviceUnavailableError, resolve_device  # torch loads here
    from niels_gpt_experiments.progress import rate_text
    from niels_gpt_experiments.trainer import RunExistsError, train

    try:
        resolve_device(cfg.device)
    except (ValueError, DeviceUnavailableError) as err:
        print(f"niels-train: --device {cfg.device}: {_one_line(err)}", file=sys.stderr)
        return 2
    for flag, folder in (("--out", cfg.out_dir), ("--data-dir", cfg.data_dir)):
        problem = None if folder is None else folder_problem(folder)
        if problem is not None:
            print(f"niels-train: {flag} {folder}: {problem}", file=sys.stderr)
            return 2
    try:
        result = train(cfg)
    except RunExistsError as err:
        print(f"niels-train: {_one_line(err)}", file=sys.stderr)
        return 2
    except SettingsChangedError as err:
        print(f"niels-train: {with_flags(_one_line(err), TRAIN_FLAGS)}", file=sys.stderr)
        return 2
    except CorpusError as err:
        if cfg.corpus is None:  # the standard library: nothing the user typed
            print(f"niels-train: {_one_line(err)}", file=sys.stderr)
            return 1
        print(f"niels-train: --corpus {cfg.corpus}: {_one_line(err)}", file=sys.stderr)
        return 2
    except CheckpointError as err:
        print(f"niels-train: {_one_line(err)}", file=sys.stderr)
        return 1
    if result.val_losses and result.rank == 0:
        step, val = max(result.val_losses.items())
        rate = rate_text(result.tokens_per_s)  # the bar's last figure: one definition
        print(f"done: step {step}, val loss {val:.4f}, {rate} (the run's average)")
    return 0


if __name__ == "__main__":
    raise SystemExit(train_main())
