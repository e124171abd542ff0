"""attention 4.0's domain sweeps (loaded by ``attention_oracle.calls``; calls ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype:

- magnitude: inputs and weights both scaled by 1, 10, 30, 100 and 1000
  (scores up to about 1e12, still finite in float64); the bound's sum length
  covers the largest score, since exp turns a score's rounding (``|s| u``)
  into a relative error of the probabilities;
- grad2: Hessian-vector products (``autograd.grad`` with ``create_graph``,
  then the gradient of ``<g', v>``) with respect to the input and every
  parameter;
- history: one module after 2100 training calls (forward and backward),
  judged in eval and, in training, by causality (later tokens changed leave
  earlier outputs unchanged); two modules called in turn; a module rebuilt
  from a saved ``state_dict``;
- modes, layout, dtype, config, errors: train and eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` under ``no_grad``; transposed, strided
  and expanded inputs; float32, float16 modules and float16 autocast; each
  field the module reads (``H``, ``C``, ``T``, ``dropout``, ``rope_theta``)
  away from the default; bad inputs (device, dtype, rank) raising as the base.

The sweeps themselves are the maintainers' kit's (``speckit.module_sweeps``,
``module_sweeps``), which block's driver runs too; what is attention's own is
said here: the module, its config, and the bound of its scores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from speckit import module_sweeps as sweeps

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


def _score_bound(attn: CausalSelfAttention, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair (RoPE keeps norms)."""
    with torch.no_grad():
        q, k, _ = attn.qkv(x).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the attention stage's oracle."""
    sweeps.module_sweeps(
        o,
        sweeps.ModuleSweep(
            build=CausalSelfAttention,
            small=ModelConfig(V=2, T=32, C=16, H=2, dropout=0.0),
            stages=4,  # qkv, scores, probs @ v, proj
            about="",
            history=(
                ModelConfig(V=2, T=8, C=8, H=2, dropout=0.0),
                ModelConfig(V=2, T=16, C=12, H=3, dropout=0.0, rope_theta=500.0),
            ),
            fields={
                "H": {"H": 4},
                "C": {"C": 24, "H": 3},
                "T": {"T": 48},
                "rope_theta": {"rope_theta": 123.0},
                "dropout": {"dropout": 0.3},
            },
            score_bound=_score_bound,
        ),
    )
