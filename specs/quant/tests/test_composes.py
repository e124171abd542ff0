"""Acceptance tests: a quantized model under the other stages (stage quant).

Each stage's own promise is the reference, taken on the quantized model
itself: cached chunks equal the uncached forward (within bfloat16's bound for
a float32 model since 3.0: its int8 layers compute in bfloat16 activations on
a CPU), greedy generation equals an argmax loop over the forward, the fast
path equals the explicit path, a padded row equals the row alone. Under
autocast the quantized model must stay within the derived mixed-precision
bound of its own float64 forward (conftest's ``mixed_close``: 8 rounding
stages a layer and the head).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, generate, use_kv_cache
from niels_gpt.model.padding import generate as padded_generate
from niels_gpt.model.padding import padded_forward
from niels_gpt.model.quant import Int8Linear, quantize_int8

Tol = Callable[[torch.dtype], dict[str, float]]
CFG = ModelConfig(V=53, T=40, C=32, L=2, H=4, d_ff=48, dropout=0.0)


def _quantized(device: torch.device, dtype: torch.dtype = torch.float64, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CFG).to(device=device, dtype=dtype).eval()
    quantize_int8(model)
    return model


@pytest.mark.invariant("quant.composes")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fast", [False, True])
def test_cached_chunks_equal_the_uncached_forward(
    device: torch.device,
    tol: Tol,
    mixed_close: Callable[..., None],
    dtype: torch.dtype,
    fast: bool,
) -> None:
    model = _quantized(device, dtype)
    if fast:
        use_fast_attention(model)
    ids = torch.randint(0, CFG.V, (2, CFG.T), device=device)  # (2, T)
    with torch.no_grad():
        full = model(ids)  # (2, T, V)
        caches = use_kv_cache(model, 2)
        assert all(c.keys.dtype == dtype for c in caches)  # the stand-in weight's dtype
        parts = [model(ids[:, p : p + 3]) for p in range(0, CFG.T, 3)]
        drop_kv_cache(model)
    if dtype == torch.float64:
        torch.testing.assert_close(torch.cat(parts, dim=1), full, **tol(dtype))
        return
    # 3.0: float32 int8 layers compute in bfloat16 activations on a CPU; two results of the
    # same bound differ by at most twice it (8 stages a layer and the head, n = T)
    mixed_close(
        torch.cat(parts, dim=1), full.double(), dtype=torch.bfloat16,
        stages=2 * (8 * CFG.L + 1), reduction=CFG.T,
    )  # fmt: skip


@pytest.mark.invariant("quant.composes")
def test_greedy_generate_is_the_argmax_loop_and_the_fast_path_agrees(device: torch.device) -> None:
    model = _quantized(device)
    prompt = torch.randint(0, CFG.V, (2, 7), device=device)  # (2, 7)
    ids = prompt
    with torch.no_grad():
        for _ in range(20):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)  # (2, +1)
    out = generate(model, prompt, 20, temperature=0)
    assert torch.equal(out, ids)
    fast = use_fast_attention(copy.deepcopy(model))
    assert torch.equal(generate(fast, prompt, 20, temperature=0), ids)
    assert sum(isinstance(m, Int8Linear) for m in fast.modules()) == 5 * CFG.L


@pytest.mark.invariant("quant.composes")
def test_a_padded_row_is_the_row_alone(device: torch.device, tol: Tol) -> None:
    model = _quantized(device)
    row = torch.randint(0, CFG.V, (1, 9), device=device)  # (1, 9)
    ids = torch.cat([torch.zeros(1, 4, dtype=torch.int64, device=device), row], dim=1)  # (1, 13)
    mask = torch.ones_like(ids, dtype=torch.bool)  # (1, 13)
    mask[:, :4] = False
    with torch.no_grad():
        padded = padded_forward(model, ids, mask)  # (1, 13, V)
        alone = model(row)  # (1, 9, V)
    torch.testing.assert_close(padded[:, 4:], alone, **tol(torch.float64))
    out = padded_generate(model, ids, mask, 10, temperature=0)  # (1, 23)
    assert torch.equal(out[:, 4:], generate(model, row, 10, temperature=0))


@pytest.mark.invariant("quant.composes")
def test_autocast_runs_the_layers_in_its_dtype(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: Callable[..., None],
) -> None:
    model = _quantized(device, torch.float32)
    exact = copy.deepcopy(model).to(torch.float64)  # the same codes, float64 scales
    ids = torch.randint(0, CFG.V, (2, CFG.T), device=device)  # (2, T)
    seen: list[torch.dtype] = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
        for m in model.modules()
        if isinstance(m, Int8Linear)
    ]
    with torch.no_grad():
        want = exact(ids)  # (2, T, V) float64
        for dtype in autocast_dtypes:
            seen.clear()
            with torch.autocast(device.type, dtype=dtype):
                got = model(ids)  # (2, T, V)
            assert seen and set(seen) == {dtype}
            mixed_close(got, want, dtype=dtype, stages=8 * CFG.L + 1, reduction=CFG.T)
    for h in hooks:
        h.remove()
