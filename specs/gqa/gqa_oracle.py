"""gqa's oracle driver: the kit's module sweep with H_kv a knob, then cache and padding calls.

``module_sweeps`` on ``H = 4``, ``H_kv = 2``, with ``H_kv = 1`` (multi-query) and
``H_kv = H`` (multi-head) among its config fields; all judged by ``gqa_reference.py``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from speckit import module_sweeps as sweeps

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

SMALL = ModelConfig(V=2, T=32, C=16, H=4, H_kv=2, dropout=0.0)  # D = 4, groups of 2


def _score_bound(attn: Any, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every pair (RoPE keeps norms)."""
    cfg = attn.cfg
    with torch.no_grad():
        qkv = attn.qkv(x).unflatten(-1, (-1, cfg.head_dim))  # (B, T, H + 2 H_kv, D)
        q, k = qkv[..., : cfg.H, :], qkv[..., cfg.H : cfg.H + cfg.kv_heads, :]  # (B, T, *, D)
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / cfg.head_dim**0.5
    return int(top) + 1


def _chunks(attn: Any, x: torch.Tensor) -> list[Any]:
    """``x`` ``(B, 20, C)`` in chunks of 7, 1, 1 and 11 through a fresh cache of H_kv heads."""
    cfg, (b, _, _) = attn.cfg, x.shape
    attn.kv_cache = KVCache(b, cfg.kv_heads, cfg.T, cfg.head_dim, dtype=x.dtype, device=x.device)
    outs = [attn(x[:, i:j], return_attn=True) for i, j in ((0, 7), (7, 8), (8, 9), (9, 20))]
    attn.kv_cache = None
    return outs  # ((B, j - i, C), (B, H, j - i, j)) each


def _own(o: Oracle) -> None:
    """``gqa/...`` with H_kv in {1, 2, 4}: cached chunks, and row 1 left-padded by 5."""
    mask = torch.arange(20).expand(2, 20) >= torch.tensor([[0], [5]])  # (2, 20)
    pos = (torch.arange(20) - torch.tensor([[0], [5]])).clamp(min=0)  # (2, 20)
    for hk in (1, 2, 4):
        attn = CausalSelfAttention(dataclasses.replace(SMALL, H_kv=hk)).double().eval()
        o.load_weights(attn, f"own-w{hk}")
        x, about = o.randn(2, 20, 16, tag=f"own-x{hk}"), f"B=2 T=20 C=16 H=4 H_kv={hk} f64 eval"
        with torch.no_grad():
            o.call(f"gqa/cache/H_kv={hk}", partial(_chunks, attn, x), stages=4, reduction=20,
                   desc=f"{about}, chunks of 7, 1, 1, 11 cached")  # fmt: skip
            padded = partial(attn, x, return_attn=True, positions=pos, key_mask=mask)
            o.call(f"gqa/padded/H_kv={hk}", padded, stages=4, reduction=20,
                   desc=f"{about}, row 1 left-padded by 5")  # fmt: skip


def calls(o: Oracle) -> None:
    """Every call of the gqa stage's oracle."""
    sweeps.module_sweeps(o, sweeps.ModuleSweep(
        build=CausalSelfAttention, small=SMALL, stages=4, about=" H_kv=2",
        history=(ModelConfig(V=2, T=8, C=8, H=2, H_kv=1, dropout=0.0),
                 ModelConfig(V=2, T=16, C=24, H=6, H_kv=2, dropout=0.0, rope_theta=500.0)),
        fields={"H_kv=1": {"H_kv": 1}, "H_kv=H": {"H_kv": 4}, "H": {"H": 8},
                "C": {"C": 24, "H": 6, "H_kv": 3}, "T": {"T": 48},
                "rope_theta": {"rope_theta": 123.0}, "dropout": {"dropout": 0.3}},
        score_bound=_score_bound,
    ))  # fmt: skip
    _own(o)
