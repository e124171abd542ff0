"""Runtime-rule drivers of the v0 block stage (maintainer-owned; run by ``contracts pr``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from speckit import module_runtime

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import Block, init_weights

Record = Callable[[], AbstractContextManager[None]]


def forward_backward(device: torch.device, record: Record) -> None:
    """A v0 block in train mode and with probabilities, forward and backward."""
    torch.manual_seed(0)
    cfg = ModelConfig(V=16, T=16, C=32, H=4, d_ff=64, dropout=0.1)
    block = Block(cfg).to(device)
    block.apply(init_weights)
    x = torch.randn(2, 12, cfg.C, device=device, requires_grad=True)  # (B, T, C)
    with record():
        module_runtime.drive(block, x)
