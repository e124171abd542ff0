"""The padded forward against a float64 reference written from the formulas.

The reference below rebuilds a GPT v1 from its weights and its RoPE tables
alone (RMSNorm, fused QKV, RoPE as complex multiplication by the table rows at
each row's own positions, an explicit allowed-key matrix, SwiGLU, the tied
head) and never calls the model's modules, the rope stage or this stage. The
tables are read from the model because they are part of it: the attention
stage builds them in float32, so a float64 model rotates by float32-rounded
angles, and a reference with exact angles would differ by about 1e-7.

A left-padded row ``b`` with ``pads[b]`` leading pads has, at column ``c``, the
position ``max(c - pads[b], 0)``; query ``c`` may see key ``j`` iff
``pads[b] <= j <= c``; a padded query sees nothing and its probability row is
zero.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import apply_rope_rows, padded_forward

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]


# --- the reference ---------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * weight  # (..., C)


def _angles(positions: torch.Tensor, D: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``(sin, cos)`` of ``p * theta**(-2i/D)``, ``(B, 1, t, D/2)`` each, float64."""
    freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angle = positions[:, None, :, None].double() * freq  # (B, 1, t, D/2)
    return angle.sin(), angle.cos()


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Pairs (2i, 2i+1) of ``(B, H, t, D)`` times ``cos + i sin`` ``(B, 1, t, D/2)``."""
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.complex(cos, sin)  # (B, H, t, D/2)
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)  # (B, H, t, D)


def _allowed(pads: list[int], t: int) -> torch.Tensor:
    """``(B, 1, t, t)`` bool: query ``i`` sees key ``j`` iff ``pads[b] <= j <= i``."""
    i = torch.arange(t)[:, None]  # (t, 1)
    j = torch.arange(t)[None, :]  # (1, t)
    rows = [(j <= i) & (j >= p) & (i >= p) for p in pads]  # B x (t, t)
    return torch.stack(rows)[:, None]  # (B, 1, t, t)


def weights(model: GPT, *, grad: bool = False) -> dict[str, torch.Tensor]:
    """The model's parameters as float64 CPU leaves (tied head: one ``tok_emb.weight``)."""
    return {
        name: p.detach().cpu().double().requires_grad_(grad) for name, p in model.named_parameters()
    }


def tables(model: GPT) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's RoPE tables ``(T, D/2)`` as float64 CPU copies."""
    return [
        (b.attn.rope_sin[0, 0].cpu().double(), b.attn.rope_cos[0, 0].cpu().double())
        for b in model.blocks
    ]


