"""``niels-ablate``: v0 against v1 at equal parameter count and equal tokens.

    niels-ablate                      # the default study (about 10 minutes on 2 CPU cores)
    niels-ablate --quick              # seconds: the pipeline, not a result
    niels-ablate --seeds 5 --out runs/ablate

For every seed, v0 and v1 train on the same batches (the batch of a step
depends on the seed and the step only) for the same number of tokens, each in
a fresh process so that its peak memory is its own. Written to ``--out``:
``ablation.json`` (every run), ``ablation.txt`` and ``ablation.md`` (the
table) and ``ablation.png`` (validation loss curves, with the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.launch import process_context
from niels_gpt_experiments.models import MODEL_KINDS
from niels_gpt_experiments.report import markdown_table, plot_curves, text_table

__all__ = ["STUDY", "main", "study_config"]

# The default study: a 0.8M-parameter model, 300 steps of 16 x 128 tokens.
STUDY: dict[str, Any] = {
    "T": 128,
    "C": 128,
    "L": 4,
    "H": 4,
    "steps": 300,
    "batch_size": 16,
    "lr": 2e-3,
    "warmup": 30,
    "eval_every": 50,
    "eval_batches": 4,
    "sample_tokens": 0,
    "progress": False,
    "device": "cpu",
}
QUICK_STUDY: dict[str, Any] = {
    **STUDY,
    "T": 32,
    "C": 32,
    "L": 2,
    "H": 2,
    "steps": 6,
    "batch_size": 4,
    "warmup": 1,
    "eval_every": 3,
    "eval_batches": 1,
}


def study_config(kind: str, seed: int, out: Path, quick: bool, **extra: Any) -> TrainConfig:
    settings = {**(QUICK_STUDY if quick else STUDY), **extra}
    return TrainConfig(model=kind, seed=seed, out_dir=out / f"{kind}-seed{seed}", **settings)  # type: ignore[arg-type]


def _rss_now() -> int:
    """Resident set size of this process in bytes (Linux ``/proc``; else the peak)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _rss_peak()


def _rss_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux


def _worker(cfg: TrainConfig, result_path: Path) -> None:
    """Train one (model, seed) in this fresh process and write what it measured."""
    import torch

    from niels_gpt.device import resolve_device
    from niels_gpt_experiments.trainer import train

    cuda = resolve_device(cfg.device).type == "cuda"
    before = _rss_now()
    result = train(cfg)
    if cuda:
        peak, method = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        peak, method = _rss_peak() - before, "peak RSS of the run's process above its RSS at start"
    record = {
        "model": cfg.model,
        "seed": cfg.seed,
        "params": result.n_params,
        "tokens_per_step": cfg.tokens_per_step,
        "tokens": cfg.steps * cfg.tokens_per_step,
        "final_val_loss": result.val_losses[cfg.steps],
        "val_curve": {str(k): v for k, v in result.val_losses.items()},
        "train_curve": {str(k): v for k, v in result.losses.items()},
        "tokens_per_s": result.tokens_per_s,
        "peak_bytes": peak,
        "memory_method": method,
        "corpus": result.corpus_meta,
    }
    result_path.write_text(json.dumps(record) + "\n")


def _run_isolated(cfg: TrainConfig, result_path: Path, timeout_s: float) -> dict[str, Any]:
    process = process_context().Process(target=_worker, args=(cfg, result_path))
    process.start()
    process.join(timeout_s)
    if process.is_alive():
        process.terminate()
        process.join(10)
        raise RuntimeError(f"{cfg.model} seed {cfg.seed} did not finish within {timeout_s:.0f} s")
    if process.exitcode != 0 or not result_path.is_file():
        raise RuntimeError(f"{cfg.model} seed {cfg.seed} failed (exit code {process.exitcode})")
    record: dict[str, Any] = json.loads(result_path.read_text())
    return record


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    python = platform.python_version()
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, Python {python}"


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``niels-ablate``. Exit 0 done, 1 a run failed, 2 bad arguments."""
    parser = argparse.ArgumentParser(
        prog="niels-ablate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 6 steps, 2 seeds")
    parser.add_argument("--seeds", type=int, help="seeds per model (default 3, quick 2)")
    parser.add_argument("--steps", type=int, help=f"steps per run (default {STUDY['steps']})")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto")
    parser.add_argument("--corpus", type=Path, help="folder or text file (default: stdlib)")
    parser.add_argument("--data-dir", type=Path, help="token array cache")
    parser.add_argument("--out", type=Path, default=Path("runs/ablate"), help="output folder")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 3)
    if seeds < 1:
        parser.error(f"--seeds must be >= 1, got {seeds}")
    extra: dict[str, Any] = {
        "device": args.device,
        "corpus": args.corpus,
        "data_dir": args.data_dir,
    }
    if args.steps is not None:
        extra["steps"] = args.steps
    try:
        configs = [
            study_config(kind, seed, args.out, args.quick, **extra)
            for seed in range(seeds)
            for kind in MODEL_KINDS
        ]
        configs = [dataclasses.replace(c, eval_every=min(c.eval_every, c.steps)) for c in configs]
    except ValueError as err:
        parser.error(str(err))

    args.out.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    runs = []
    for cfg in configs:
        print(f"[{time.perf_counter() - t0:6.0f} s] {cfg.model} seed {cfg.seed} ...", flush=True)
        try:
            record = _run_isolated(cfg, args.out / f"{cfg.model}-seed{cfg.seed}.json", args.timeout)
        except RuntimeError as err:
            print(f"niels-ablate: {err}", file=sys.stderr)
            return 1
        runs.append(record)
        print(
            f"         val loss {record['final_val_loss']:.4f}, "
            f"{record['tokens_per_s']:,.0f} tokens/s",
            flush=True,
        )
    wall = time.perf_counter() - t0
    first = configs[0]
    machine = _machine()
    header = (
        f"niels-ablate - {date}\nmachine: {machine}\n"
        f"{seeds} seed(s) per model; each run {first.steps} steps x {first.batch_size} x "
        f"{first.T} = {first.steps * first.tokens_per_step:,} tokens; "
        f"width {first.C}, {first.L} layers, {first.H} heads; "
        f"corpus {runs[0]['corpus']['source']} ({runs[0]['corpus']['python']})\n"
    )
    text = header + text_table(runs, runs[0]["memory_method"]) + f"wall time: {wall:.0f} s\n"
    print(text, end="")
    (args.out / "ablation.txt").write_text(text)
    (args.out / "ablation.md").write_text(markdown_table(runs))
    summary = {"date": date, "machine": machine, "wall_s": wall, "runs": runs}
    (args.out / "ablation.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"v0 vs v1, {seeds} seed(s), {runs[0]['params']:,} vs {runs[1]['params']:,} params"
    if plot_curves(runs, args.out / "ablation.png", title, f"{machine}\n{date}"):
        print(f"plot: {args.out / 'ablation.png'}")
    else:
        print("plot: skipped (pip install 'niels-gpt-experiments[plot]' for matplotlib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
