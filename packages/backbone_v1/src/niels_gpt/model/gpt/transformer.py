"""The GPT v1 model: token embedding, RoPE attention blocks, tied LM head.

Shape notation::

    B: batch, t: sequence length (<= cfg.T), C: width, V: vocabulary,
    H: heads, L: blocks

There is no learned position embedding; positions enter through RoPE inside
each attention layer.
"""

from __future__ import annotations

from typing import TypedDict

import torch
from torch import nn

from niels_gpt.checks import InputError, check_length
from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import Block, RMSNorm, init_weights

__all__ = ["GPT", "AttnTrace"]


class AttnTrace(TypedDict):
    """Attention probabilities of one layer, post-softmax and pre-dropout.

    - ``layer``: index of the traced block.
    - ``attn_row``: ``(B, H, t)``, the last query position's row.
    - ``attn_full``: ``(B, H, t, t)`` when asked for, else ``None``.
    """

    layer: int
    attn_row: torch.Tensor
    attn_full: torch.Tensor | None


class GPT(nn.Module):
    """Decoder-only transformer over token ids.

    ``tok_emb -> dropout -> L x Block -> ln_f (RMSNorm) -> lm_head``; ``lm_head``
    has no bias and shares its weight with ``tok_emb``. Weights are initialised
    with ``init_weights`` at construction.
    """

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
        self.lm_head.weight = self.tok_emb.weight  # tied: one Parameter, (V, C)
        self.apply(init_weights)

    def _check_tokens(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise InputError(f"x must be a torch.Tensor of token ids, got {type(x).__name__}")
        if x.ndim != 2:
            raise InputError(f"x must be 2-D (B, t), got shape {tuple(x.shape)}")
        if x.dtype != torch.int64:
            raise InputError(f"x must hold int64 token ids, got {x.dtype}")
        weight = self.tok_emb.weight
        if x.device != weight.device:
            raise InputError(f"x device must be the model's ({weight.device}), got {x.device}")
        check_length(x.shape[1], self.cfg.T)
        # A value check needs a host sync; skip it inside torch.compile graphs.
        if not torch.compiler.is_compiling() and x.numel() > 0:
            lo, hi = int(x.min()), int(x.max())
            if lo < 0 or hi >= self.cfg.V:
                raise InputError(
                    f"token ids must be in [0, {self.cfg.V - 1}] (cfg.V={self.cfg.V}), "
                    f"got min {lo}, max {hi}"
                )

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(self.ln_f(h))  # (B, t, V)
        return logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits.

        Args:
            x: ``(B, t)`` int64 token ids in ``[0, V)``, ``1 <= t <= cfg.T``,
                on the model's device.

        Returns:
            logits ``(B, t, V)`` in the model's dtype (float32 by default).

        Raises:
            InputError (an AssertionError): wrong rank, dtype, device, ids out
                of range, or ``t > cfg.T`` (the hard length assert).
        """
        self._check_tokens(x)
        h = self.drop(self.tok_emb(x))  # (B, t, C)
        for block in self.blocks:
            h = block(h)  # (B, t, C)
        return self._logits(h)  # (B, t, V)

    def forward_with_attn_trace(
        self,
        x: torch.Tensor,
        trace_layer: int,
        return_full_attn: bool = False,
    ) -> tuple[torch.Tensor, AttnTrace]:
        """Logits plus the attention probabilities of block ``trace_layer``.

        Args:
            x: as in ``forward``.
            trace_layer: block index in ``[0, L)``.
            return_full_attn: also return the full ``(B, H, t, t)`` matrix.

        Returns:
            ``(logits, trace)``: logits ``(B, t, V)`` equal to ``forward(x)``
            (in eval mode) and an ``AttnTrace``.

        Raises:
            InputError: as in ``forward``, or ``trace_layer`` outside ``[0, L)``.
        """
        self._check_tokens(x)
        n_layers = len(self.blocks)
        if isinstance(trace_layer, bool) or not isinstance(trace_layer, int):
            raise InputError(f"trace_layer must be an int, got {type(trace_layer).__name__}")
        if not 0 <= trace_layer < n_layers:
            raise InputError(f"trace_layer must be in [0, {n_layers - 1}], got {trace_layer}")

        h = self.drop(self.tok_emb(x))  # (B, t, C)
        probs = h.new_empty(0)
        for i, block in enumerate(self.blocks):
            if i == trace_layer:
                h, probs = block(h, return_attn=True)  # (B, t, C), (B, H, t, t)
            else:
                h = block(h)  # (B, t, C)
        trace: AttnTrace = {
            "layer": trace_layer,
            "attn_row": probs[:, :, -1, :],  # (B, H, t)
            "attn_full": probs if return_full_attn else None,  # (B, H, t, t) | None
        }
        return self._logits(h), trace
