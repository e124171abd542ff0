"""Acceptance tests of ``padded_forward`` (stage padding): gradients, training mode
and autocast, each padded row against the same row alone.

The references and the forward-value tests are in ``test_padded_forward.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import padding_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_forward

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

# --- gradients --------------------------------------------------------------------------


def _grads(model: GPT) -> dict[str, torch.Tensor]:
    return {
        name: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        for name, p in model.named_parameters()
    }


def _assert_grads_close(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], tolerance: dict[str, float]
) -> None:
    """Every gradient within the dtype's rtol of the size of the pass's largest gradient.

    A gradient element is a sum over tokens of terms that cancel, so its own
    size does not bound its rounding; the largest gradient of the same backward
    pass does (the error model in the root conftest).
    """
    terms = max(g.abs().max().item() for g in want.values())
    for name, grad in got.items():
        torch.testing.assert_close(
            grad, want[name], rtol=tolerance["rtol"], atol=tolerance["rtol"] * terms, msg=name
        )


@pytest.mark.invariant("padding.finite_gradients")
@pytest.mark.parametrize("fast", [False, True])
def test_gradients_are_finite_and_those_of_the_rows_alone(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=23, T=9, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=90.0)
    pads = [0, 4, 8, 9, 2]  # row 2 has a single real token, row 3 none
    B, t = len(pads), cfg.T
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 13, fast)
        ids = rig.tokens(cfg, B, t, 6)  # (B, t)
        gen = torch.Generator().manual_seed(2)
        g = torch.randn(B, t, cfg.V, generator=gen, dtype=dtype).to(rig.device)  # (B, t, V)
        g2 = torch.randn(B, cfg.H, t, t, generator=gen, dtype=dtype).to(rig.device)  # (B, H, t, t)
        model.zero_grad()
        logits, trace = padded_forward(model, ids, kit.mask(pads, t, rig.device), trace_layer=1)
        full = trace["attn_full"]
        assert full is not None
        ((logits * g).sum() + (full * g2).sum()).backward()  # every padded query row included
        got = _grads(model)
        for name, grad in got.items():
            assert torch.isfinite(grad).all(), f"{name}: NaN or inf in the gradient"
        model.zero_grad()
        for b, p in enumerate(pads):
            if p == t:
                continue
            alone, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], 1, True)
            assert ref["attn_full"] is not None
            loss = (alone[0] * g[b, p:]).sum() + (ref["attn_full"][0] * g2[b, :, p:, p:]).sum()
            loss.backward()
        _assert_grads_close(got, _grads(model), rig.tol(dtype))


@pytest.mark.invariant("padding.finite_gradients")
@settings(max_examples=8)
@given(case=kit.cases(kit.configs(), fast=False), data=st.data())
def test_gradients_of_any_padded_batch_are_the_rows_alone(
    rig: kit.Rig, case: kit.Case, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = rig.widest
    t, pads = data.draw(kit.padded_shapes(cfg.T))
    model = rig.model(cfg, dtype, seed)
    ids = rig.tokens(cfg, len(pads), t, seed)  # (B, t)
    g = torch.randn(len(pads), t, cfg.V, generator=torch.Generator().manual_seed(seed))
    g = g.to(rig.device, dtype)  # (B, t, V)
    logits = padded_forward(model, ids, kit.mask(pads, t, rig.device))
    assert isinstance(logits, torch.Tensor)
    (logits * g).sum().backward()
    got = _grads(model)
    model.zero_grad()
    for b, p in enumerate(pads):
        if p < t:
            (model(ids[b : b + 1, p:])[0] * g[b, p:]).sum().backward()
    for name, grad in got.items():
        assert torch.isfinite(grad).all(), name
    _assert_grads_close(got, _grads(model), rig.tol(dtype))


# --- training mode ------------------------------------------------------------------------


def _set_rates(model: GPT, emb: float, attn: float, resid: float, block: float) -> None:
    model.drop.p = emb
    for blk in model.blocks:
        blk.attn.attn_dropout.p = attn
        blk.attn.resid_dropout.p = resid
        blk.dropout.p = block


@pytest.mark.invariant("padding.dropout_in_training")
@pytest.mark.parametrize("fast", [False, True])
def test_training_mode_applies_every_dropout_of_the_model(rig: kit.Rig, fast: bool) -> None:
    # cfg.dropout is 0: only the rates set on the modules at call time can drop anything.
    cfg = ModelConfig(V=19, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 4, fast)
    ids, mask = kit.batch(rig, cfg, [0, 4, 7], 10, 8)  # (3, 10)

    def run(rates: tuple[float, float, float, float], training: bool) -> tuple[torch.Tensor, Any]:
        _set_rates(model, *rates)
        model.train(training)
        torch.manual_seed(0)
        with torch.no_grad():
            return padded_forward(model, ids, mask, trace_layer=0)  # type: ignore[return-value]

    plain, plain_trace = run((0.0, 0.0, 0.0, 0.0), training=False)
    got, _ = run((0.5, 0.5, 0.5, 0.5), training=False)
    torch.testing.assert_close(got, plain, rtol=0, atol=0)  # eval: no dropout at all
    got, _ = run((0.0, 0.0, 0.0, 0.0), training=True)
    torch.testing.assert_close(got, plain, rtol=0, atol=0)
    for i in range(4):  # each dropout alone changes the output
        rates = tuple(0.5 if j == i else 0.0 for j in range(4))
        got, _ = run(rates, training=True)  # type: ignore[arg-type]
        assert torch.isfinite(got).all()
        assert not torch.allclose(got, plain), f"dropout {i} not applied"
        assert not got[1, :4].any() and not got[2, :7].any()  # padded positions stay 0
    # Attention dropout alone: layer 0's probabilities see no dropped value, so the
    # trace (taken before attention dropout) equals the eval-mode one.
    _, trace = run((0.0, 0.5, 0.0, 0.0), training=True)
    rig.close(trace["attn_full"], plain_trace["attn_full"], torch.float32)


@pytest.mark.invariant("padding.dropout_in_training")
@pytest.mark.parametrize("which", [1, 2])
def test_a_dropout_rate_of_one_is_applied_where_the_model_applies_it(
    rig: kit.Rig, which: int
) -> None:
    # Rate 1 drops everything, which is deterministic: attention dropout (which=1)
    # or residual dropout (which=2) at 1 zeroes every attention branch, so the
    # padded rows must equal the rows alone through the model in the same state.
    cfg = ModelConfig(V=19, T=9, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 8)
    rates = [0.0, 0.0, 0.0, 0.0]
    rates[which] = 1.0
    _set_rates(model, *rates)
    model.train()
    pads = [0, 3, 8]
    ids = rig.tokens(cfg, 3, cfg.T, 2)  # (3, T)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, kit.mask(pads, cfg.T, rig.device), trace_layer=1)
        for b, p in enumerate(pads):
            alone, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], 1, True)
            rig.close(logits[b, p:], alone[0], torch.float32)
            assert ref["attn_full"] is not None  # taken before dropout: not all zero
            rig.close(trace["attn_full"][b, :, p:, p:], ref["attn_full"][0], torch.float32)


# --- autocast --------------------------------------------------------------------------------

# Autocast dtypes by device type: bfloat16 on the CPU.
AUTOCAST = {
    "cpu": (torch.bfloat16,),
    "cuda": (torch.float16, torch.bfloat16),
    "mps": (torch.float16,),
}


@pytest.mark.invariant("padding.padding_invariance")
def test_under_autocast_real_positions_stay_within_the_derived_bound(
    device: torch.device, mixed_close: Callable[..., None]
) -> None:
    # Default init (no stage amplifies an error): the root conftest's error model,
    # 8 rounding stages a layer plus the head, n the longest reduction.
    cfg = ModelConfig(V=61, T=16, C=32, L=2, H=4, d_ff=48, dropout=0.0, rope_theta=300.0)
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    exact_model = copy.deepcopy(model).to("cpu", torch.float64)
    pads = [0, 5, 11]
    ids = kit.tokens(cfg, 3, cfg.T, 3, device)  # (3, T)
    mask = kit.mask(pads, cfg.T, device)
    stages, reduction = 8 * cfg.L + 1, max(cfg.C, cfg.d_ff, cfg.T)
    for dtype in AUTOCAST[device.type]:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            logits, trace = padded_forward(model, ids, mask, trace_layer=1)  # (3, T, V)
        full = trace["attn_full"]
        assert full is not None and full.dtype == torch.float32  # as the explicit path
        for b, p in enumerate(pads):
            with torch.no_grad():
                exact = exact_model(ids[b : b + 1, p:].cpu())[0]  # (T - p, V) float64
            mixed_close(logits[b, p:], exact, dtype=dtype, stages=stages, reduction=reduction)
            assert not logits[b, :p].any()
            assert not full[b, :, :, :p].any() and not full[b, :, :p].any()