def reference(
    cfg: ModelConfig,
    w: dict[str, torch.Tensor],
    rope: list[tuple[torch.Tensor, torch.Tensor]],
    ids: torch.Tensor,
    pads: list[int],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """float64 CPU ``(logits (B, t, V), [probs (B, H, t, t) per layer])``, no dropout."""
    ids = ids.cpu()
    B, t = ids.shape
    H, D = cfg.H, cfg.C // cfg.H
    positions = (torch.arange(t)[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)  # (B, t)
    allowed = _allowed(pads, t)  # (B, 1, t, t)
    h = w["tok_emb.weight"][ids]  # (B, t, C)
    all_probs = []
    for layer in range(cfg.L):
        pre = f"blocks.{layer}."
        x = _rms(h, w[pre + "ln1.weight"])  # (B, t, C)
        q, k, v = (x @ w[pre + "attn.qkv.weight"].T).split(cfg.C, dim=-1)  # (B, t, C) each
        q, k, v = (a.view(B, t, H, D).transpose(1, 2) for a in (q, k, v))  # (B, H, t, D)
        sin = rope[layer][0][positions][:, None]  # (B, 1, t, D/2), table rows
        cos = rope[layer][1][positions][:, None]  # (B, 1, t, D/2)
        q, k = _rotate(q, sin, cos), _rotate(k, sin, cos)  # (B, H, t, D) each
        scores = q @ k.transpose(-2, -1) / D**0.5  # (B, H, t, t)
        scores = scores.masked_fill(~allowed, -torch.inf)  # (B, H, t, t)
        top = scores.detach().amax(-1, keepdim=True)  # (B, H, t, 1), -inf on padded queries
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # (B, H, t, 1)
        e = torch.exp(scores - top)  # (B, H, t, t), 0 where hidden
        total = e.sum(-1, keepdim=True)  # (B, H, t, 1), 0 on padded queries
        probs = e / torch.where(total > 0, total, torch.ones_like(total))  # (B, H, t, t)
        all_probs.append(probs)
        att = (probs @ v).transpose(1, 2).reshape(B, t, cfg.C)  # (B, t, C)
        h = h + att @ w[pre + "attn.proj.weight"].T  # (B, t, C)
        x = _rms(h, w[pre + "ln2.weight"])  # (B, t, C)
        a = x @ w[pre + "mlp.w_a.weight"].T + w[pre + "mlp.w_a.bias"]  # (B, t, F)
        g = x @ w[pre + "mlp.w_g.weight"].T + w[pre + "mlp.w_g.bias"]  # (B, t, F)
        h = h + (g * torch.sigmoid(g) * a) @ w[pre + "mlp.w_o.weight"].T + w[pre + "mlp.w_o.bias"]
    logits = _rms(h, w["ln_f.weight"]) @ w["tok_emb.weight"].T  # (B, t, V)
    real = torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]  # (B, t)
    return logits * real[..., None], all_probs


# --- shared helpers ---------------------------------------------


def _mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelConfig, list[int], int]:
    """A config with every knob drawn, pads per row (``t``: all padding), a padded width."""
    H = draw(st.integers(1, 3))
    cfg = ModelConfig(
        V=draw(st.integers(2, 30)),
        T=draw(st.integers(2, 12)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 12)),
        dropout=draw(st.sampled_from([0.0, 0.25])),
        rope_theta=draw(st.sampled_from([10000.0, 25.0, 3e5])),
    )
    t = draw(st.integers(1, cfg.T))
    pads = draw(st.lists(st.integers(0, t), min_size=1, max_size=4))
    return cfg, pads, t


def _model(
    cfg: ModelConfig,
    randomise: Randomise,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    fast: bool,
) -> GPT:
    model = GPT(cfg)
    randomise(model, seed)
    model.to(device=device, dtype=dtype).eval()
    return use_fast_attention(model) if fast else model  # type: ignore[return-value]


# --- forward and probabilities ---------------------------------------------


