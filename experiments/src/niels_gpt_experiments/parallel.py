"""Data parallelism with torch.distributed only: DDP, or FSDP2 with the tie kept.

The tied weight. ``GPT`` shares one ``Parameter`` between ``tok_emb.weight``
and ``lm_head.weight``. FSDP2 replaces every parameter of a module it shards by
a ``DTensor`` shard; if the embedding and the head were sharded as separate
units, each would get its own ``DTensor`` and the tie would be gone: two
weights, two optimizer states, each with half the gradient (the failure
torchtune#616 describes, where initialising on the meta device undid the tie).
So only the blocks are their own units, and ``fully_shard`` on the root
manages what is left (embedding, final norm, head) as one group, in which the
shared tensor is one ``FSDPParam`` registered on both modules. ``check_tied``
asserts that after wrapping and after every checkpoint load.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, Literal

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.runtime import Runtime

__all__ = [
    "Mode",
    "TiedWeightError",
    "check_tied",
    "choose_mode",
    "gradient_sync",
    "no_buffer_sync",
    "wrap",
]

Mode = Literal["single", "ddp", "fsdp"]


class TiedWeightError(RuntimeError):
    """The embedding and the LM head no longer share one parameter."""


def choose_mode(fsdp: bool, world: int) -> Mode:
    """``fsdp`` if asked, DDP on more than one rank, else a plain single process."""
    if fsdp:
        return "fsdp"
    return "ddp" if world > 1 else "single"


def check_tied(model: GPT) -> None:
    """Raise ``TiedWeightError`` unless ``lm_head.weight is tok_emb.weight``."""
    head, emb = model.lm_head.weight, model.tok_emb.weight
    if head is not emb:
        raise TiedWeightError(
            f"lm_head.weight ({type(head).__name__}, id {id(head):#x}) is not "
            f"tok_emb.weight ({type(emb).__name__}, id {id(emb):#x}): the tie is broken"
        )


def wrap(model: GPT, mode: Mode, runtime: Runtime) -> nn.Module:
    """Prepare ``model`` (already on ``runtime.device``) for data-parallel training.

    Returns:
        The module to call for training: ``model`` itself (single, and FSDP2,
        which shards ``model`` in place), or a ``DistributedDataParallel``
        around it.

    Raises:
        TiedWeightError: the tie did not survive (never expected).
    """
    if mode == "ddp":
        device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        engine: nn.Module = DistributedDataParallel(
            model, device_ids=device_ids, **no_buffer_sync()
        )
    elif mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(runtime.device.type, (runtime.world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)  # root group: tok_emb, ln_f, lm_head; the tie once
        engine = model
    else:
        engine = model
    check_tied(model)
    return engine


def no_buffer_sync() -> dict[str, Any]:
    """DDP keywords that skip the per-forward buffer broadcast.

    The RoPE tables and the causal mask are constants, the same on every rank.
    Newer torch spells it ``forward_sync_buffers=False`` (and deprecates the
    old ``broadcast_buffers=False``); older torch knows only the old name.
    """
    known = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"
    return {name: False}


@contextlib.contextmanager
def gradient_sync(engine: nn.Module, mode: Mode, enabled: bool) -> Iterator[None]:
    """Reduce gradients across ranks only when ``enabled`` (the last micro-batch)."""
    engine = getattr(engine, "_orig_mod", engine)  # under torch.compile: the wrapped module
    if mode == "ddp" and not enabled:
        if not isinstance(engine, DistributedDataParallel):
            raise TypeError(
                f"DDP mode needs a DistributedDataParallel, got {type(engine).__name__}"
            )
        with engine.no_sync():
            yield
        return
    if mode == "fsdp":
        engine.set_requires_gradient_sync(enabled)  # type: ignore[operator]
    yield
