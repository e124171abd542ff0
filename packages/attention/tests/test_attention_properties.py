"""Property tests of CausalSelfAttention on the session's device.

The reference below is written independently of the module: explicit loops
over heads and positions, RoPE as a 2x2 rotation per channel pair, softmax
over the visible keys only, all in float64 on the CPU. The one concession to
the module: seed 000 builds the RoPE tables in float32, so the reference
rounds each sin/cos to float32 too (a float64 module upcasts those tables).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

Tol = Callable[[torch.dtype], dict[str, float]]


@st.composite
def configs(draw: st.DrawFn, dropout: float = 0.0) -> ModelConfig:
    H = draw(st.integers(1, 4))
    D = 2 * draw(st.integers(1, 4))
    theta = draw(st.sampled_from([10000.0, 10.0, 500.0, 1e6]))  # rope_theta is read too
    return ModelConfig(
        V=32, T=draw(st.integers(1, 12)), C=H * D, H=H, d_ff=8, dropout=dropout, rope_theta=theta
    )


def _as_float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def reference_attention(
    x: torch.Tensor, w_qkv: torch.Tensor, w_proj: torch.Tensor, H: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """y (B, T, C) and probs (B, H, T, T) of causal RoPE attention, float64, CPU."""
    x, w_qkv, w_proj = (t.detach().to("cpu", torch.float64) for t in (x, w_qkv, w_proj))
    B, T, C = x.shape
    D = C // H
    qkv = x @ w_qkv.T  # (B, T, 3C)
    probs = torch.zeros(B, H, T, T, dtype=torch.float64)
    merged = torch.zeros(B, T, C, dtype=torch.float64)

    def rotate(vec: torch.Tensor, pos: int) -> torch.Tensor:
        out = vec.clone()  # (D,)
        for i in range(D // 2):
            ang = pos * theta ** (-2 * i / D)
            c, s = _as_float32(math.cos(ang)), _as_float32(math.sin(ang))
            a, b = vec[2 * i].item(), vec[2 * i + 1].item()
            out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    for b in range(B):
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            q = [rotate(qkv[b, t, 0 * C :][cols], t) for t in range(T)]
            k = [rotate(qkv[b, t, 1 * C :][cols], t) for t in range(T)]
            v = [qkv[b, t, 2 * C :][cols] for t in range(T)]
            for i in range(T):
                scores = torch.stack([q[i] @ k[j] / math.sqrt(D) for j in range(i + 1)])
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                probs[b, h, i, : i + 1] = weights
                merged[b, i, cols] = sum(weights[j] * v[j] for j in range(i + 1))
    return merged @ w_proj.T, probs


def _module(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalSelfAttention:
    torch.manual_seed(0)
    return CausalSelfAttention(cfg).to(device=device, dtype=dtype).eval()


@pytest.mark.invariant("attention.matches_reference")
@given(cfg=configs(), B=st.integers(1, 2), seed=st.integers(0, 2**16), data=st.data())
def test_matches_float64_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    B: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    T = data.draw(st.integers(1, cfg.T))
    attn = _module(cfg, device, dtype)
    x = torch.randn(B, T, cfg.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    y, probs = attn(x.to(device, dtype), return_attn=True)
    ref_y, ref_probs = reference_attention(
        x.to(dtype), attn.qkv.weight, attn.proj.weight, cfg.H, cfg.rope_theta
    )
    torch.testing.assert_close(probs.cpu(), ref_probs.to(dtype), **tol(dtype))
    torch.testing.assert_close(y.cpu(), ref_y.to(dtype), **tol(dtype))


@pytest.mark.invariant("attention.shape_dtype_device")
@pytest.mark.invariant("attention.causal_probs")
@given(cfg=configs(), B=st.integers(0, 3), data=st.data())
def test_shapes_dtypes_and_probabilities(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    B: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    T = data.draw(st.integers(1, cfg.T))
    attn = _module(cfg, device, dtype)
    x = torch.randn(B, T, cfg.C, device=device, dtype=dtype)  # (B, T, C)
    y, probs = attn(x, return_attn=True)
    assert (y.shape, y.dtype, y.device) == (x.shape, dtype, x.device)
    assert (probs.shape, probs.dtype, probs.device) == ((B, cfg.H, T, T), dtype, x.device)
    assert torch.isfinite(y).all() and torch.isfinite(probs).all()
    above = torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)
    assert torch.all(probs[..., above] == 0)
    ones = torch.ones(B, cfg.H, T, dtype=dtype, device=device)  # (B, H, T)
    torch.testing.assert_close(probs.sum(-1), ones, **tol(dtype))
    assert torch.equal(attn(x), y)


@pytest.mark.invariant("attention.causality")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_future_tokens_never_change_the_past(
    device: torch.device, cfg: ModelConfig, seed: int, data: st.DataObject
) -> None:
    T = data.draw(st.integers(2, max(2, cfg.T)))
    if T > cfg.T:
        return
    i = data.draw(st.integers(0, T - 2))
    attn = _module(cfg, device, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, cfg.C, generator=gen).to(device)  # (B, T, C)
    x_changed = x.clone()
    x_changed[:, i + 1 :] = torch.randn(2, T - i - 1, cfg.C, generator=gen).to(device) * 5
    y, probs = attn(x, return_attn=True)
    y2, probs2 = attn(x_changed, return_attn=True)
    torch.testing.assert_close(y2[:, : i + 1], y[:, : i + 1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(probs2[:, :, : i + 1], probs[:, :, : i + 1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(y2[:, i + 1 :], y[:, i + 1 :])


@pytest.mark.invariant("attention.probs_pre_dropout")
def test_returned_probs_are_pre_dropout_and_dropout_is_live(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=16, C=32, H=4, d_ff=8, dropout=0.5)
    attn = _module(cfg, device, torch.float32)
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    y_eval, probs_eval = attn(x, return_attn=True)
    attn.train()
    y_train, probs_train = attn(x, return_attn=True)
    torch.testing.assert_close(probs_train, probs_eval)  # softmax output, not dropped
    assert not torch.allclose(y_train, y_eval)
    # Attention dropout hits the probabilities: with residual dropout off,
    # a train-mode output still differs from eval, and zeroed probabilities
    # scaled by 1/(1-p) reproduce it exactly.
    attn.resid_dropout.p = 0.0
    seen: list[torch.Tensor] = []
    handle = attn.attn_dropout.register_forward_hook(lambda m, i, o: seen.append(o))
    y_only_attn_drop = attn(x)
    handle.remove()
    assert len(seen) == 1 and seen[0].shape == probs_eval.shape
    kept = seen[0] != 0
    torch.testing.assert_close(seen[0][kept], (probs_eval / 0.5)[kept])
    assert not torch.allclose(y_only_attn_drop, y_eval)
    # Residual dropout hits the projected output, and is the last step.
    attn.attn_dropout.p, attn.resid_dropout.p = 0.0, 0.5
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = attn.resid_dropout.register_forward_hook(lambda m, i, o: calls.append((i[0], o)))
    y_only_resid_drop = attn(x)
    handle.remove()
    assert len(calls) == 1
    torch.testing.assert_close(calls[0][0], y_eval)  # dropout input is proj(...) output
    assert torch.equal(calls[0][1], y_only_resid_drop)
    assert not torch.allclose(y_only_resid_drop, y_eval)


@pytest.mark.invariant("attention.buffers_non_persistent")
def test_buffers_move_with_to_and_stay_out_of_state_dict(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...]
) -> None:
    cfg = ModelConfig(V=32, T=12, C=16, H=2, d_ff=8)
    attn = CausalSelfAttention(cfg)
    buffers = dict(attn.named_buffers())
    assert set(buffers) == {"rope_sin", "rope_cos", "mask"}
    assert buffers["rope_sin"].shape == buffers["rope_cos"].shape == (1, 1, cfg.T, 4)
    assert buffers["rope_sin"].dtype == torch.float32
    assert buffers["mask"].shape == (1, 1, cfg.T, cfg.T) and buffers["mask"].dtype == torch.bool
    assert torch.equal(
        buffers["mask"][0, 0], torch.tril(torch.ones(cfg.T, cfg.T, dtype=torch.bool))
    )
    assert set(attn.state_dict()) == {"qkv.weight", "proj.weight"}
    assert attn.qkv.bias is None and attn.proj.bias is None
    assert attn.qkv.weight.shape == (3 * cfg.C, cfg.C)
    for dtype in float_dtypes:
        moved = attn.to(device=device, dtype=dtype)
        for name in ("rope_sin", "rope_cos"):
            table = getattr(moved, name)
            assert (table.dtype, table.device.type) == (dtype, device.type)
        assert (moved.mask.dtype, moved.mask.device.type) == (torch.bool, device.type)
        assert set(moved.state_dict()) == {"qkv.weight", "proj.weight"}
        x = torch.randn(1, cfg.T, cfg.C, device=device, dtype=dtype)  # (B, T, C)
        assert moved(x).dtype == dtype


def _bad(cfg: ModelConfig, device: torch.device) -> dict[str, torch.Tensor]:
    cases = {
        "2-D input": torch.randn(cfg.T, cfg.C, device=device),
        "4-D input": torch.randn(1, 1, cfg.T, cfg.C, device=device),
        "wrong width": torch.randn(1, cfg.T, cfg.C + 2, device=device),
        "too long": torch.randn(1, cfg.T + 1, cfg.C, device=device),
        "empty sequence": torch.randn(1, 0, cfg.C, device=device),
        "wrong dtype": torch.randn(1, cfg.T, cfg.C, device=device).half(),
        "integer input": torch.ones(1, cfg.T, cfg.C, device=device, dtype=torch.int64),
        "meta device": torch.empty(1, cfg.T, cfg.C, device="meta"),
    }
    if device.type != "cpu":
        cases["wrong device"] = torch.randn(1, cfg.T, cfg.C)
    return cases


@pytest.mark.invariant("attention.rejects_bad_input")
def test_bad_input_raises_a_message_with_expected_and_actual(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=6, C=16, H=2, d_ff=8)
    attn = CausalSelfAttention(cfg).to(device)
    for case, x in _bad(cfg, device).items():
        with pytest.raises(AssertionError) as info:
            attn(x)
        message = str(info.value)
        assert "got" in message and "must" in message, (case, message)
    with pytest.raises(AssertionError, match=r"\[1, 6\].*got 7"):
        attn(torch.randn(1, 7, cfg.C, device=device))


def dense_reference(
    x: torch.Tensor, w_qkv: torch.Tensor, w_proj: torch.Tensor, H: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised float64 reference for long sequences: complex RoPE, -inf mask."""
    x, w_qkv, w_proj = (t.detach().to("cpu", torch.float64) for t in (x, w_qkv, w_proj))
    B, T, C = x.shape
    D = C // H
    q, k, v = (x @ w_qkv.T).split(C, dim=-1)  # (B, T, C) each
    q, k, v = (t.reshape(B, T, H, D).permute(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, D)
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    turn = torch.polar(
        torch.ones(T, D // 2, dtype=torch.float64),
        (pos * inv_freq),  # (T, D/2)
    )
    turn = torch.complex(turn.real.float().double(), turn.imag.float().double())  # float32 tables

    def rot(t: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(t.reshape(B, H, T, D // 2, 2).contiguous()) * turn
        return torch.view_as_real(z).reshape(B, H, T, D)  # (B, H, T, D)

    scores = rot(q) @ rot(k).transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)  # (B, H, T, T)
    out = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    return out @ w_proj.T, probs


@pytest.mark.invariant("attention.matches_reference")
@pytest.mark.parametrize("T", [129, 300])
def test_long_sequences_match_dense_reference(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], tol: Tol, T: int
) -> None:
    """Sequences longer than any internal query tiling still follow the math."""
    cfg = ModelConfig(V=32, T=320, C=16, H=2, d_ff=8, dropout=0.0)
    for dtype in float_dtypes:
        attn = _module(cfg, device, dtype)
        x = torch.randn(2, T, cfg.C, generator=torch.Generator().manual_seed(T))  # (B, T, C)
        y, probs = attn(x.to(device, dtype), return_attn=True)
        ref_y, ref_probs = dense_reference(
            x.to(dtype), attn.qkv.weight, attn.proj.weight, cfg.H, cfg.rope_theta
        )
        torch.testing.assert_close(probs.cpu(), ref_probs.to(dtype), **tol(dtype))
        torch.testing.assert_close(y.cpu(), ref_y.to(dtype), **tol(dtype))
        torch.testing.assert_close(attn(x.to(device, dtype)), y)
        # the causal property holds across any internal tiling boundary too
        x2 = x.clone()
        x2[:, T // 2 :] += 3.0
        torch.testing.assert_close(attn(x2.to(device, dtype))[:, : T // 2], y[:, : T // 2])