@pytest.mark.invariant("padding.padding_invariance")
@pytest.mark.invariant("padding.masked_probabilities")
@settings(max_examples=25)
@given(case=cases(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_padded_forward_matches_the_float64_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    case: tuple[ModelConfig, list[int], int],
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg, pads, t = case
    dtype = data.draw(st.sampled_from(float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    model = _model(cfg, randomise, seed, device, dtype, fast)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.V, (len(pads), t), generator=gen).to(device)  # (B, t)
    with torch.no_grad():
        logits, trace = padded_forward(model, ids, _mask(pads, t, device), trace_layer=layer)
    want, probs = reference(cfg, weights(model), tables(model), ids, pads)
    torch.testing.assert_close(logits.cpu().double(), want, **tol(dtype))
    full = trace["attn_full"]
    assert full is not None and full.dtype == dtype
    torch.testing.assert_close(full.cpu().double(), probs[layer], **tol(dtype))
    assert torch.equal(trace["attn_row"], full[:, :, -1])
    allowed = _allowed(pads, t).to(device)  # (B, 1, t, t)
    assert not full.masked_select(~allowed).any(), "a hidden key or padded query got probability"
    real = _mask(pads, t, device)  # (B, t)
    assert not logits.masked_select(~real[..., None]).any(), "padded logits must be exactly 0"


@pytest.mark.invariant("padding.padding_invariance")
def test_float64_padding_invariance_is_within_1e_10(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise
) -> None:
    if torch.float64 not in float_dtypes:
        pytest.skip(f"{device} has no float64")
    cfg = ModelConfig(V=41, T=16, C=24, L=3, H=3, d_ff=20, dropout=0.0, rope_theta=500.0)
    model = _model(cfg, randomise, 3, device, torch.float64, False)
    real = torch.randint(0, cfg.V, (1, 5), generator=torch.Generator().manual_seed(1))
    real = real.to(device)  # (1, 5)
    with torch.no_grad():
        alone = model(real)[0]  # (5, V)
        for pad in range(cfg.T - 5 + 1):
            ids = torch.full((1, 5 + pad), 7, device=device)  # (1, 5 + pad)
            ids[0, pad:] = real[0]
            got = padded_forward(model, ids, _mask([pad], 5 + pad, device))  # (1, 5+pad, V)
            assert isinstance(got, torch.Tensor)
            assert (got[0, pad:] - alone).abs().max().item() <= 1e-10


# --- rotation ---------------------------------------------


@pytest.mark.invariant("padding.rotation_matches_rope")
@settings(max_examples=25)
@given(
    B=st.integers(1, 4),
    H=st.integers(1, 3),
    n=st.integers(1, 7),
    half=st.integers(1, 4),
    theta=st.sampled_from([10000.0, 13.0, 1e6]),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_apply_rope_rows_is_the_complex_rotation_at_each_rows_positions(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    B: int,
    H: int,
    n: int,
    half: int,
    theta: float,
    extra: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    D = 2 * half
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64)  # (B, H, n, D)
    k = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64)  # (B, H, n, D)
    positions = torch.randint(0, 50, (B, n), generator=gen)  # (B, n), any order, repeats
    Tc = int(positions.max()) + 1 + extra
    table_sin, table_cos = _angles(torch.arange(Tc)[None], D, theta)  # (1, 1, Tc, D/2) each
    args = [a.to(device=device, dtype=dtype) for a in (q, k, table_sin, table_cos)]
    q_rot, k_rot = apply_rope_rows(*args, positions.to(device))
    assert q_rot.shape == (B, H, n, D) and q_rot.dtype == dtype and k_rot.device == q_rot.device
    sin, cos = _angles(positions, D, theta)  # (B, 1, n, D/2) each, exact
    torch.testing.assert_close(q_rot.cpu().double(), _rotate(q, sin, cos), **tol(dtype))
    torch.testing.assert_close(k_rot.cpu().double(), _rotate(k, sin, cos), **tol(dtype))


# --- gradients ---------------------------------------------


@pytest.mark.invariant("padding.finite_gradients")
@settings(max_examples=10)
@given(case=cases(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_gradients_match_the_reference_and_are_finite(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    case: tuple[ModelConfig, list[int], int],
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg, pads, t = case
    pads = [*pads, t - 1, t]  # always a row with a single real token and one with none
    dtype = data.draw(st.sampled_from(float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    model = _model(cfg, randomise, seed, device, dtype, fast)
    B = len(pads)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)
    g = torch.randn(B, t, cfg.V, generator=gen, dtype=torch.float64)  # (B, t, V)
    g2 = torch.randn(B, cfg.H, t, t, generator=gen, dtype=torch.float64)  # (B, H, t, t)
    logits, trace = padded_forward(model, ids, _mask(pads, t, device), trace_layer=layer)
    assert trace["attn_full"] is not None
    loss = (logits * g.to(device, dtype)).sum() + (trace["attn_full"] * g2.to(device, dtype)).sum()
    loss.backward()
    named = list(model.named_parameters())
    for name, p in named:
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: NaN or inf"
    if dtype != torch.float64:
        return  # the comparison runs where float64 is: the reference's own precision
    w = weights(model, grad=True)
    want_logits, want_probs = reference(cfg, w, tables(model), ids, pads)
    ref_loss = (want_logits * g).sum() + (want_probs[layer] * g2).sum()
    want = torch.autograd.grad(ref_loss, [w[name] for name, _ in named])
    for (name, p), ref in zip(named, want, strict=True):
        assert p.grad is not None
        torch.testing.assert_close(p.grad.cpu(), ref, **tol(dtype), msg=name)
