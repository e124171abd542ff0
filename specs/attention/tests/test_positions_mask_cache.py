"""Acceptance tests of attention 1.1 and 2.0: per-row positions, a key mask, a KV cache, a kernel.

The reference is written from the definitions, independently of the module:
float64 on the CPU, one token at a time. Every token ``s`` of a row has a RoPE
position ``pos[s]`` (a 2x2 rotation per channel pair, the tables' sin/cos
rounded to float32 as seed 000 builds them) and query ``i`` sees key ``j``
iff ``see[i, j]``; a query that sees no key gets zero probabilities and a zero
output. The module's calls (positions, key masks, a cache filled chunk by
chunk) are all checked against that one function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache, rotate_rows

Tol = Callable[[torch.dtype], dict[str, float]]


def _f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def reference(
    attn: CausalSelfAttention, x: torch.Tensor, pos: torch.Tensor, see: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """y ``(B, S, C)`` and probs ``(B, H, S, S)`` of ``x`` ``(B, S, C)``: float64, CPU.

    ``pos`` ``(B, S)`` RoPE positions, ``see`` ``(B, S, S)`` bool (query, key).
    """
    cfg = attn.cfg
    w_qkv = attn.qkv.weight.detach().cpu().double()
    w_proj = attn.proj.weight.detach().cpu().double()
    x = x.detach().cpu().double()
    B, S, C = x.shape
    H = cfg.H
    D = C // H
    qkv = x @ w_qkv.T  # (B, S, 3C)

    def turn(vec: torch.Tensor, p: int) -> torch.Tensor:
        out = vec.clone()
        for i in range(D // 2):
            ang = p * cfg.rope_theta ** (-2 * i / D)
            c, s = _f32(math.cos(ang)), _f32(math.sin(ang))
            a, b = vec[2 * i].item(), vec[2 * i + 1].item()
            out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    probs = torch.zeros(B, H, S, S, dtype=torch.float64)
    merged = torch.zeros(B, S, C, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            q = [turn(qkv[b, s, :C][cols], int(pos[b, s])) for s in range(S)]
            k = [turn(qkv[b, s, C : 2 * C][cols], int(pos[b, s])) for s in range(S)]
            v = [qkv[b, s, 2 * C :][cols] for s in range(S)]
            for i in range(S):
                seen = [j for j in range(S) if see[b, i, j]]
                if not seen:
                    continue
                scores = torch.stack([q[i] @ k[j] / math.sqrt(D) for j in seen])
                w = torch.exp(scores - scores.max())
                w = w / w.sum()
                for wj, j in zip(w, seen, strict=True):
                    probs[b, h, i, j] = wj
                    merged[b, i, cols] += wj * v[j]
    return merged @ w_proj.T, probs


def _causal(B: int, S: int) -> torch.Tensor:
    return torch.ones(S, S, dtype=torch.bool).tril().expand(B, S, S)  # (B, S, S)


def _module(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    torch.manual_seed(seed)
    return CausalSelfAttention(cfg).to(device=device, dtype=dtype).eval()


@st.composite
def _shapes(draw: st.DrawFn) -> tuple[ModelConfig, int, int, int]:
    """A config with non-default knobs, a batch, a sequence length and a seed."""
    H, half = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T = draw(st.integers(2, 10))
    theta = draw(st.sampled_from([10000.0, 30.0, 700.0]))
    cfg = ModelConfig(V=8, T=T, C=2 * half * H, H=H, d_ff=8, dropout=0.0, rope_theta=theta)
    return cfg, draw(st.integers(1, 3)), draw(st.integers(1, T)), draw(st.integers(0, 10**6))


@pytest.mark.invariant("attention.positions_rotate")
@given(shape=_shapes())
def test_each_row_is_rotated_at_its_own_positions(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    shape: tuple[ModelConfig, int, int, int],
) -> None:
    cfg, B, S, seed = shape
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, cfg.T, (B, S), generator=gen)  # (B, S), any order, repeats allowed
    x = torch.randn(B, S, cfg.C, generator=gen)  # (B, S, C)
    for dtype in float_dtypes:
        attn = _module(cfg, device, dtype, seed)
        want_y, want_p = reference(attn, x, pos, _causal(B, S))
        y, probs = attn(x.to(device, dtype), return_attn=True, positions=pos.to(device))
        torch.testing.assert_close(y.cpu().double(), want_y, **tol(dtype))
        torch.testing.assert_close(probs.cpu().double(), want_p, **tol(dtype))
        # positions 0..S-1 given explicitly are the default
        same = torch.arange(S).expand(B, S).to(device)
        xd = x.to(device, dtype)
        torch.testing.assert_close(attn(xd, positions=same), attn(xd))


@pytest.mark.invariant("attention.positions_rotate")
def test_positions_make_one_folded_rope_call_with_the_tables_rows(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(V=8, T=9, C=12, H=2, d_ff=8, dropout=0.0, rope_theta=50.0)
    attn = _module(cfg, device, torch.float32, 1)
    calls: list[tuple[torch.Size, torch.Tensor]] = []
    real = rope.apply_rope

    def spy(q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> Any:
        calls.append((q.shape, sin.detach().clone()))
        return real(q, k, sin, cos)

    monkeypatch.setattr(rope, "apply_rope", spy)
    pos = torch.tensor([[4, 0, 8], [2, 2, 1]], device=device)  # (2, 3)
    attn(torch.randn(2, 3, cfg.C, device=device), positions=pos)
    assert len(calls) == 1
    shape, sin = calls[0]
    assert shape == (1, cfg.H, 6, cfg.C // cfg.H)  # the batch folded into positions
    assert torch.equal(sin[0, 0], attn.rope_sin[0, 0][pos.reshape(-1)])


def _random_mask(gen: torch.Generator, B: int, S: int) -> torch.Tensor:
    mask = torch.rand(B, S, generator=gen) < 0.6  # (B, S)
    mask[0, :] = False  # a row that sees nothing at all
    return mask


@pytest.mark.invariant("attention.key_mask_hides")
@given(shape=_shapes())
@settings(max_examples=15)
def test_a_key_mask_hides_keys_and_empty_queries_give_zeros(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    shape: tuple[ModelConfig, int, int, int],
) -> None:
    cfg, B, S, seed = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, cfg.C, generator=gen)  # (B, S, C)
    mask = _random_mask(gen, B, S)  # (B, S)
    see = _causal(B, S) & mask[:, None, :]  # (B, S, S)
    for dtype in float_dtypes:
        attn = _module(cfg, device, dtype, seed)
        want_y, want_p = reference(attn, x, torch.arange(S).expand(B, S), see)
        xd = x.to(device, dtype).clone().requires_grad_(True)
        y, probs = attn(xd, return_attn=True, key_mask=mask.to(device))
        torch.testing.assert_close(y.detach().cpu().double(), want_y, **tol(dtype))
        torch.testing.assert_close(probs.detach().cpu().double(), want_p, **tol(dtype))
        assert bool((probs.cpu()[~see[:, None].expand_as(probs)] == 0).all())  # exact zeros
        assert not y[0].any()  # row 0 sees nothing: zero output
        (y.square().sum() + probs.square().sum()).backward()
        grads = [xd.grad, *(p.grad for p in attn.parameters())]
        assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


@st.composite
def _chunks(draw: st.DrawFn) -> tuple[ModelConfig, int, list[int], int, int]:
    """A config, a batch, chunk sizes summing to S <= cfg.T, a cache length, a seed."""
    cfg, B, _, seed = draw(_shapes())
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    while sum(sizes) > cfg.T:
        sizes.pop()
    sizes = sizes or [1]
    max_len = draw(st.integers(sum(sizes), cfg.T + 2))
    return cfg, B, sizes, max_len, seed


@pytest.mark.invariant("attention.cache_appends")
@given(case=_chunks(), masked=st.booleans())
@settings(max_examples=15)
def test_chunks_through_a_cache_are_the_whole_sequence(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    case: tuple[ModelConfig, int, list[int], int, int],
    masked: bool,
) -> None:
    cfg, B, sizes, max_len, seed = case
    S = sum(sizes)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, cfg.C, generator=gen)  # (B, S, C)
    mask = _random_mask(gen, B, S) if masked else torch.ones(B, S, dtype=torch.bool)
    pads = torch.randint(0, 3, (B,), generator=gen)  # per-row position offsets
    pos = (torch.arange(S)[None, :] - pads[:, None]).clamp(min=0)  # (B, S)
    if not masked:  # the default positions: 0 .. S-1 in every row
        pos = torch.arange(S).expand(B, S)
    for dtype in float_dtypes:
        attn = _module(cfg, device, dtype, seed)
        want_y, want_p = reference(attn, x, pos, _causal(B, S) & mask[:, None, :])
        cache = KVCache(B, cfg.H, max_len, cfg.C // cfg.H, dtype=dtype, device=device)
        attn.kv_cache = cache
        storage = cache.keys.data_ptr()
        start = 0
        for n in sizes:
            end = start + n
            y, probs = attn(
                x[:, start:end].to(device, dtype),
                return_attn=True,
                positions=pos[:, start:end].to(device) if masked else None,
                key_mask=mask[:, :end].to(device) if masked else None,
            )
            assert len(cache) == end and probs.shape == (B, cfg.H, n, end)
            torch.testing.assert_close(y.cpu().double(), want_y[:, start:end], **tol(dtype))
            got_p, want = probs.cpu().double(), want_p[:, :, start:end, :end]
            torch.testing.assert_close(got_p, want, **tol(dtype))
            start = end
        assert cache.keys.data_ptr() == storage and cache.keys.shape[2] == max_len
        assert not cache.keys[:, :, S:].any() and not cache.values[:, :, S:].any()
        del attn.kv_cache  # dropped again: the plain module
        first = reference(attn, x[:, :1], torch.zeros(B, 1, dtype=torch.long), _causal(B, 1))[0]
        torch.testing.assert_close(
            attn(x[:, :1].to(device, dtype)).cpu().double(), first, **tol(dtype)
        )


@pytest.mark.invariant("attention.cache_appends")
def test_the_cache_holds_rotated_keys_and_the_values(device: torch.device) -> None:
    cfg = ModelConfig(V=8, T=6, C=8, H=2, d_ff=8, dropout=0.0, rope_theta=20.0)
    attn = _module(cfg, device, torch.float64, 3)
    x = torch.randn(2, 5, cfg.C, dtype=torch.float64, device=device)  # (B, S, C)
    attn.kv_cache = KVCache(2, cfg.H, 6, cfg.C // cfg.H, dtype=torch.float64, device=device)
    attn(x[:, :3])
    attn(x[:, 3:])
    _, k, v = attn.qkv(x).split(cfg.C, dim=-1)  # (B, S, C) each
    k = k.view(2, 5, cfg.H, -1).transpose(1, 2)  # (B, H, S, D)
    v = v.view(2, 5, cfg.H, -1).transpose(1, 2)  # (B, H, S, D)
    sin, cos = attn.rope_sin.double(), attn.rope_cos.double()
    _, k_rot = rope.apply_rope(k, k, sin, cos)  # (B, H, S, D)
    cache = attn.kv_cache
    torch.testing.assert_close(cache.keys[:, :, :5], k_rot, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache.values[:, :, :5], v, rtol=1e-12, atol=1e-12)


def _bad_calls(cfg: ModelConfig, device: torch.device) -> dict[str, tuple[Any, dict[str, Any]]]:
    """name -> (cache, keywords) of a 3-token call on a batch of 2 after 2 cached tokens."""
    D = cfg.C // cfg.H

    def cache(b: int = 2, h: int = cfg.H, m: int = cfg.T, d: int = D, **kw: Any) -> KVCache:
        return KVCache(b, h, m, d, dtype=kw.get("dtype", torch.float32), device=device)

    pos = torch.zeros(2, 3, dtype=torch.int64, device=device)
    mask = torch.ones(2, 5, dtype=torch.bool, device=device)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    return {
        "cache-batch": (cache(b=3), {}),
        "cache-heads": (cache(h=cfg.H + 1), {}),
        "cache-head-dim": (cache(d=D + 2), {}),
        "cache-overrun": (cache(m=4), {}),
        "cache-dtype": (cache(dtype=torch.float64), {}),
        "cache-not-a-cache": ((torch.zeros(1),), {}),
        "positions-shape": (cache(), {"positions": pos[:, :2]}),
        "positions-dtype": (cache(), {"positions": pos.int()}),
        "positions-range": (cache(), {"positions": pos + cfg.T}),
        "positions-negative": (cache(), {"positions": pos - 1}),
        "positions-device": (cache(), {"positions": pos.to(other)}),
        "mask-shape": (cache(), {"key_mask": mask[:, :3]}),
        "mask-dtype": (cache(), {"key_mask": mask.long()}),
        "mask-device": (cache(), {"key_mask": mask.to(other)}),
    }


BAD_CFG = ModelConfig(V=8, T=6, C=8, H=2, d_ff=8, dropout=0.0)


@pytest.mark.invariant("attention.call_checked")
@pytest.mark.parametrize("case", sorted(_bad_calls(BAD_CFG, torch.device("cpu"))))
def test_a_call_that_does_not_fit_writes_nothing(device: torch.device, case: str) -> None:
    attn = _module(BAD_CFG, device, torch.float32, 0)
    cache, kwargs = _bad_calls(BAD_CFG, device)[case]
    attn.kv_cache = cache
    if case.startswith(("positions", "mask")) or case == "cache-overrun":
        attn(torch.randn(2, 2, BAD_CFG.C, device=device))  # 2 cached tokens, then the bad call
    kept = [(len(c), c.keys.clone(), c.values.clone()) for c in [cache] if isinstance(c, KVCache)]
    with pytest.raises(InputError):
        attn(torch.randn(2, 3, BAD_CFG.C, device=device), **kwargs)
    for n, keys, values in kept:
        assert len(cache) == n and torch.equal(cache.keys, keys)
        assert torch.equal(cache.values, values)


@pytest.mark.invariant("attention.call_checked")
def test_a_bad_cache_size_is_refused(device: torch.device) -> None:
    for sizes in [(0, 1, 1, 2), (1, 0, 1, 2), (1, 1, 0, 2), (True, 1, 1, 2), (1.0, 1, 1, 2)]:
        with pytest.raises(InputError):
            KVCache(*sizes, dtype=torch.float32, device=device)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="floating"):
        KVCache(1, 1, 1, 2, dtype=torch.int64, device=device)


@pytest.mark.invariant("attention.kernel_without_probs_or_mask")
@pytest.mark.parametrize("training", [False, True])
def test_a_kernel_serves_every_call_without_probabilities_or_a_key_mask(
    device: torch.device, training: bool
) -> None:
    """2.0: plain and cached calls reach the kernel, with the cache's (B, H, p + T, D) k, v."""
    cfg = ModelConfig(V=8, T=7, C=12, H=3, d_ff=8, dropout=0.25, rope_theta=90.0)
    attn = _module(cfg, device, torch.float64, 5)
    x = torch.randn(2, 7, cfg.C, dtype=torch.float64, device=device)  # (B, T, C)
    seen: list[tuple[int, int, float, float]] = []

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, s: float) -> Any:
        """A reference kernel, causal from the bottom right; no dropout, the rate is recorded."""
        T, S = q.shape[-2], k.shape[-2]
        seen.append((T, S, p, s))
        scores = (q @ k.transpose(-2, -1)) * s  # (B, H, T, S)
        hidden = ~torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # (T, S)
        return torch.softmax(scores.masked_fill(hidden, -math.inf), dim=-1) @ v

    def chunks() -> torch.Tensor:
        """The sequence through a fresh cache in chunks of 3, 1 and 3: ``(B, T, C)``."""
        attn.kv_cache = KVCache(2, cfg.H, 7, 4, dtype=torch.float64, device=device)
        out = torch.cat([attn(x[:, :3]), attn(x[:, 3:4]), attn(x[:, 4:])], dim=1)  # (B, 7, C)
        del attn.kv_cache
        return out

    attn.eval()
    plain, cached = attn(x), chunks()  # (B, T, C) each: the explicit core
    attn.kernel = causal
    attn.train(training)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        got, got_cached = attn(x), chunks()
    rate, scale = (0.25 if training else 0.0), 1 / math.sqrt(cfg.C // cfg.H)
    assert seen == [(T, S, rate, scale) for T, S in [(7, 7), (3, 3), (1, 4), (3, 7)]]
    if not training:  # the kernel got the module's rotated q, k and its v, the cache's rows
        torch.testing.assert_close(got, plain, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got_cached, cached, rtol=1e-12, atol=1e-12)
    attn(x, return_attn=True)
    attn(x, key_mask=torch.ones(2, 7, dtype=torch.bool, device=device))
    attn.kv_cache = KVCache(2, cfg.H, 7, 4, dtype=torch.float64, device=device)
    attn(x[:, :3], return_attn=True)
    attn(x[:, 3:], key_mask=torch.ones(2, 7, dtype=torch.bool, device=device))
    assert len(seen) == 4  # probabilities or a key mask, cached or not: the explicit core


@pytest.mark.invariant("attention.positions_rotate")
@given(shape=_shapes())
def test_rotate_rows_is_rope_row_by_row_in_one_call(
    device: torch.device, shape: tuple[ModelConfig, int, int, int]
) -> None:
    """1.3: the public fold equals rope.apply_rope on each row with its own table rows."""
    cfg, B, T, seed = shape
    D = cfg.C // cfg.H
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, cfg.H, T, D, generator=gen).to(device) for _ in range(2))
    sin, cos = (t.to(device) for t in rope.rope_cache(cfg.T, D, theta=cfg.rope_theta))
    positions = torch.randint(0, cfg.T, (B, T), generator=gen).to(device)  # (B, T)
    q_rot, k_rot = rotate_rows(q, k, sin, cos, positions)
    assert q_rot.shape == k_rot.shape == (B, cfg.H, T, D)
    for b in range(B):
        rows = positions[b]
        want_q, want_k = rope.apply_rope(
            q[b : b + 1], k[b : b + 1], sin[:, :, rows], cos[:, :, rows]
        )
        torch.testing.assert_close(q_rot[b : b + 1], want_q, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(k_rot[b : b + 1], want_k, rtol=1e-6, atol=1e-6)
