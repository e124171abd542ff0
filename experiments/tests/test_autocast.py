"""Training under autocast (``--precision bf16|fp16``).

The stages run under ``torch.autocast`` (RoPE rotates in float32 and hands
back the activation dtype), so both dtypes train end to end.

Tolerance: the first logged loss is taken on the initial weights, so the
float32 run and the autocast run see the same weights and the same batch and
differ only by the low-precision matmuls. With unit roundoff ``u`` (bf16:
``2**-9``, fp16: ``2**-12``) each autocast matmul output carries a relative
error of about ``u``; the logits pass through ``2 L + 2`` of them (here
``L = 2``: 6), and the per-token loss moves by at most twice the largest
logit error. ``rtol = 8 u`` covers that with room for the accumulation order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.trainer import train

UNIT_ROUNDOFF = {"bf16": 2.0**-9, "fp16": 2.0**-12}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_run_trains_and_starts_where_float32_does(
    precision: str, tiny: Callable[..., TrainConfig], tmp_path: Path, device: torch.device
) -> None:
    if precision == "fp16" and device.type == "mps":
        pytest.skip("fp16 autocast with a gradient scaler is a CUDA/CPU feature here")
    full = train(tiny(steps=6, out_dir=tmp_path / "fp32"))
    low = train(tiny(steps=6, precision=precision, out_dir=tmp_path / precision))
    assert all(math.isfinite(v) for v in [*low.losses.values(), *low.val_losses.values()])
    assert low.losses[1] == pytest.approx(full.losses[1], rel=8 * UNIT_ROUNDOFF[precision])
    assert low.losses[1] != full.losses[1]  # the low-precision matmuls did run
    assert low.val_losses[6] < low.losses[1]  # it learns


def test_autocast_resume_continues_the_curve(
    tiny: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    settings = {"steps": 4, "precision": "bf16", "eval_every": 2}
    whole = train(tiny(**settings, out_dir=tmp_path / "whole"))
    part = tiny(**settings, out_dir=tmp_path / "part", stop_after=2)
    train(part)
    rest = train(tiny(**settings, out_dir=tmp_path / "part", resume=True))
    assert rest.losses == {k: v for k, v in whole.losses.items() if k > 2}
