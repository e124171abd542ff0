"""Float64 reference of backbone_v1's GPT (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.gpt``, after ``blocks_reference.py`` in place of
``niels_gpt.model.blocks`` (listed first in ``specs/backbone_v1.toml``; the
import below refuses to build on anything else). It is written from the spec
(invariants ``forward_shape_dtype``, ``trace_contract``,
``trace_equals_full_last_row``, ``dropout_placement``, ``weight_tying``,
``length_assert``, ``rejects_bad_input``, ``matches_reference``,
``mixed_precision``) and seed 004, not from the implementation:

``tok_emb -> dropout -> L blocks -> ln_f (RMSNorm, eps 1e-5) -> lm_head``,
``lm_head`` without bias and holding the embedding's own Parameter (tied),
built in that order, initialised with ``init_weights``. The logits are the
final norm of the last block's output times the embedding matrix
transposed; ``forward_with_attn_trace`` also returns the traced block's
pre-dropout probabilities: ``attn_row`` the last query's row ``(B, H, t)``,
``attn_full`` the whole ``(B, H, t, t)`` when asked, else ``None``.

Every number is computed in float64 from the ids and the parameters; the
logits are rounded to the model's dtype, or to the autocast dtype inside
autocast (the head is a Linear layer), the probabilities to float32 (float64
in a float64 model). Token ids of the wrong type, rank, dtype, device, length
(``1 <= t <= cfg.T``) or range, and a trace layer outside ``[0, L)``, raise
core's ``InputError`` (the seeds' hard asserts) before any work.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model import blocks

if not getattr(blocks, "REFERENCE", False):  # the stage's blocks would make this no reference
    raise ImportError("gpt_reference.py needs blocks_reference.py loaded as niels_gpt.model.blocks")

Block, RMSNorm, init_weights = blocks.Block, blocks.RMSNorm, blocks.init_weights

__all__ = ["GPT", "AttnTrace"]


class AttnTrace(TypedDict):
    """One layer's pre-dropout probabilities: ``attn_row`` ``(B, H, t)``, ``attn_full``
    ``(B, H, t, t)`` or ``None``."""

    layer: int
    attn_row: torch.Tensor
    attn_full: torch.Tensor | None


class GPT(nn.Module):
    """The spec's decoder over token ids, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"GPT expects a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.V, cfg.C)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.L)])
        self.ln_f = RMSNorm(cfg.C, eps=1e-5)
        self.lm_head = nn.Linear(cfg.C, cfg.V, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # (V, C): one Parameter
        self.apply(init_weights)

    def _check(self, x: torch.Tensor) -> None:
        weight = self.tok_emb.weight
        if not isinstance(x, torch.Tensor) or x.ndim != 2:
            raise InputError(f"x must be (B, t) token ids, got {getattr(x, 'shape', x)}")
        if x.dtype != torch.int64:
            raise InputError(f"x must be int64, got {x.dtype}")
        if x.device != weight.device:
            raise InputError(f"x must be on {weight.device}, got {x.device}")
        if not 1 <= x.shape[1] <= self.cfg.T:
            raise InputError(f"t must be in [1, {self.cfg.T}], got {x.shape[1]}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.cfg.V):
            raise InputError(f"token ids must be in [0, {self.cfg.V})")

    def _run(self, x: torch.Tensor, trace: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``(B, t, V)`` and the traced block's probabilities ``(B, H, t, t)``."""
        weight = self.tok_emb.weight  # (V, C), lm_head's too
        out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        probs_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
        probs = None
        with torch.autocast("cpu", enabled=False):
            h = self.drop(F.embedding(x, weight.double()))  # (B, t, C)
            for i, block in enumerate(self.blocks):
                assert isinstance(block, Block)
                wide: Any = block  # the reference's Block (mypy sees the stage's)
                h, p = wide.float64(h, i == trace)  # (B, t, C), (B, H, t, t) | None
                probs = p if p is not None else probs
            norm: Any = self.ln_f  # the reference's RMSNorm
            logits = norm.float64(h) @ self.lm_head.weight.double().T  # (B, t, V)
            out = logits.to(out_dtype or weight.dtype)  # (B, t, V)
        return out, None if probs is None else probs.to(probs_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self._run(x, None)[0]  # (B, t, V)

    def forward_with_attn_trace(
        self, x: torch.Tensor, trace_layer: int, return_full_attn: bool = False
    ) -> tuple[torch.Tensor, AttnTrace]:
        self._check(x)
        if isinstance(trace_layer, bool) or not isinstance(trace_layer, int):
            raise InputError(f"trace_layer must be an int, got {type(trace_layer).__name__}")
        if not 0 <= trace_layer < len(self.blocks):
            raise InputError(f"trace_layer must be in [0, {len(self.blocks)}), got {trace_layer}")
        logits, probs = self._run(x, trace_layer)  # (B, t, V), (B, H, t, t)
        assert probs is not None
        trace: AttnTrace = {
            "layer": trace_layer,
            "attn_row": probs[:, :, -1, :],  # (B, H, t)
            "attn_full": probs if return_full_attn else None,  # (B, H, t, t) | None
        }
        return logits, trace
