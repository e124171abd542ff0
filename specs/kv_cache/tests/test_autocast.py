"""Acceptance test of the cached forward under autocast (stage kv_cache).

Under ``torch.autocast`` the cached steps must stay within a bound derived
from the autocast dtype alone: of the exact (float64) logits, and of the
no-cache forward under the same autocast.

Derivation (the error model of the earlier stages' mixed-precision tests).
Rounding to a floating dtype moves a value by at most u = eps / 2 of its size,
eps = torch.finfo(dtype).eps. A matmul under autocast rounds both operands to
the 16-bit dtype (2u), accumulates its length-n reduction in float32 (at most
n * u32 of the summed terms, u32 = 2**-24) and rounds the result (u): one
stage costs at most 3u + n * u32 of the size of its terms, and an elementwise
op done in the 16-bit dtype (one rounding) costs less than a stage. What runs
in float32 under autocast (the residual stream, the norms, RoPE, softmax) adds
nothing at this order. A GPT v1 layer has 8 stages: qkv, the scores,
probabilities @ v, the output projection, w_a and w_g (side by side, one
stage), silu, the gate product, and w_o; the tied head is one more. With
default-initialised weights no stage amplifies an error and first-order errors
add, so a forward is within rtol * (|exact| + max |exact|) of the exact logits,
rtol = (8 L + 1) * (3u + n * u32), n the longest reduction (max of C, d_ff and
T). Two results each within that of the exact value are within twice that of
each other. For bfloat16, L = 2 and n = 48: rtol = 17 * (3 * 2**-8 + 48 * 2**-24),
about 0.2.

The bound is a worst case, loose enough that small math errors (a RoPE offset,
a wrong scale) hide under it: the float32 and float64 tests catch those. This
test pins that the cached path runs under autocast, with the dtypes autocast
gives, and does not leave the bound (a cache read or mask gone wrong does).
"""

from __future__ import annotations

import copy

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, use_kv_cache

# Autocast dtypes by device type: bfloat16 on the CPU (the case).
AUTOCAST = {
    "cpu": (torch.bfloat16,),
    "cuda": (torch.float16, torch.bfloat16),
    "mps": (torch.float16,),
}
U32 = torch.finfo(torch.float32).eps / 2


def derived_rtol(dtype: torch.dtype, *, stages: int, reduction: int) -> float:
    """``stages * (3u + reduction * u32)`` with ``u = eps / 2`` of ``dtype`` (see above)."""
    u = torch.finfo(dtype).eps / 2
    return stages * (3 * u + reduction * U32)


def _assert_within(got: torch.Tensor, ref: torch.Tensor, rtol: float, what: str) -> None:
    """``|got - ref| <= rtol * (|ref| + max |ref|)`` everywhere, compared in float64 on the CPU."""
    got64, ref64 = got.detach().double().cpu(), ref.detach().double().cpu()
    bound = rtol * (ref64.abs() + ref64.abs().max())  # (B, T, V)
    diff = (got64 - ref64).abs()  # (B, T, V)
    bad = ~(diff <= bound)  # NaN counts as bad
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {bad.numel()} logits beyond the derived bound "
        f"(rtol {rtol:.3g}); worst excess {float((diff - bound).max()):.3g}"
    )


@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
@pytest.mark.parametrize("fast", [False, True])
def test_steps_under_autocast_stay_within_the_derived_bound(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], fast: bool
) -> None:
    cfg = ModelConfig(V=61, T=20, C=32, L=2, H=4, d_ff=48, dropout=0.0, rope_theta=300.0)
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()  # default init: no stage amplifies an error
    if fast:
        use_fast_attention(model)
    exact_model = copy.deepcopy(model).to(float_dtypes[-1])  # float64 where the device has it
    x = torch.randint(0, cfg.V, (2, cfg.T), generator=torch.Generator().manual_seed(1))
    x = x.to(device)  # (B, T)
    with torch.no_grad():
        exact = exact_model(x)  # (B, T, V)
    stages, reduction = 8 * cfg.L + 1, max(cfg.C, cfg.d_ff, cfg.T)
    for dtype in AUTOCAST[device.type]:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            full = model(x)  # (B, T, V), no cache
            use_kv_cache(model, 2)
            steps = [model(x[:, :6])]  # (B, 6, V): the prefill
            steps += [model(x[:, i : i + 1]) for i in range(6, cfg.T)]  # (B, 1, V) each
            drop_kv_cache(model)
        assert all(s.dtype == full.dtype for s in steps)
        got = torch.cat(steps, dim=1)  # (B, T, V)
        rtol = derived_rtol(dtype, stages=stages, reduction=reduction)
        _assert_within(got, exact, rtol, f"{dtype} autocast against the exact logits")
        _assert_within(got, full, 2 * rtol, f"{dtype} autocast against the no-cache forward")
