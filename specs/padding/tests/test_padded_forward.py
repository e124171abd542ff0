"""Acceptance tests of ``padded_forward`` (stage padding).

Two references for every padded row: the same row alone, without padding,
through the model's own ``forward`` and ``forward_with_attn_trace`` (the
backbone's code, not this stage's), and a float64 GPT v1 written here from
its formulas (RMSNorm, fused QKV, RoPE as complex rotations from position 0,
causal softmax attention, SwiGLU, tied head), which calls no model code at
all: it reads the weights and the RoPE tables. A batch is left-padded: row b
has ``pads[b]`` leading pads, then its real tokens; a row may be all padding.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import use_kv_cache
from niels_gpt.model.padding import padded_forward

_SPEC = importlib.util.spec_from_file_location("padding_kit", Path(__file__).with_name("_kit.py"))
assert _SPEC is not None and _SPEC.loader is not None
kit = importlib.util.module_from_spec(_SPEC)  # the stage's shared builders (_kit.py)
_SPEC.loader.exec_module(kit)


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, 40)),
        T=draw(st.integers(2, 14)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


@st.composite
def padded_shapes(draw: st.DrawFn, T: int) -> tuple[int, list[int]]:
    """(t, pads): a padded width and each row's pads; pads[b] == t is an all-padding row."""
    B = draw(st.integers(1, 4))
    t = draw(st.integers(1, T))
    return t, draw(st.lists(st.integers(0, t), min_size=B, max_size=B))


