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

import math

import padding_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_forward

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

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
def test_padded_batch_matches_a_reference_from_the_formulas(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=27, T=11, C=24, L=3, H=3, d_ff=20, dropout=0.0, rope_theta=123.0)
    pads, t = [0, 4, 11, 10, 7], cfg.T  # unpadded, padded, all padding, one token, padded
    dtype = rig.widest  # float64 where the device has it
    model = rig.model(cfg, dtype, 17, fast)
    ids = rig.tokens(cfg, len(pads), t, 4)  # (B, t)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, kit.mask(pads, t, rig.device), trace_layer=2)
    full = trace["attn_full"]
    assert full is not None
    for b, p in enumerate(pads):
        assert not logits[b, :p].any() and not full[b, :, :p].any() and not full[b, :, :, :p].any()
        if p == t:
            continue
        want_logits, want_probs = reference_row(model, ids[b, p:].tolist())
        rig.close(logits[b, p:].cpu().double(), want_logits, dtype)
        got_probs = full[b, :, p:, p:].cpu().double()  # (H, t - p, t - p)
        rig.close(got_probs, want_probs[2], dtype)


# --- padding invariance ---------------------------------------------------------


@pytest.mark.invariant("padding.padding_invariance")
@settings(max_examples=15)
@given(case=kit.cases(kit.configs()), data=st.data())
def test_real_positions_match_the_row_alone(
    rig: kit.Rig, case: kit.Case, data: st.DataObject
) -> None:
    cfg, seed, fast = case
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    t, pads = data.draw(kit.padded_shapes(cfg.T))
    model = rig.model(cfg, dtype, seed, fast)
    ids, mask = kit.batch(rig, cfg, pads, t, seed)  # (B, t), pads hold random ids
    with torch.no_grad():
        logits = padded_forward(model, ids, mask)  # (B, t, V)
        assert isinstance(logits, torch.Tensor)
        assert logits.shape == (len(pads), t, cfg.V) and logits.dtype == dtype
        for b, p in enumerate(pads):
            assert not logits[b, :p].any(), "padded positions must hold exactly 0"
            if p < t:
                alone = model(ids[b : b + 1, p:])  # (1, t - p, V)
                rig.close(logits[b, p:], alone[0], dtype)
        other_pads = torch.where(mask, ids, kit.tokens(cfg, len(pads), t, seed + 1, rig.device))
        again = padded_forward(model, other_pads, mask)  # the pad ids changed, nothing else
        rig.close(again, logits, dtype)


@pytest.mark.invariant("padding.padding_invariance")
@pytest.mark.parametrize("fast", [False, True])
def test_any_amount_of_padding_gives_the_same_logits(rig: kit.Rig, fast: bool) -> None:
    # One real row of 3 tokens, left-padded to every width from 3 to T with random
    # pad ids, beside an unpadded row of that width.
    cfg = ModelConfig(V=29, T=11, C=24, L=2, H=3, d_ff=20, dropout=0.0, rope_theta=71.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 5, fast)
        real = rig.tokens(cfg, 1, 3, 1)  # (1, 3)
        with torch.no_grad():
            alone = model(real)[0]  # (3, V)
        for width in range(3, cfg.T + 1):
            ids = rig.tokens(cfg, 2, width, width)  # (2, width): pad ids and a full row
            ids[0, width - 3 :] = real[0]
            with torch.no_grad():
                logits = padded_forward(model, ids, kit.mask([width - 3, 0], width, rig.device))
                full_row = model(ids[1:])[0]  # (width, V)
            assert isinstance(logits, torch.Tensor)
            rig.close(logits[0, width - 3 :], alone, dtype)
            assert not logits[0, : width - 3].any()
            rig.close(logits[1], full_row, dtype)


# --- probabilities --------------------------------------------------------------


@pytest.mark.invariant("padding.masked_probabilities")
@settings(max_examples=12)
@given(case=kit.cases(kit.configs()), data=st.data())
def test_trace_masks_padding_exactly(rig: kit.Rig, case: kit.Case, data: st.DataObject) -> None:
    cfg, seed, fast = case
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    t, pads = data.draw(kit.padded_shapes(cfg.T))
    B = len(pads)
    model = rig.model(cfg, dtype, seed, fast)
    ids, mask = kit.batch(rig, cfg, pads, t, seed)  # (B, t)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, mask, trace_layer=layer)
        plain = padded_forward(model, ids, mask)
    full = trace["attn_full"]  # (B, H, t, t)
    assert trace["layer"] == layer
    assert full is not None and full.shape == (B, cfg.H, t, t) and full.dtype == dtype
    assert torch.equal(trace["attn_row"], full[:, :, -1])
    assert torch.isfinite(full).all() and torch.isfinite(logits).all()
    rig.close(logits, plain, dtype)  # tracing changes no logits
    for b, p in enumerate(pads):
        assert not full[b, :, :, :p].any(), "a padded key got probability"
        assert not full[b, :, :p, :].any(), "a padded query's row is not all zero"
        if p == t:
            continue
        ones = torch.ones(cfg.H, t - p, dtype=dtype, device=rig.device)
        rig.close(full[b, :, p:].sum(-1), ones, dtype)
        with torch.no_grad():
            _, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], layer, True)
        assert ref["attn_full"] is not None
        rig.close(full[b, :, p:, p:], ref["attn_full"][0], dtype)


@pytest.mark.invariant("padding.masked_probabilities")
@pytest.mark.invariant("padding.output_contract")
@pytest.mark.parametrize("fast", [False, True])
def test_a_batch_of_nothing_but_padding_gives_zeros(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=13, T=6, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 3, fast)
        ids = rig.tokens(cfg, 2, 5, 1)  # (2, 5)
        mask = torch.zeros(2, 5, dtype=torch.bool, device=rig.device)  # (2, 5), no real token
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
def test_a_real_token_changes_nothing_before_it_or_in_other_rows(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=31, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=40.0)
    pads = [3, 0, 6, 10]
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 7, fast)
        ids = rig.tokens(cfg, 4, cfg.T, 3)  # (4, T)
        mask = kit.mask(pads, cfg.T, rig.device)
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
                    rig.close(out[others], base[others], dtype)
                    if j < p:  # a pad: nothing at all changes
                        rig.close(out[b], base[b], dtype)
                        continue
                    rig.close(out[b, :j], base[b, :j], dtype)
                    assert not torch.allclose(out[b, j], base[b, j]), "the token itself must count"


# --- no mask: the model itself ---------------------------------------------------------


@pytest.mark.invariant("padding.unpadded_exact")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_no_padding_is_the_models_own_forward_bit_for_bit(
    rig: kit.Rig, fast: bool, training: bool
) -> None:
    cfg = ModelConfig(V=37, T=12, C=24, L=3, H=3, d_ff=20, dropout=0.2, rope_theta=300.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 9, fast).train(training)
        ids = rig.tokens(cfg, 3, 9, 4)  # (3, 9)
        for mask in (None, torch.ones(3, 9, dtype=torch.bool, device=rig.device)):
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
