"""A request's draw is made in at least float32, as the stages draw it.

``kv_cache.generate`` filters and draws in the wider of the model's dtype and
float32; a served request must draw the same token from the same logits and
seed, whatever dtype the model computed them in.
"""

from __future__ import annotations

import pytest
import torch

from niels_gpt.model.kv_cache import filter_logits
from niels_gpt_serve.sampling import Knobs, choose, new_generator

KNOBS = Knobs(temperature=0.7, top_k=50, top_p=0.9)


def _stage_draw(logits: torch.Tensor, seed: int) -> int:
    """The draw the way the stage makes it: filter in ``wide``, softmax, one multinomial."""
    wide = torch.promote_types(logits.dtype, torch.float32)
    row = logits.to(wide)[None]  # (1, V)
    probs = torch.softmax(
        filter_logits(row, temperature=KNOBS.temperature, top_k=KNOBS.top_k, top_p=KNOBS.top_p),
        dim=-1,
    )  # (1, V)
    return int(torch.multinomial(probs, 1, generator=new_generator(seed))[0, 0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(8))
def test_a_draw_is_the_stages_draw_in_the_wider_dtype(dtype: torch.dtype, seed: int) -> None:
    gen = torch.Generator().manual_seed(1000 + seed)
    logits = (torch.randn(256, generator=gen, dtype=torch.float64) * 3).to(dtype)  # (V,)
    assert choose(logits, KNOBS, new_generator(seed)) == _stage_draw(logits, seed)


def test_float64_logits_are_not_rounded_to_float32() -> None:
    """Two logits that only float64 tells apart: the argmax must see the difference."""
    logits = torch.ones(4, dtype=torch.float64)  # (V,)
    logits[2] += 1e-12  # 1 + 1e-12 is 1.0 in float32, a larger value in float64
    assert choose(logits, Knobs(temperature=0.0), new_generator(0)) == 2
