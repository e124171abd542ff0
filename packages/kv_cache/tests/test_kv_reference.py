"""The cached step against a float64 GPT v1 written from the formulas.

The reference shares nothing with the model's code but its weights: token
lookup, RMSNorm, RoPE as a complex turn per channel pair, causal softmax over
the visible keys, SwiGLU and the tied head, all in float64 on the CPU. The
one concession: the model's RoPE tables are float32 buffers (upcast in a
float64 model), so the reference rounds each sin and cos to float32 as well.

Every config field is drawn away from its default, and so is the chunking of
the sequence: the cached forward must give the reference's logits and
probabilities at every chunk, and greedy generation must take the reference's
argmax at every step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate, use_kv_cache

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * weight  # (..., C)


def _turns(cfg: ModelConfig, t: int) -> torch.Tensor:
    """``exp(i * pos * theta^(-2j/D))`` for positions ``[0, t)``, sin/cos rounded to float32."""
    D = cfg.C // cfg.H
    inv_freq = cfg.rope_theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)  # (D/2,)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq  # (t, D/2)
    cos = angles.cos().float().double()  # (t, D/2)
    sin = angles.sin().float().double()  # (t, D/2)
    return torch.complex(cos, sin)  # (t, D/2)


def _rotate(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Channel pairs ``(2j, 2j+1)`` of ``(B, H, t, D)`` read as complex numbers, turned."""
    pairs = x.reshape(*x.shape[:-1], -1, 2).contiguous()  # (B, H, t, D/2, 2)
    return torch.view_as_real(torch.view_as_complex(pairs) * turns).flatten(-2)  # (B, H, t, D)


def reference_gpt(model: GPT, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits ``(B, t, V)`` and each layer's probabilities ``(B, H, t, t)``, float64 CPU."""
    cfg = model.cfg
    w = {k: v.detach().to("cpu", torch.float64) for k, v in model.state_dict().items()}
    ids = ids.cpu()
    B, t = ids.shape
    C, H = cfg.C, cfg.H
    D = C // H
    turns = _turns(cfg, t)  # (t, D/2)
    visible = torch.ones(t, t, dtype=torch.bool).tril()  # (t, t)
    h = w["tok_emb.weight"][ids]  # (B, t, C)
    layers = []
    for layer in range(cfg.L):
        p = f"blocks.{layer}."
        a = _rms(h, w[p + "ln1.weight"])  # (B, t, C)
        q, k, v = (a @ w[p + "attn.qkv.weight"].T).split(C, dim=-1)  # (B, t, C) each
        q, k, v = (z.reshape(B, t, H, D).transpose(1, 2) for z in (q, k, v))  # (B, H, t, D)
        scores = _rotate(q, turns) @ _rotate(k, turns).transpose(-2, -1) / math.sqrt(D)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)  # (B, H, t, t)
        layers.append(probs)
        heads = (probs @ v).transpose(1, 2).reshape(B, t, C)  # (B, t, C)
        h = h + heads @ w[p + "attn.proj.weight"].T  # (B, t, C)
        m = _rms(h, w[p + "ln2.weight"])  # (B, t, C)
        gate = F.silu(m @ w[p + "mlp.w_g.weight"].T + w[p + "mlp.w_g.bias"])  # (B, t, d_ff)
        up = m @ w[p + "mlp.w_a.weight"].T + w[p + "mlp.w_a.bias"]  # (B, t, d_ff)
        h = h + (gate * up) @ w[p + "mlp.w_o.weight"].T + w[p + "mlp.w_o.bias"]  # (B, t, C)
    logits = _rms(h, w["ln_f.weight"]) @ w["tok_emb.weight"].T  # (B, t, V)
    return logits, layers


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, 33)),
        T=draw(st.integers(2, 18)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 12)),
        dropout=draw(st.sampled_from([0.0, 0.25])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 23.0, 3e5])),
    )


def _model(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, randomise: Randomise, seed: int
) -> GPT:
    model = GPT(cfg)
    randomise(model, seed)
    with torch.no_grad():  # weights of std 0.3 scaled to keep float32 logits well conditioned
        for param in model.parameters():
            if param.ndim > 1:
                param.mul_(0.5)
    return model.to(device=device, dtype=dtype).eval()


def _cuts(total: int, points: list[int]) -> list[int]:
    edges = [0, *sorted({c for c in points if 0 < c < total}), total]
    return [b - a for a, b in itertools.pairwise(edges)]


@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
@pytest.mark.invariant("kv_cache.trace_matches_full")
@settings(max_examples=12)
@given(
    cfg=configs(),
    B=st.integers(1, 3),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_every_chunk_matches_the_float64_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    cfg: ModelConfig,
    B: int,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    total = data.draw(st.integers(1, cfg.T))
    chunks = _cuts(total, data.draw(st.lists(st.integers(1, cfg.T), max_size=4)))
    model = _model(cfg, device, dtype, randomise, seed)
    if fast:
        use_fast_attention(model)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.V, (B, total), generator=gen).to(device)  # (B, total)
    want_logits, want_probs = reference_gpt(model, x)  # (B, total, V), L x (B, H, total, total)
    caches = use_kv_cache(model, B)
    p = 0
    with torch.no_grad():
        for n in chunks:
            logits, trace = model.forward_with_attn_trace(x[:, p : p + n], layer, True)
            assert trace["attn_full"] is not None
            assert trace["attn_full"].shape == (B, cfg.H, n, p + n)
            torch.testing.assert_close(
                logits.cpu().double(), want_logits[:, p : p + n], **tol(dtype)
            )
            torch.testing.assert_close(
                trace["attn_full"].cpu().double(),
                want_probs[layer][:, :, p : p + n, : p + n],
                **tol(dtype),
            )
            p += n
            assert all(len(c) == p for c in caches)


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
@pytest.mark.invariant("kv_cache.trace_matches_full")
@settings(max_examples=10)
@given(cfg=configs(), B=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_greedy_steps_take_the_reference_argmax(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    cfg: ModelConfig,
    B: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]  # float64 where the device has it: no near-tie can flip
    layer = data.draw(st.integers(0, cfg.L - 1))
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = _model(cfg, device, dtype, randomise, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)
    ids, traces = generate(model, prompt, new, temperature=0.0, trace_layer=layer)
    want_logits, want_probs = reference_gpt(model, ids)  # on the ids generate chose
    choices = want_logits[:, t - 1 : t + new - 1].argmax(-1)  # (B, new), step i from t + i - 1
    assert torch.equal(ids[:, t:].cpu(), choices)
    assert len(traces) == new
    for i, trace in enumerate(traces):
        row = want_probs[layer][:, :, t + i - 1, : t + i]  # (B, H, t + i)
        torch.testing.assert_close(trace.cpu().double(), row, **tol(dtype))
