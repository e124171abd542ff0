"""Builders that padded generation's tests share: a drawn model, a left-padding
mask and a drawn prompt. The tests load this file by path (pytest's importlib mode
puts no test folder on ``sys.path``); pytest does not collect it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

Randomise = Callable[[torch.nn.Module, int], None]


def model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int,
    fast: bool = False,
    scale: float = 1.0,
) -> GPT:
    """A GPT with drawn weights (times ``scale``: below 1, flatter distributions and
    several tokens in play), in ``dtype`` on ``device``, eval mode; on the fast path if ``fast``."""
    model = GPT(cfg)
    randomise(model, seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)  # scale < 1: flatter distributions, several tokens in play
    model.to(device=device, dtype=dtype).eval()
    return use_fast_attention(model) if fast else model  # type: ignore[return-value]


def mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The (B, t) left-padding mask: row b is False on its first ``pads[b]`` columns."""
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


def prompt(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)
