"""Where a run executes: one process, or one rank of a ``torch.distributed`` job.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) the process group comes from
the environment: ``gloo`` on CPU, ``nccl`` for CUDA tensors with ``gloo``
beside it for CPU objects. A caller that already initialised a group (a test,
a notebook) keeps it. FSDP2 needs a device mesh even on one process, so a
single process asked for FSDP gets a one-rank group over an in-memory store
(no network at all).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import HashStore  # type: ignore[attr-defined]  # not in __all__

from niels_gpt.device import resolve_device

__all__ = ["Runtime", "all_gather_objects", "barrier", "start", "stop"]

DEFAULT_TIMEOUT = dt.timedelta(minutes=10)


@dataclass(frozen=True)
class Runtime:
    """Rank, world size and device of this process."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool  # this module created the process group, so it destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def _backend(device: torch.device) -> str:
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def start(
    device_name: str, *, need_group: bool, timeout: dt.timedelta = DEFAULT_TIMEOUT
) -> Runtime:
    """Resolve the device and join (or make) the process group the run needs.

    Args:
        device_name: ``cpu``, ``cuda``, ``mps`` or ``auto``; under torchrun a
            CUDA device becomes ``cuda:LOCAL_RANK``.
        need_group: make a one-rank group when there is none (FSDP).

    Raises:
        ValueError, DeviceUnavailableError: from ``resolve_device``.
        RuntimeError: a distributed run asked for MPS (no collective backend).
    """
    device = resolve_device(device_name)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if device.type == "cuda" and launched:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if device.type == "mps" and (launched or need_group or dist.is_initialized()):
        raise RuntimeError("torch.distributed has no backend for MPS; use --device cpu")
    owns = False
    if not dist.is_initialized():
        if launched:
            dist.init_process_group(_backend(device), timeout=timeout)
            owns = True
        elif need_group:
            store = HashStore()
            dist.init_process_group(
                _backend(device), store=store, rank=0, world_size=1, timeout=timeout
            )
            owns = True
    if dist.is_initialized():
        return Runtime(dist.get_rank(), dist.get_world_size(), device, owns)
    return Runtime(0, 1, device, owns)


def stop(runtime: Runtime) -> None:
    """Destroy the process group if ``start`` created it."""
    if runtime.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(runtime: Runtime) -> None:
    if runtime.distributed:
        dist.barrier()


def all_gather_objects(runtime: Runtime, obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (``[obj]`` on a single process)."""
    if not runtime.distributed:
        return [obj]
    out: list[Any] = [None] * runtime.world
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(runtime: Runtime, values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (the tensor itself on a single process)."""
    if runtime.distributed:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values
