"""Run training on N local gloo ranks from one Python process (tests, benchmarks).

``torchrun`` is the way to launch a real job. This module is for code that
needs ranks as a function call: it spawns ``world`` fresh processes, joins them
through a ``TCPStore`` that the calling process hosts on ``127.0.0.1`` (port
picked by the OS, so no race for a free port), binds gloo to the loopback
interface, and bounds everything with a timeout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # not in __all__

from niels_gpt_experiments.config import TrainConfig

__all__ = [
    "RankResult",
    "Task",
    "process_context",
    "run_local",
    "run_processes",
    "train_on_ranks",
]

HOST = "127.0.0.1"


# What a fresh rank would import anyway; a forkserver imports it once for all ranks.
_PRELOAD = ["torch", "torch._dynamo", "niels_gpt_experiments.trainer"]


def process_context() -> SpawnContext | ForkServerContext:
    """Where fresh processes come from: a forkserver that has torch imported
    already (a new process starts in well under a second, with no state of the
    caller's), or plain ``spawn`` where there is no forkserver (Windows)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


def run_processes(procs: Sequence[BaseProcess], timeout_s: float) -> bool:
    """Start every process, wait ``timeout_s`` seconds in all for them, kill what is left.

    Args:
        procs: processes not started yet (from ``process_context()``).
        timeout_s: one deadline for the whole group, not a wait per process.

    Returns:
        True when every process ended by the deadline; False when one had to be
        killed. Exit codes are the caller's to read. A process still alive when
        this returns or raises (an interrupt while waiting) is killed and joined
        (up to 10 s) first.
    """
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout_s
    finished = False
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        finished = not any(proc.is_alive() for proc in procs)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    return finished


def _loopback() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n.startswith("lo")), None)


def _entry(
    rank: int,
    world: int,
    port: int,
    timeout_s: float,
    threads: int | None,
    target: Callable[..., None],
    args: tuple[Any, ...],
) -> None:
    loopback = _loopback()
    if loopback is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    if threads is not None:
        torch.set_num_threads(threads)
    timeout = dt.timedelta(seconds=timeout_s)
    store = TCPStore(HOST, port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        target(*args)
    finally:
        dist.destroy_process_group()


def run_local(
    world: int,
    target: Callable[..., None],
    args: tuple[Any, ...] = (),
    *,
    timeout_s: float = 120.0,
    threads: int | None = None,
) -> None:
    """Call ``target(*args)`` on ``world`` fresh ranks of one gloo process group.

    ``target`` must be importable by name (the new processes import it).
    ``threads`` sets ``torch.set_num_threads`` in each rank.

    Raises:
        TimeoutError: a rank was still running after ``timeout_s`` (all are killed).
        RuntimeError: a rank exited with an error (its traceback is on stderr).
    """
    timeout = dt.timedelta(seconds=timeout_s)
    store = TCPStore(HOST, 0, is_master=True, timeout=timeout, wait_for_workers=False)
    context = process_context()
    procs = [
        context.Process(
            target=_entry, args=(rank, world, store.port, timeout_s, threads, target, args)
        )
        for rank in range(world)
    ]
    if not run_processes(procs, timeout_s):
        raise TimeoutError(f"{world} ranks did not finish within {timeout_s:.0f} s")
    codes = [proc.exitcode for proc in procs]
    if any(code != 0 for code in codes):
        raise RuntimeError(f"a rank failed: exit codes {codes}")


@dataclasses.dataclass
class RankResult:
    """What rank 0 of ``train_on_ranks`` reports for one configuration."""

    losses: dict[int, float]
    val_losses: dict[int, float]
    step_seconds: list[float]
    final_state: dict[str, torch.Tensor]


Task = TrainConfig | tuple[str, ...]


def _train_all(tasks: Sequence[Task], folder: str) -> None:
    from niels_gpt_experiments.cli import train_main
    from niels_gpt_experiments.trainer import train

    for i, task in enumerate(tasks):
        if not isinstance(task, TrainConfig):
            code = train_main(list(task))
            if code != 0:
                raise RuntimeError(f"niels-train {' '.join(task)} exited with {code}")
            continue
        result = train(task, keep_state=True)
        if dist.get_rank() == 0:
            record = {
                "losses": result.losses,
                "val_losses": result.val_losses,
                "step_seconds": result.step_seconds,
                "final_state": result.final_state,
            }
            torch.save(record, Path(folder) / f"{i}.pt")


def train_on_ranks(
    tasks: Sequence[Task],
    world: int,
    *,
    timeout_s: float = 300.0,
    threads: int | None = None,
) -> list[RankResult | None]:
    """Run each task in turn on ``world`` local gloo ranks.

    A ``TrainConfig`` is trained with ``train`` and gives rank 0's
    ``RankResult``; a tuple of strings is a ``niels-train`` command line, whose
    results are in its run directory, and gives ``None``.
    """
    with tempfile.TemporaryDirectory(prefix="niels-ranks-") as folder:
        run_local(world, _train_all, (list(tasks), folder), timeout_s=timeout_s, threads=threads)
        results: list[RankResult | None] = []
        for i in range(len(tasks)):
            path = Path(folder) / f"{i}.pt"
            record = torch.load(path, weights_only=True) if path.is_file() else None
            results.append(None if record is None else RankResult(**record))
    return results
