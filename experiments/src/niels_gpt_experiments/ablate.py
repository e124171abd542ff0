"""``niels-ablate``: v0 against v1 at equal parameter count and equal tokens.

    niels-ablate                      # the default study (minutes on 2 CPU cores)
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
import re
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.corpus import CorpusError, list_sources
from niels_gpt_experiments.flags import folder_problem, with_flags
from niels_gpt_experiments.launch import process_context, run_processes
from niels_gpt_experiments.machine import cpu_name
from niels_gpt_experiments.models import MODEL_KINDS
from niels_gpt_experiments.report import markdown_table, plot_curves, text_table

__all__ = ["STUDY", "main", "study_config", "study_files"]

# What a study writes under --out (besides a run folder, result and log per model and seed).
REPORT_FILES = ("ablation.json", "ablation.txt", "ablation.md", "ablation.png")
_RUN_OUTPUT = re.compile(r"(v0|v1)-seed\d+(\.json|\.log)?")
# The study's settings a user sets by a flag of niels-ablate.
_ABLATE_FLAGS = {"steps": "--steps", "corpus": "--corpus", "device": "--device",
                 "data_dir": "--data-dir", "seed": "--seeds"}  # fmt: skip


def study_files(out: Path) -> list[Path]:
    """What an earlier study left in ``out``: its reports and its runs' folders, results
    and logs; nothing else there counts (or is removed by ``--overwrite``)."""
    if not out.is_dir():
        return []
    return sorted(
        p for p in out.iterdir() if p.name in REPORT_FILES or _RUN_OUTPUT.fullmatch(p.name)
    )


# The default study: a 0.9M-parameter model, 160 steps of 16 x 128 tokens (328k tokens):
# about 5 minutes on 2 idle CPU cores, well under 15 on a busy one.
STUDY: dict[str, Any] = {
    "T": 128,
    "C": 128,
    "L": 4,
    "H": 4,
    "steps": 160,
    "batch_size": 16,
    "lr": 2e-3,
    "warmup": 20,
    "eval_every": 40,
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
    # Each study run is the study's own scratch: a second niels-ablate replaces it.
    return TrainConfig(
        model=kind,  # type: ignore[arg-type]
        seed=seed,
        out_dir=out / f"{kind}-seed{seed}",
        overwrite=True,
        **settings,
    )


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


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return float(usage.ru_utime + usage.ru_stime)


def _worker(cfg: TrainConfig, result_path: Path, threads: int) -> None:
    """Train one (model, seed) in this fresh process and write what it measured.

    The run's own output goes to ``<result>.log`` beside the result, so that
    runs side by side do not interleave on the terminal.
    """
    import contextlib

    import torch

    from niels_gpt.device import resolve_device
    from niels_gpt_experiments.trainer import train

    cuda = resolve_device(cfg.device).type == "cuda"
    torch.set_num_threads(threads)
    before = _rss_now()
    with (
        result_path.with_suffix(".log").open("w") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
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
        "cpu_s": _cpu_seconds(),
        "memory_method": method,
        "corpus": result.corpus_meta,
    }
    result_path.write_text(json.dumps(record) + "\n")


def _run_side_by_side(
    configs: Sequence[TrainConfig], out: Path, threads: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Train ``configs`` at the same time, one fresh process each; wait for all.

    Raises:
        RuntimeError: a run failed or outlived ``timeout_s`` (all are stopped).
    """
    context = process_context()
    paths = [out / f"{cfg.model}-seed{cfg.seed}.json" for cfg in configs]
    procs = [
        context.Process(target=_worker, args=(cfg, path, threads))
        for cfg, path in zip(configs, paths, strict=True)
    ]
    run_processes(procs, timeout_s)  # a killed run's exit code is not 0: reported below
    records = []
    for cfg, path, proc in zip(configs, paths, procs, strict=True):
        if proc.exitcode != 0 or not path.is_file():
            log = path.with_suffix(".log")
            raise RuntimeError(
                f"{cfg.model} seed {cfg.seed} failed or timed out (exit code {proc.exitcode}); "
                f"its output: {log}"
            )
        records.append(json.loads(path.read_text()))
    return records


def _machine() -> str:
    import torch

    python = platform.python_version()
    return f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {python}"


