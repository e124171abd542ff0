"""Acceptance tests of the cached forward (stage kv_cache).

After ``use_kv_cache`` a model's own ``forward`` and ``forward_with_attn_trace``
are the cached step: a call on n tokens computes positions p..p+n-1 of the
sequence whose first p tokens the cache already holds. The reference is the
same model's no-cache forward on the whole sequence, taken before the switch
(causality makes its rows p..p+n-1 those of the prefix).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import kv_cache_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import use_kv_cache

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here


def _split(total: int, cuts: list[int]) -> list[int]:
    """Chunk lengths that add up to ``total``, cut at the given points."""
    points = sorted({c for c in cuts if 0 < c < total})
    edges = [0, *points, total]
    return [b - a for a, b in itertools.pairwise(edges)]


configs = partial(kit.configs, max_T=20)  # T in [2, 20]


@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
@settings(max_examples=15)
@given(case=kit.cases(configs()), B=st.integers(1, 3), data=st.data())
def test_chunks_match_the_no_cache_forward(
    rig: kit.Rig, case: kit.Case, B: int, data: st.DataObject
) -> None:
    cfg, seed, fast = case
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    total = data.draw(st.integers(1, cfg.T))
    chunks = _split(total, data.draw(st.lists(st.integers(1, cfg.T), max_size=4)))
    model = rig.model(cfg, dtype, seed, fast)
    x = rig.tokens(cfg, B, total, seed)  # (B, total)
    with torch.no_grad():
        full = model(x)  # (B, total, V), no cache
        caches = use_kv_cache(model, B)
        p = 0
        for n in chunks:
            got = model(x[:, p : p + n])  # (B, n, V)
            assert got.shape == (B, n, cfg.V) and got.dtype == dtype
            rig.close(got, full[:, p : p + n], dtype)
            p += n
            assert [len(c) for c in caches] == [p] * cfg.L


@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
@pytest.mark.parametrize("fast", [False, True])
def test_prefill_then_one_token_steps_match(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=53, T=24, C=32, L=3, H=4, d_ff=40, dropout=0.1, rope_theta=211.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 11, fast)
        x = rig.tokens(cfg, 2, cfg.T, 5)  # (B, T): every position, up to the last
        with torch.no_grad():
            full = model(x)  # (B, T, V)
            use_kv_cache(model, 2)
            got = [model(x[:, :7])[:, -1]]  # prefill: (B, V) of position 6
            got += [model(x[:, i : i + 1])[:, 0] for i in range(7, cfg.T)]  # (B, V) each
        rig.close(torch.stack(got, 1), full[:, 6:], dtype)


@pytest.mark.invariant("kv_cache.trace_matches_full")
@settings(max_examples=10)
@given(case=kit.cases(configs(), fast=False), B=st.integers(1, 2), data=st.data())
def test_chunk_probabilities_match_the_no_cache_trace(
    rig: kit.Rig, case: kit.Case, B: int, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    total = data.draw(st.integers(1, cfg.T))
    chunks = _split(total, data.draw(st.lists(st.integers(1, cfg.T), max_size=3)))
    model = rig.model(cfg, dtype, seed)
    x = rig.tokens(cfg, B, total, seed)  # (B, total)
    with torch.no_grad():
        _, ref = model.forward_with_attn_trace(x, layer, return_full_attn=True)
        full = ref["attn_full"]  # (B, H, total, total)
        assert full is not None
        use_kv_cache(model, B)
        p = 0
        for n in chunks:
            _, trace = model.forward_with_attn_trace(x[:, p : p + n], layer, return_full_attn=True)
            assert trace["layer"] == layer
            rows = trace["attn_full"]  # (B, H, n, p + n)
            assert rows is not None and rows.shape == (B, cfg.H, n, p + n)
            rig.close(rows, full[:, :, p : p + n, : p + n], dtype)
            rig.close(trace["attn_row"], full[:, :, p + n - 1, : p + n], dtype)
            p += n


@pytest.mark.invariant("kv_cache.trace_matches_full")
def test_trace_is_taken_before_attention_dropout(rig: kit.Rig) -> None:
    # Only attention dropout is on, so layer 0's probabilities never see a dropped
    # value: in training mode they must still equal the eval-mode reference.
    cfg = ModelConfig(V=29, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 3)
    x = rig.tokens(cfg, 2, 9, 4)  # (B, 9)
    with torch.no_grad():
        _, ref = model.forward_with_attn_trace(x, 0, return_full_attn=True)
        full = ref["attn_full"]  # (B, H, 9, 9)
        assert full is not None
        for block in model.blocks:
            block.attn.attn_dropout.p = 0.5
        model.train()
        use_kv_cache(model, 2)
        torch.manual_seed(0)
        p = 0
        for n in (4, 1, 3, 1):
            _, trace = model.forward_with_attn_trace(x[:, p : p + n], 0, return_full_attn=True)
            assert trace["attn_full"] is not None
            rig.close(trace["attn_full"], full[:, :, p : p + n, : p + n], torch.float32)
            torch.testing.assert_close(
                trace["attn_row"].sum(-1), torch.ones(2, cfg.H, device=rig.device)
            )
            p += n


def _reference_keys_values(model: GPT, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rotated keys and the values of every position of ``x``."""
    out = []
    h = model.tok_emb(x)  # (B, t, C), eval mode: no dropout
    B, t, C = h.shape
    for block in model.blocks:
        attn = block.attn
        H = attn.n_head
        _, k, v = attn.qkv(block.ln1(h)).split(C, dim=-1)  # (B, t, C) each
        k = k.reshape(B, t, H, C // H).transpose(1, 2)  # (B, H, t, D)
        v = v.reshape(B, t, H, C // H).transpose(1, 2)  # (B, H, t, D)
        _, k_rot = rope.apply_rope(k, k, attn.rope_sin, attn.rope_cos)  # (B, H, t, D)
        out.append((k_rot, v))
        h = block(h)  # (B, t, C)
    return out


@pytest.mark.invariant("kv_cache.cache_fixed")
def test_cache_holds_rotated_keys_and_values_in_its_storage(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=31, T=14, C=24, L=2, H=3, d_ff=16, dropout=0.0, rope_theta=90.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 8)
        x = rig.tokens(cfg, 3, 11, 2)  # (B, 11)
        with torch.no_grad():
            want = _reference_keys_values(model, x)
            caches = use_kv_cache(model, 3)
            ptrs = [(c.keys.data_ptr(), c.values.data_ptr()) for c in caches]
            p = 0
            for n in (5, 1, 1, 3, 1):
                model(x[:, p : p + n])
                p += n
                for cache, (k, v), ptr, block in zip(caches, want, ptrs, model.blocks, strict=True):
                    assert block.attn.kv_cache is cache
                    assert (cache.keys.data_ptr(), cache.values.data_ptr()) == ptr
                    assert cache.keys.shape == cache.values.shape == (3, cfg.H, cfg.T, 8)
                    assert len(cache) == p
                    rig.close(cache.keys[:, :, :p], k[:, :, :p], dtype)
                    rig.close(cache.values[:, :, :p], v[:, :, :p], dtype)
                    assert not cache.keys[:, :, p:].any() and not cache.values[:, :, p:].any()


class _OpLog(TorchDispatchMode):
    """Names of the ATen ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


@contextmanager
def _logging_ops() -> Iterator[_OpLog]:
    log = _OpLog()
    with log:
        yield log


@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_decode_steps_dispatch_no_concatenation(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=23, T=16, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 1, fast)
    x = rig.tokens(cfg, 2, 12, 1)  # (B, 12)
    with torch.no_grad():
        use_kv_cache(model, 2)
        model(x[:, :6])
        with _logging_ops() as log:
            for i in range(6, 12):
                if i % 2:
                    model.forward_with_attn_trace(x[:, i : i + 1], 1)
                else:
                    model(x[:, i : i + 1])
    assert log.names, "the op log saw nothing"
    assert not [n for n in log.names if n.split(".")[0] in ("aten::cat", "aten::_cat")]


@pytest.mark.invariant("kv_cache.dropout_in_training")
def test_training_mode_applies_the_modules_own_dropout(device: torch.device) -> None:
    cfg = ModelConfig(V=8, T=12, C=16, L=1, H=2, d_ff=8, dropout=0.0)
    block_attn = GPT(cfg).to(device).blocks[0].attn
    x = torch.randn(2, 6, cfg.C, generator=torch.Generator().manual_seed(0)).to(device)

    def run(p_attn: float, p_resid: float, training: bool) -> torch.Tensor:
        use_kv_cache(block_attn, 2)  # fresh cache each run
        block_attn.attn_dropout.p, block_attn.resid_dropout.p = p_attn, p_resid  # after the switch
        block_attn.train(training)
        torch.manual_seed(0)
        with torch.no_grad():
            first = block_attn(x[:, :4])  # (B, 4, C)
            second = block_attn(x[:, 4:])  # (B, 2, C)
        return torch.cat([first, second], dim=1)  # (B, 6, C)

    plain = run(0.0, 0.0, training=False)
    torch.testing.assert_close(run(0.5, 0.5, training=False), plain, rtol=0, atol=0)
    torch.testing.assert_close(run(0.0, 0.0, training=True), plain, rtol=0, atol=0)
    assert not torch.allclose(run(0.5, 0.0, training=True), plain)  # attention dropout
    assert not torch.allclose(run(0.0, 0.5, training=True), plain)  # residual dropout
    dropped = run(0.0, 0.5, training=True)
    zeros = (dropped == 0).float().mean().item()
    assert 0.3 < zeros < 0.7  # the residual rate, read at call time


@pytest.mark.invariant("kv_cache.rope_positions")
def test_rope_gets_tables_starting_at_the_chunk(
    rig: kit.Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(V=19, T=13, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=50.0)
    real = rope.apply_rope
    calls: list[tuple[torch.Size, torch.Tensor, torch.Tensor]] = []

    def spy(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((q.shape, sin, cos))
        return real(q, k, sin, cos)

    monkeypatch.setattr(rope, "apply_rope", spy)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 2)
        table_sin, table_cos = model.blocks[0].attn.rope_sin, model.blocks[0].attn.rope_cos
        x = rig.tokens(cfg, 2, 13, 3)  # (B, 13)
        use_kv_cache(model, 2)
        p = 0
        for n in (5, 1, 2, 1, 4):
            calls.clear()
            with torch.no_grad():
                model(x[:, p : p + n])
            assert len(calls) == cfg.L
            for shape, sin, cos in calls:
                assert shape == (2, cfg.H, n, cfg.C // cfg.H)
                assert sin.shape[-2] >= n and cos.shape[-2] >= n
                assert torch.equal(sin[:, :, :n], table_sin[:, :, p : p + n])
                assert torch.equal(cos[:, :, :n], table_cos[:, :, p : p + n])
            p += n


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_cached_forward_rejects_overrun_and_mismatch(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=17, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 4)
    x = rig.tokens(cfg, 2, 10, 6)  # (B, 10)
    caches = use_kv_cache(model, 2)
    with torch.no_grad():
        model(x[:, :8])
        snapshot = [(c.keys.clone(), c.values.clone()) for c in caches]
        with pytest.raises(InputError):
            model(x[:, :3])  # 8 + 3 > T
        with pytest.raises(InputError):
            model(rig.tokens(cfg, 3, 1, 0))  # batch 3 against a batch-2 cache
        with pytest.raises(InputError):
            model(x[:, :1].to(torch.int32))
        for cache, (k, v) in zip(caches, snapshot, strict=True):
            assert len(cache) == 8  # nothing was written
            assert torch.equal(cache.keys, k) and torch.equal(cache.values, v)
        model(x[:, 8:])  # the last two positions still fit
        assert [len(c) for c in caches] == [10, 10]
        with pytest.raises(InputError):
            model(x[:, :1])  # full


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_cached_forward_rejects_a_cache_of_another_dtype(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=17, T=10, C=16, L=1, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 4)
    (cache,) = use_kv_cache(model, 1)
    other = torch.float64 if torch.float64 in rig.float_dtypes else torch.float16
    model.to(other)  # the weights move on; the attached float32 cache does not
    with pytest.raises(InputError), torch.no_grad():
        model(rig.tokens(cfg, 1, 2, 0))
    assert len(cache) == 0
