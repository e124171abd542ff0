"""A module's runtime-rule drive: what attention's and block's runtime drivers share.

``drive(module, x)`` calls a module that maps ``(B, T, C)`` to ``(B, T, C)`` and
may return its attention probabilities every way a user does: a forward and
backward in training, a forward with probabilities and its backward in eval,
and eval forwards under ``no_grad`` and ``inference_mode`` (where a fused
kernel is cheapest to slip in). A runtime driver calls it inside its
``with record():`` block, so every op those calls dispatch is judged. It
imports torch and nothing else.
"""

from __future__ import annotations

import torch


def drive(module: torch.nn.Module, x: torch.Tensor) -> None:
    """``module`` on ``x`` ``(B, T, C)``, a leaf that requires grad, in each mode; left in eval."""
    module.train()
    module(x).square().mean().backward()
    module.eval()
    y, probs = module(x, return_attn=True)  # (B, T, C), (B, H, T, T)
    (y.sum() + probs.sum()).backward()
    with torch.no_grad():
        module(x)  # (B, T, C)
    with torch.inference_mode():
        module(x.detach())  # (B, T, C)
