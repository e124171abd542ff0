"""Acceptance tests of kv_cache 2.3: sampling in float32, and HF's stop beside ours.

Found against Hugging Face transformers' ``generate`` (issue 21): a float16
model sampled at a small temperature divided its logits in float16, which
overflows (65504 is float16's largest finite value), and the softmax of
``inf - inf`` gave NaN probabilities. ``generate`` now filters and samples in
float32 (float64 for a float64 model) whatever the model's dtype. And
``generate_until_eos`` gives HF's shape of the result: it stops once every row
has produced ``eos_id`` and says how long each row is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import kv_cache_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate, generate_until_eos

Randomise = Callable[[torch.nn.Module, int], None]
CFG = ModelConfig(V=29, T=16, C=16, L=2, H=2, d_ff=24, dropout=0.0, rope_theta=90.0)


def _model(device: torch.device, randomise: Randomise, dtype: torch.dtype, seed: int) -> GPT:
    model = GPT(CFG)
    randomise(model, seed)
    return model.to(device=device, dtype=dtype).eval()


def _prompt(B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.V, (B, t), generator=gen).to(device)  # (B, t)


@pytest.mark.invariant("kv_cache.float32_sampling")
@pytest.mark.parametrize("temperature", [1e-4, 1e-3, 0.7])
def test_a_float16_model_samples_at_any_temperature(
    device: torch.device, randomise: Randomise, temperature: float
) -> None:
    """The old division in float16 made inf logits and NaN probabilities at 1e-4."""
    model = _model(device, randomise, torch.float16, 3)
    prompt = _prompt(3, 4, 1, device)  # (3, 4)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = cast(
        torch.Tensor, generate(model, prompt, 9, temperature=temperature, top_p=0.9, generator=gen)
    )
    assert ids.shape == (3, 13) and bool(((ids >= 0) & (ids < CFG.V)).all())
    if temperature <= 1e-3:  # all the mass on the argmax: the first new token is greedy's
        greedy = cast(torch.Tensor, generate(model, prompt, 9, temperature=0))
        assert torch.equal(ids[:, 4], greedy[:, 4])


@pytest.mark.invariant("kv_cache.float32_sampling")
def test_float16_logits_that_would_overflow_still_sample(
    device: torch.device, randomise: Randomise
) -> None:
    """2.4: logits of some tens, divided by 1e-4, pass float16's largest finite value."""
    model = GPT(CFG)
    randomise(model, 3)
    with torch.no_grad():
        model.ln_f.weight.mul_(10.0)
    model = model.to(device=device, dtype=torch.float16).eval()
    prompt = _prompt(3, 4, 1, device)  # (3, 4)
    with torch.no_grad():
        assert model(prompt).abs().max() * 1e4 > torch.finfo(torch.float16).max
    gen = torch.Generator(device=device).manual_seed(0)
    ids = cast(torch.Tensor, generate(model, prompt, 9, temperature=1e-4, generator=gen))
    greedy = cast(torch.Tensor, generate(model, prompt, 9, temperature=0))
    assert ids.shape == (3, 13) and torch.equal(ids[:, 4], greedy[:, 4])


@pytest.mark.invariant("kv_cache.float32_sampling")
def test_the_draw_is_from_float32_probabilities(
    device: torch.device, randomise: Randomise, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spy on the draw: a bfloat16 model's probabilities reach multinomial in float32."""
    model = _model(device, randomise, torch.bfloat16, 4)
    seen = kit.watch_draw_dtypes(monkeypatch)
    generate(model, _prompt(2, 3, 2, device), 4, temperature=0.01, top_k=5)
    assert seen and set(seen) == {torch.float32}


def _reference(ids: torch.Tensor, t: int, eos: int) -> tuple[torch.Tensor, list[int]]:
    """HF's shape from a full-width run: the rows' lengths and the columns actually run."""
    lengths = []
    for row in ids.tolist():
        new = row[t:]
        lengths.append(t + (new.index(eos) + 1 if eos in new else len(new)))
    return ids[:, : max(lengths)], lengths


@pytest.mark.invariant("kv_cache.hf_stop")
@settings(max_examples=12)
@given(B=st.integers(1, 4), t=st.integers(1, 5), seed=st.integers(0, 2**16), eos=st.integers(0, 3))
def test_until_eos_stops_when_every_row_has_and_gives_each_rows_length(
    device: torch.device, randomise: Randomise, B: int, t: int, seed: int, eos: int
) -> None:
    model = _model(device, randomise, torch.float32, 5)
    prompt = _prompt(B, t, seed, device)
    new = CFG.T - t

    def run(fn: Callable[..., object]) -> object:
        gen = torch.Generator(device=device).manual_seed(seed)
        return fn(model, prompt, new, temperature=1.3, eos_id=eos, generator=gen)

    full = cast(torch.Tensor, run(generate))  # (B, t + new), eos-padded, today's shape
    ids, lengths = cast(tuple[torch.Tensor, torch.Tensor], run(generate_until_eos))
    want_ids, want_lengths = _reference(full, t, eos)
    assert torch.equal(ids, want_ids) and lengths.tolist() == want_lengths
    assert lengths.dtype == torch.int64 and lengths.device == prompt.device
    for b, n in enumerate(want_lengths):  # eos after each row's end, as generate pads it
        assert bool((ids[b, n:] == eos).all())


@pytest.mark.invariant("kv_cache.hf_stop")
def test_until_eos_edges(device: torch.device, randomise: Randomise) -> None:
    model = _model(device, randomise, torch.float32, 6)
    prompt = _prompt(2, 3, 0, device)
    ids, lengths = generate_until_eos(model, prompt, 0, eos_id=1)
    assert torch.equal(ids, prompt) and lengths.tolist() == [3, 3]
    with pytest.raises(InputError):
        generate_until_eos(model, prompt, 2, eos_id=CFG.V)
    with pytest.raises(InputError):
        generate_until_eos(model, prompt, 2, eos_id=None)  # type: ignore[arg-type]