# --- a reference from the formulas ------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight  # (..., C)


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """(H, n, D) at positions 0..n-1: pair (2i, 2i+1) as a complex number times cos + i sin.

    sin, cos: (n, D/2), the module's table rows. A model's tables are built in
    float32 (and only cast by ``.to(float64)``), so the reference takes their
    values rather than recomputing the angles: the formula is the rotation.
    """
    H, n, D = x.shape
    z = torch.view_as_complex(x.reshape(H, n, D // 2, 2).contiguous())  # (H, n, D/2)
    return torch.view_as_real(z * torch.complex(cos, sin)).reshape(H, n, D)  # (H, n, D)


def reference_row(model: GPT, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A GPT v1 on one unpadded row, in float64 on the CPU, from the formulas.

    Returns the (n, V) logits and, per layer, the (H, n, n) attention probabilities.
    """
    cfg = model.cfg
    H, D, eps = cfg.H, cfg.C // cfg.H, 1e-5
    w = {k: v.detach().to("cpu", torch.float64) for k, v in model.state_dict().items()}
    w_sin = {
        f"blocks.{i}.": b.attn.rope_sin.to("cpu", torch.float64) for i, b in enumerate(model.blocks)
    }
    w_cos = {
        f"blocks.{i}.": b.attn.rope_cos.to("cpu", torch.float64) for i, b in enumerate(model.blocks)
    }
    n = len(tokens)
    emb = w["tok_emb.weight"]  # (V, C)
    x = emb[torch.tensor(tokens)]  # (n, C)
    causal = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    probs_by_layer = []
    for i in range(cfg.L):
        p = f"blocks.{i}."
        a = _rms(x, w[p + "ln1.weight"], eps)  # (n, C)
        q, k, v = (a @ w[p + "attn.qkv.weight"].T).split(cfg.C, dim=-1)  # (n, C) each
        q, k, v = (z.reshape(n, H, D).transpose(0, 1) for z in (q, k, v))  # (H, n, D) each
        sin, cos = w_sin[p][0, 0, :n], w_cos[p][0, 0, :n]  # (n, D/2) each
        q, k = _rotate(q, sin, cos), _rotate(k, sin, cos)  # (H, n, D) each
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (H, n, n)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)  # (H, n, n)
        probs_by_layer.append(probs)
        out = (probs @ v).transpose(0, 1).reshape(n, cfg.C)  # (n, C)
        x = x + out @ w[p + "attn.proj.weight"].T  # (n, C)
        m = _rms(x, w[p + "ln2.weight"], eps)  # (n, C)
        gate = m @ w[p + "mlp.w_g.weight"].T + w[p + "mlp.w_g.bias"]  # (n, F)
        lin = m @ w[p + "mlp.w_a.weight"].T + w[p + "mlp.w_a.bias"]  # (n, F)
        x = x + (torch.nn.functional.silu(gate) * lin) @ w[p + "mlp.w_o.weight"].T
        x = x + w[p + "mlp.w_o.bias"]  # (n, C)
    logits = _rms(x, w["ln_f.weight"], eps) @ emb.T  # (n, V), the tied head
    return logits, probs_by_layer


@pytest.mark.invariant("padding.padding_invariance")
@pytest.mark.invariant("padding.masked_probabilities")
@pytest.mark.parametrize("fast", [False, True])
def test_padded_batch_matches_a_reference_from_the_formulas(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=27, T=11, C=24, L=3, H=3, d_ff=20, dropout=0.0, rope_theta=123.0)
    pads, t = [0, 4, 11, 10, 7], cfg.T  # unpadded, padded, all padding, one token, padded
    dtype = float_dtypes[-1]  # float64 where the device has it
    model = kit.model(cfg, device, dtype, randomise, 17, fast)
    ids = kit.tokens(cfg, len(pads), t, 4, device)  # (B, t)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, kit.mask(pads, t, device), trace_layer=2)
    full = trace["attn_full"]
    assert full is not None
    for b, p in enumerate(pads):
        assert not logits[b, :p].any() and not full[b, :, :p].any() and not full[b, :, :, :p].any()
        if p == t:
            continue
        want_logits, want_probs = reference_row(model, ids[b, p:].tolist())
        torch.testing.assert_close(logits[b, p:].cpu().double(), want_logits, **tol(dtype))
        got_probs = full[b, :, p:, p:].cpu().double()  # (H, t - p, t - p)
        torch.testing.assert_close(got_probs, want_probs[2], **tol(dtype))


# --- padding invariance ---------------------------------------------------------


@pytest.mark.invariant("padding.padding_invariance")
@settings(max_examples=15)
@given(cfg=configs(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_real_positions_match_the_row_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    t, pads = data.draw(padded_shapes(cfg.T))
    model = kit.model(cfg, device, dtype, randomise, seed, fast)
    ids = kit.tokens(cfg, len(pads), t, seed, device)  # (B, t), pads hold random ids
    mask = kit.mask(pads, t, device)
    with torch.no_grad():
        logits = padded_forward(model, ids, mask)  # (B, t, V)
        assert isinstance(logits, torch.Tensor)
        assert logits.shape == (len(pads), t, cfg.V) and logits.dtype == dtype
        for b, p in enumerate(pads):
            assert not logits[b, :p].any(), "padded positions must hold exactly 0"
            if p < t:
                alone = model(ids[b : b + 1, p:])  # (1, t - p, V)
                torch.testing.assert_close(logits[b, p:], alone[0], **tol(dtype))
        other_pads = torch.where(mask, ids, kit.tokens(cfg, len(pads), t, seed + 1, device))
        again = padded_forward(model, other_pads, mask)  # the pad ids changed, nothing else
        torch.testing.assert_close(again, logits, **tol(dtype))


@pytest.mark.invariant("padding.padding_invariance")
@pytest.mark.parametrize("fast", [False, True])
def test_any_amount_of_padding_gives_the_same_logits(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    # One real row of 3 tokens, left-padded to every width from 3 to T with random
    # pad ids, beside an unpadded row of that width.
    cfg = ModelConfig(V=29, T=11, C=24, L=2, H=3, d_ff=20, dropout=0.0, rope_theta=71.0)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 5, fast)
        real = kit.tokens(cfg, 1, 3, 1, device)  # (1, 3)
        with torch.no_grad():
            alone = model(real)[0]  # (3, V)
        for width in range(3, cfg.T + 1):
            ids = kit.tokens(cfg, 2, width, width, device)  # (2, width): pad ids and a full row
            ids[0, width - 3 :] = real[0]
            with torch.no_grad():
                logits = padded_forward(model, ids, kit.mask([width - 3, 0], width, device))
                full_row = model(ids[1:])[0]  # (width, V)
            assert isinstance(logits, torch.Tensor)
            torch.testing.assert_close(logits[0, width - 3 :], alone, **tol(dtype))
            assert not logits[0, : width - 3].any()
            torch.testing.assert_close(logits[1], full_row, **tol(dtype))


# --- probabilities --------------------------------------------------------------


@pytest.mark.invariant("padding.masked_probabilities")
@settings(max_examples=12)
@given(cfg=configs(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_trace_masks_padding_exactly(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    t, pads = data.draw(padded_shapes(cfg.T))
    B = len(pads)
    model = kit.model(cfg, device, dtype, randomise, seed, fast)
    ids = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    mask = kit.mask(pads, t, device)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, mask, trace_layer=layer)
        plain = padded_forward(model, ids, mask)
    full = trace["attn_full"]  # (B, H, t, t)
    assert trace["layer"] == layer
    assert full is not None and full.shape == (B, cfg.H, t, t) and full.dtype == dtype
    assert torch.equal(trace["attn_row"], full[:, :, -1])
    assert torch.isfinite(full).all() and torch.isfinite(logits).all()
    torch.testing.assert_close(logits, plain, **tol(dtype))  # tracing changes no logits
    for b, p in enumerate(pads):
        assert not full[b, :, :, :p].any(), "a padded key got probability"
        assert not full[b, :, :p, :].any(), "a padded query's row is not all zero"
        if p == t:
            continue
        ones = torch.ones(cfg.H, t - p, dtype=dtype, device=device)
        torch.testing.assert_close(full[b, :, p:].sum(-1), ones, **tol(dtype))
        with torch.no_grad():
            _, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], layer, True)
        assert ref["attn_full"] is not None
        torch.testing.assert_close(full[b, :, p:, p:], ref["attn_full"][0], **tol(dtype))


@pytest.mark.invariant("padding.masked_probabilities")
@pytest.mark.invariant("padding.output_contract")
@pytest.mark.parametrize("fast", [False, True])
def test_a_batch_of_nothing_but_padding_gives_zeros(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=13, T=6, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 3, fast)
        ids = kit.tokens(cfg, 2, 5, 1, device)  # (2, 5)
        mask = torch.zeros(2, 5, dtype=torch.bool, device=device)  # (2, 5), no real token
        logits, trace = padded_forward(model, ids, mask, trace_layer=0)
        assert logits.shape == (2, 5, cfg.V) and not logits.any()
        full = trace["attn_full"]
        assert full is not None and full.shape == (2, cfg.H, 5, 5) and not full.any()
        assert trace["attn_row"].shape == (2, cfg.H, 5) and not trace["attn_row"].any()
        logits.sum().backward()  # nothing to learn from, and nothing NaN
        for name, param in model.named_parameters():
            assert param.grad is None or not param.grad.any(), name


# --- causality ------------------------------------------------------------------------


@pytest.mark.invariant("padding.causal_within_row")
@pytest.mark.parametrize("fast", [False, True])
def test_a_real_token_changes_nothing_before_it_or_in_other_rows(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=31, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=40.0)
    pads = [3, 0, 6, 10]
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 7, fast)
        ids = kit.tokens(cfg, 4, cfg.T, 3, device)  # (4, T)
        mask = kit.mask(pads, cfg.T, device)
        with torch.no_grad():
            base = padded_forward(model, ids, mask)  # (4, T, V)
            assert isinstance(base, torch.Tensor)
            for b, p in enumerate(pads):
                others = [r for r in range(4) if r != b]
                for j in range(cfg.T):
                    changed = ids.clone()
                    changed[b, j] = (changed[b, j] + 1) % cfg.V
                    out = padded_forward(model, changed, mask)  # (4, T, V)
                    assert isinstance(out, torch.Tensor)
                    torch.testing.assert_close(out[others], base[others], **tol(dtype))
                    if j < p:  # a pad: nothing at all changes
                        torch.testing.assert_close(out[b], base[b], **tol(dtype))
                        continue
                    torch.testing.assert_close(out[b, :j], base[b, :j], **tol(dtype))
                    assert not torch.allclose(out[b, j], base[b, j]), "the token itself must count"


# --- no mask: the model itself ---------------------------------------------------------


@pytest.mark.invariant("padding.unpadded_exact")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_no_padding_is_the_models_own_forward_bit_for_bit(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    fast: bool,
    training: bool,
) -> None:
    cfg = ModelConfig(V=37, T=12, C=24, L=3, H=3, d_ff=20, dropout=0.2, rope_theta=300.0)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 9, fast).train(training)
        ids = kit.tokens(cfg, 3, 9, 4, device)  # (3, 9)
        for mask in (None, torch.ones(3, 9, dtype=torch.bool, device=device)):
            torch.manual_seed(11)
            got = padded_forward(model, ids, mask)
            torch.manual_seed(11)
            want = model(ids)
            assert isinstance(got, torch.Tensor) and torch.equal(got, want)
            torch.manual_seed(12)
            got_logits, got_trace = padded_forward(model, ids, mask, trace_layer=1)
            torch.manual_seed(12)
            want_logits, want_trace = model.forward_with_attn_trace(ids, 1, return_full_attn=True)
            assert torch.equal(got_logits, want_logits)
            assert got_trace["layer"] == 1
            assert torch.equal(got_trace["attn_row"], want_trace["attn_row"])
            assert got_trace["attn_full"] is not None and want_trace["attn_full"] is not None
            assert torch.equal(got_trace["attn_full"], want_trace["attn_full"])


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
def test_gradients_are_finite_and_those_of_the_rows_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=23, T=9, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=90.0)
    pads = [0, 4, 8, 9, 2]  # row 2 has a single real token, row 3 none
    B, t = len(pads), cfg.T
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 13, fast)
        ids = kit.tokens(cfg, B, t, 6, device)  # (B, t)
        gen = torch.Generator().manual_seed(2)
        g = torch.randn(B, t, cfg.V, generator=gen, dtype=dtype).to(device)  # (B, t, V)
        g2 = torch.randn(B, cfg.H, t, t, generator=gen, dtype=dtype).to(device)  # (B, H, t, t)
        model.zero_grad()
        logits, trace = padded_forward(model, ids, kit.mask(pads, t, device), trace_layer=1)
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
        _assert_grads_close(got, _grads(model), tol(dtype))


@pytest.mark.invariant("padding.finite_gradients")
@settings(max_examples=8)
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_gradients_of_any_padded_batch_are_the_rows_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]
    t, pads = data.draw(padded_shapes(cfg.T))
    model = kit.model(cfg, device, dtype, randomise, seed)
    ids = kit.tokens(cfg, len(pads), t, seed, device)  # (B, t)
    g = torch.randn(len(pads), t, cfg.V, generator=torch.Generator().manual_seed(seed))
    g = g.to(device, dtype)  # (B, t, V)
    logits = padded_forward(model, ids, kit.mask(pads, t, device))
    assert isinstance(logits, torch.Tensor)
    (logits * g).sum().backward()
    got = _grads(model)
    model.zero_grad()
    for b, p in enumerate(pads):
        if p < t:
            (model(ids[b : b + 1, p:])[0] * g[b, p:]).sum().backward()
    for name, grad in got.items():
        assert torch.isfinite(grad).all(), name
    _assert_grads_close(got, _grads(model), tol(dtype))


# --- training mode ------------------------------------------------------------------------


def _set_rates(model: GPT, emb: float, attn: float, resid: float, block: float) -> None:
    model.drop.p = emb
    for blk in model.blocks:
        blk.attn.attn_dropout.p = attn
        blk.attn.resid_dropout.p = resid
        blk.dropout.p = block


@pytest.mark.invariant("padding.dropout_in_training")
@pytest.mark.parametrize("fast", [False, True])
def test_training_mode_applies_every_dropout_of_the_model(
    device: torch.device, tol: kit.Tol, randomise: kit.Randomise, fast: bool
) -> None:
    # cfg.dropout is 0: only the rates set on the modules at call time can drop anything.
    cfg = ModelConfig(V=19, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 4, fast)
    ids = kit.tokens(cfg, 3, 10, 8, device)  # (3, 10)
    mask = kit.mask([0, 4, 7], 10, device)

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
    torch.testing.assert_close(trace["attn_full"], plain_trace["attn_full"], **tol(torch.float32))


@pytest.mark.invariant("padding.dropout_in_training")
@pytest.mark.parametrize("which", [1, 2])
def test_a_dropout_rate_of_one_is_applied_where_the_model_applies_it(
    device: torch.device, tol: kit.Tol, randomise: kit.Randomise, which: int
) -> None:
    # Rate 1 drops everything, which is deterministic: attention dropout (which=1)
    # or residual dropout (which=2) at 1 zeroes every attention branch, so the
    # padded rows must equal the rows alone through the model in the same state.
    cfg = ModelConfig(V=19, T=9, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 8)
    rates = [0.0, 0.0, 0.0, 0.0]
    rates[which] = 1.0
    _set_rates(model, *rates)
    model.train()
    pads = [0, 3, 8]
    ids = kit.tokens(cfg, 3, cfg.T, 2, device)  # (3, T)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, kit.mask(pads, cfg.T, device), trace_layer=1)
        for b, p in enumerate(pads):
            alone, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], 1, True)
            torch.testing.assert_close(logits[b, p:], alone[0], **tol(torch.float32))
            assert ref["attn_full"] is not None  # taken before dropout: not all zero
            torch.testing.assert_close(
                trace["attn_full"][b, :, p:, p:], ref["attn_full"][0], **tol(torch.float32)
            )


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


# --- the output ----------------------------------------------------------------------------------


@pytest.mark.invariant("padding.output_contract")
@pytest.mark.parametrize("fast", [False, True])
def test_output_shapes_and_dtypes_are_the_explicit_paths(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=17, T=8, C=16, L=2, H=4, d_ff=12, dropout=0.1)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 2, fast)
        ids = kit.tokens(cfg, 3, 7, 5, device)  # (3, 7)
        mask = kit.mask([2, 0, 6], 7, device)
        with torch.no_grad():
            _, explicit = model.forward_with_attn_trace(ids, 0, return_full_attn=True)
            logits = padded_forward(model, ids, mask)
            traced, trace = padded_forward(model, ids, mask, trace_layer=1)
        assert isinstance(logits, torch.Tensor)
        assert logits.shape == traced.shape == (3, 7, cfg.V)
        assert logits.dtype == traced.dtype == dtype and logits.device == ids.device
        assert set(trace) == {"layer", "attn_row", "attn_full"} and trace["layer"] == 1
        full = trace["attn_full"]
        assert explicit["attn_full"] is not None and full is not None
        assert full.shape == (3, cfg.H, 7, 7) and full.dtype == explicit["attn_full"].dtype
        assert trace["attn_row"].shape == (3, cfg.H, 7) and full.device == ids.device


# --- the model afterwards -----------------------------------------------------------------------


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_padded_forward_hands_the_model_back_as_it_was(
    device: torch.device, randomise: kit.Randomise, fast: bool, training: bool
) -> None:
    cfg = ModelConfig(V=21, T=8, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = kit.model(cfg, device, torch.float32, randomise, 6, fast).train(training)
    before = kit.state(model)
    ids = kit.tokens(cfg, 2, 8, 1, device)  # (2, 8)
    logits = padded_forward(model, ids, kit.mask([3, 0], 8, device), trace_layer=1)[0]
    logits.sum().backward()
    kit.assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is (sdpa_kernel if fast else None) for b in model.blocks)
    model.zero_grad()
    with torch.no_grad():
        padded_forward(model, ids, kit.mask([0, 5], 8, device))
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
def test_padded_forward_restores_the_model_when_a_layer_fails(
    device: torch.device, randomise: kit.Randomise, fast: bool
) -> None:
    cfg = ModelConfig(V=21, T=8, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 6, fast)
    before = kit.state(model)

    def fail(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        raise RuntimeError("injected failure")

    handle = model.blocks[1].register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            padded_forward(model, kit.tokens(cfg, 2, 6, 1, device), kit.mask([2, 0], 6, device))
    finally:
        handle.remove()
    kit.assert_same_state(model, before)


# --- bad input ---------------------------------------------------------------------------------

BAD_CFG = ModelConfig(V=11, T=8, C=8, L=2, H=2, d_ff=8, dropout=0.0)


def _bad_calls(device: torch.device) -> dict[str, tuple[Any, Any, dict[str, Any], list[str]]]:
    """name -> (ids, mask, keywords, strings the message must hold)."""
    ids = kit.tokens(BAD_CFG, 2, 5, 0, device)  # (2, 5)
    mask = kit.mask([2, 0], 5, device)  # (2, 5)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    right = mask.flip(-1)  # (2, 5): real tokens first, pads after
    hole = mask.clone()
    hole[1, 2] = False  # a pad between real tokens
    return {
        "mask-int64": (ids, mask.long(), {}, ["torch.bool", "torch.int64"]),
        "mask-float": (ids, mask.float(), {}, ["torch.bool", "torch.float32"]),
        "mask-uint8": (ids, mask.to(torch.uint8), {}, ["torch.bool", "torch.uint8"]),
        "mask-list": (ids, mask.tolist(), {}, []),
        "mask-shorter": (ids, mask[:, :4], {}, ["(2, 5)", "(2, 4)"]),
        "mask-more-rows": (ids, kit.mask([2, 0, 1], 5, device), {}, ["(2, 5)", "(3, 5)"]),
        "mask-1-d": (ids, mask[1], {}, ["(2, 5)", "(5,)"]),
        "mask-other-device": (ids, mask.to(other), {}, [str(ids.device), str(other)]),
        "mask-right-padded": (ids, right, {}, ["row 0"]),
        "mask-hole": (ids, hole, {}, ["row 1"]),
        "ids-int32": (ids.int(), mask, {}, []),
        "ids-float": (ids.float(), mask, {}, []),
        "ids-1-d": (ids[0], mask[0], {}, []),
        "ids-empty": (ids[:, :0], mask[:, :0], {}, []),
        "ids-other-device": (ids.to(other), mask.to(other), {}, []),
        "pad-id-equal-V": (ids.masked_fill(~mask, BAD_CFG.V), mask, {}, []),
        "real-id-negative": (ids.masked_fill(mask, -1), mask, {}, []),
        "longer-than-T": (
            kit.tokens(BAD_CFG, 2, BAD_CFG.T + 1, 0, device),
            kit.mask([2, 0], BAD_CFG.T + 1, device),
            {},
            [],
        ),
        "trace-layer-L": (ids, mask, {"trace_layer": BAD_CFG.L}, []),
        "trace-layer-negative": (ids, mask, {"trace_layer": -1}, []),
        "trace-layer-bool": (ids, mask, {"trace_layer": True}, []),
        "trace-layer-float": (ids, mask, {"trace_layer": 1.0}, []),
    }


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_padded_forward_rejects_bad_input_before_any_work(
    device: torch.device, randomise: kit.Randomise, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, mask, kwargs, needles = _bad_calls(device)[case]
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    before = kit.state(model)
    writes = kit.watch_attention_writes(monkeypatch)
    forwards: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, a: forwards.append(type(m).__name__))
        for module in (model.blocks[0], model.blocks[0].attn)
    ]
    try:
        with pytest.raises(InputError) as caught:
            padded_forward(model, ids, mask, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    assert forwards == []
    assert writes == []  # no module was switched, not even for a moment
    message = str(caught.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not named in {message!r}"
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_no_hook_is_put_on_the_model_before_the_checks(
    device: torch.device, randomise: kit.Randomise, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.1: a padded call reaches the attention through hooks; bad input gets none of them,
    not even for a moment (the checks come first, not the model's own)."""
    ids, mask, kwargs, _ = _bad_calls(device)[case]
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    hooked: list[str] = []
    real = torch.nn.Module.register_forward_pre_hook

    def spy(module: torch.nn.Module, *args: Any, **kw: Any) -> Any:
        hooked.append(type(module).__name__)
        return real(module, *args, **kw)

    monkeypatch.setattr(torch.nn.Module, "register_forward_pre_hook", spy)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask, **kwargs)
    assert hooked == []


class _OtherAttention(CausalSelfAttention):
    """An attention subclass with a forward of its own: the stage cannot know its math."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().forward(x, **kwargs)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_padded_forward_rejects_models_it_cannot_switch(
    device: torch.device, randomise: kit.Randomise
) -> None:
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    ids = kit.tokens(BAD_CFG, 2, 4, 1, device)  # (2, 4)
    mask = kit.mask([1, 0], 4, device)
    with pytest.raises(InputError):
        padded_forward(model.blocks, ids, mask)  # type: ignore[arg-type]
    model.blocks[1].attn.__class__ = _OtherAttention
    before = kit.state(model)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask)
    kit.assert_same_state(model, before)
    model.blocks[1].attn.__class__ = CausalSelfAttention
    use_kv_cache(model, 2)  # switched for cached generation
    before = kit.state(model)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask)
    kit.assert_same_state(model, before)
