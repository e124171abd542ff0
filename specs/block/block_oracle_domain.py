"""block 4.0's domain sweeps (loaded by ``block_oracle.calls``; calls ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype:

- magnitude: inputs and weights both scaled by 1, 10, 30, 100 and 1000; the
  bound's sum length covers the largest attention score (exp turns a
  score's rounding, ``|s| u``, into a relative error of the probabilities);
- grad2: Hessian-vector products (``autograd.grad`` with ``create_graph``,
  then the gradient of ``<g', v>``) of ``Block`` and of ``MLP`` with respect
  to the input and every parameter: an activation whose second derivative
  is wrong shows here while its value and gradient agree;
- history: one block after 2100 training calls (forward and backward),
  judged in eval and, in training, by causality; two blocks called in turn;
  a block rebuilt from a saved ``state_dict``;
- modes, layout, dtype, config, errors: train and eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` under ``no_grad``; transposed, strided
  and expanded inputs; float32, float16 blocks and float16 autocast; each
  field the block reads (``H``, ``C``, ``d_ff``, ``T``, ``dropout``,
  ``rope_theta``) away from the default; bad inputs raising as the base.

The sweeps are the maintainers' kit's (``speckit.module_sweeps``,
``module_sweeps``), which attention's driver runs too; block's own are the
module, its config, the bound of its scores and the MLP's second derivative.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
from speckit import module_sweeps as sweeps

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


SMALL = ModelConfig(V=2, T=32, C=16, H=2, d_ff=40, dropout=0.0)


def _score_bound(block: Block, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair (RoPE keeps norms)."""
    attn = block.attn
    with torch.no_grad():
        q, k, _ = attn.qkv(block.ln1(x)).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the block stage's oracle."""
    sweeps.module_sweeps(
        o,
        sweeps.ModuleSweep(
            build=Block,
            small=SMALL,
            stages=7,  # ln1, qkv, scores, probs @ v, proj, fc, proj
            about=f" d_ff={SMALL.d_ff}",
            history=(
                ModelConfig(V=2, T=8, C=8, H=2, d_ff=16, dropout=0.0),
                ModelConfig(V=2, T=16, C=12, H=3, d_ff=20, dropout=0.0, rope_theta=500.0),
            ),
            fields={
                "H": {"H": 4},
                "C": {"C": 24, "H": 3},
                "d_ff": {"d_ff": 7},
                "T": {"T": 48},
                "rope_theta": {"rope_theta": 123.0},
                "dropout": {"dropout": 0.3},
            },
            score_bound=_score_bound,
        ),
    )
    if o.wants("domain/grad2/mlp"):
        mlp = MLP(SMALL).double()
        o.load_weights(mlp, "grad2-mlp")
        x = 2.0 * o.randn(2, 9, SMALL.C, tag="grad2-mlp-x")  # (2, 9, C): the activation's bend
        o.call(
            "domain/grad2/mlp",
            partial(sweeps.output_hvp, o, mlp, x, "domain/grad2/mlp"),
            desc="MLP on (2, 9, 16) f64: Hessian-vector products (x, parameters)",
            stages=8,
            reduction=SMALL.d_ff,
            axes=("grad2",),
        )