def _check_inputs(
    parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: TrainConfig
) -> None:
    """What the runs would fail on minutes later, refused now (exit 2, the flag named): an
    ``--out`` holding a study, a device this machine lacks, a corpus with nothing to read."""
    for flag, folder in (("--out", args.out), ("--data-dir", args.data_dir)):
        problem = None if folder is None else folder_problem(folder)
        if problem is not None:
            parser.error(f"{flag} {folder}: {problem}")
    earlier = study_files(args.out)
    if earlier and not args.overwrite:
        names = ", ".join(p.name for p in earlier[:4]) + (", ..." if len(earlier) > 4 else "")
        parser.error(
            f"--out {args.out} already holds a study ({names}): pass --overwrite to replace "
            "it, or another --out"
        )
    from niels_gpt.device import DeviceUnavailableError, resolve_device  # torch loads here

    try:
        resolve_device(args.device)
    except (ValueError, DeviceUnavailableError) as err:
        parser.error(f"--device {args.device}: {str(err).splitlines()[0]}")
    if args.corpus is not None:
        try:
            list_sources(cfg.corpus_spec())
        except CorpusError as err:
            parser.error(f"--corpus {args.corpus}: {err}")


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``niels-ablate``. Exit 0 done, 1 a run failed, 2 an input error (named:
    a bad value, an ``--out`` holding a study without ``--overwrite``, a missing device or
    corpus)."""
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
    parser.add_argument("--jobs", type=int, help="runs side by side (default: 2 on CPU, 1 on GPU)")
    parser.add_argument("--threads", type=int, help="torch threads per run (default: cores/jobs)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the study already in --out (without it, such an --out is refused)",
    )
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 3)
    cores = os.cpu_count() or 1
    jobs = args.jobs if args.jobs is not None else (1 if args.device != "cpu" else min(2, cores))
    threads = args.threads if args.threads is not None else max(1, cores // jobs)
    for name, value in (("--seeds", seeds), ("--jobs", jobs), ("--threads", threads)):
        if value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
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
        parser.error(with_flags(str(err), _ABLATE_FLAGS, lambda f: extra.get(f)))
    _check_inputs(parser, args, configs[0])

    if args.overwrite:
        for path in study_files(args.out):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    args.out.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for start in range(0, len(configs), jobs):
        batch = configs[start : start + jobs]
        names = ", ".join(f"{c.model} seed {c.seed}" for c in batch)
        print(f"[{time.perf_counter() - t0:6.0f} s] {names} ...", flush=True)
        try:
            records = _run_side_by_side(batch, args.out, threads, args.timeout)
        except RuntimeError as err:
            print(f"niels-ablate: {err}", file=sys.stderr)
            return 1
        for record in records:
            print(
                f"         {record['model']} seed {record['seed']}: val loss "
                f"{record['final_val_loss']:.4f}, {record['tokens_per_s']:,.0f} tokens/s",
                flush=True,
            )
        runs.extend(records)
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
    header += (
        f"{jobs} run(s) side by side, {threads} torch thread(s) each "
        "(v0 and v1 of a seed together, so both see the same load)\n"
    )
    cpu, cores = sum(r["cpu_s"] for r in runs), os.cpu_count() or 1
    footer = (
        f"wall time: {wall:.0f} s; CPU time of the runs: {cpu:.0f} s "
        f"(= {cpu / cores:.0f} s of wall on {cores} otherwise idle cores)\n"
    )
    text = header + text_table(runs, runs[0]["memory_method"]) + footer
    print(text, end="")
    (args.out / "ablation.txt").write_text(text)
    (args.out / "ablation.md").write_text(markdown_table(runs))
    summary = {"date": date, "machine": machine, "wall_s": wall, "jobs": jobs,
               "threads": threads, "runs": runs}  # fmt: skip
    (args.out / "ablation.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"v0 vs v1, {seeds} seed(s), {runs[0]['params']:,} vs {runs[1]['params']:,} params"
    if plot_curves(runs, args.out / "ablation.png", title, f"{machine}\n{date}"):
        print(f"plot: {args.out / 'ablation.png'}")
    else:
        print("plot: skipped (pip install 'niels-gpt-experiments[plot]' for matplotlib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
