"""Acceptance tests of padding 2.3: padded generation samples in float32.

As kv_cache 2.3 found against Hugging Face's generate: a float16 model's
logits divided by a small temperature in float16 overflow, and the draw got
NaN probabilities. Padded generation filters and draws in float32 (float64
in a float64 model) whatever the model's dtype, with one generator or one a
row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import padding_kit as kit
import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate

Randomise = Callable[[torch.nn.Module, int], None]
CFG = ModelConfig(V=31, T=16, C=16, L=2, H=2, d_ff=24, dropout=0.0, rope_theta=70.0)
PADS, T0 = [2, 0, 3], 5


def _setup(device: torch.device, randomise: Randomise, dtype: torch.dtype) -> tuple[GPT, ...]:
    """Logits of some tens: divided by 1e-4 in float16 they pass its largest finite value."""
    model = GPT(CFG)
    randomise(model, 9)
    with torch.no_grad():
        model.ln_f.weight.mul_(10.0)
    return (model.to(device=device, dtype=dtype).eval(),)


def _batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, CFG.V, (3, T0), generator=torch.Generator().manual_seed(1))  # (B, t)
    mask = torch.arange(T0)[None, :] >= torch.tensor(PADS)[:, None]  # (B, t) bool
    return ids.to(device), mask.to(device)


@pytest.mark.invariant("padding.float32_sampling")
@pytest.mark.parametrize("per_row", [False, True])
def test_a_float16_model_samples_at_a_small_temperature(
    device: torch.device, randomise: Randomise, per_row: bool
) -> None:
    (model,) = _setup(device, randomise, torch.float16)
    ids, mask = _batch(device)
    gens: object = torch.Generator(device=device).manual_seed(0)
    if per_row:
        gens = [torch.Generator(device=device).manual_seed(b) for b in range(3)]
    with torch.no_grad():
        assert model(ids).abs().max() * 1e4 > torch.finfo(torch.float16).max  # it would overflow
    out = cast(torch.Tensor, generate(model, ids, mask, 8, temperature=1e-4, generator=gens))  # type: ignore[arg-type]
    greedy = cast(torch.Tensor, generate(model, ids, mask, 8, temperature=0))
    assert out.shape == (3, T0 + 8) and bool(((out >= 0) & (out < CFG.V)).all())
    assert torch.equal(out[:, T0], greedy[:, T0])  # all the mass on the argmax


@pytest.mark.invariant("padding.float32_sampling")
@pytest.mark.parametrize("per_row", [False, True])
def test_probabilities_reach_the_draw_in_float32(
    device: torch.device, randomise: Randomise, monkeypatch: pytest.MonkeyPatch, per_row: bool
) -> None:
    (model,) = _setup(device, randomise, torch.bfloat16)
    ids, mask = _batch(device)
    seen = kit.watch_draw_dtypes(monkeypatch)
    gens: object = None
    if per_row:
        gens = [torch.Generator(device=device).manual_seed(b) for b in range(3)]
    generate(model, ids, mask, 3, temperature=0.02, top_k=4, generator=gens)  # type: ignore[arg-type]
    assert seen and set(seen) == {torch.float32}
