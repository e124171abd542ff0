"""The switch, ``KVCache`` and the cached module's own checks.

``use_kv_cache`` must keep every module object, hook and weight and remember
the class it replaced across resets; ``drop_kv_cache`` must leave nothing of
the switch behind. A cached chunk that does not fit its cache must fail
before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel, use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import KVCache, KVCacheAttention, drop_kv_cache, use_kv_cache

Tol = Callable[[torch.dtype], dict[str, float]]
CFG = ModelConfig(V=19, T=11, C=20, L=2, H=5, d_ff=6, dropout=0.3, rope_theta=45.0)


@pytest.mark.invariant("kv_cache.switch_in_place")
def test_resets_remember_the_first_class_and_drop_leaves_no_trace(device: torch.device) -> None:
    model = use_fast_attention(GPT(CFG).to(device))
    calls: list[str] = []
    handle = model.blocks[1].attn.register_forward_hook(lambda m, a, o: calls.append("hook"))
    first = use_kv_cache(model, 2)
    second = use_kv_cache(model, 4)  # a reset keeps the fast class to go back to
    assert [c.keys.shape[0] for c in second] == [4, 4] and first[0] is not second[0]
    with torch.no_grad():
        model(torch.zeros(4, 3, dtype=torch.int64, device=device))
    assert calls == ["hook"]  # hooks survive the switch
    assert [len(c) for c in second] == [3, 3] and [len(c) for c in first] == [0, 0]
    drop_kv_cache(model)
    handle.remove()
    for block in model.blocks:
        assert type(block.attn) is CausalSelfAttention and block.attn.kernel is sdpa_kernel
        assert not hasattr(block.attn, "kv_cache") and not hasattr(block.attn, "_kv_cache_base")
    assert drop_kv_cache(model) is model  # nothing switched: nothing to do


@pytest.mark.invariant("kv_cache.switch_in_place")
def test_switched_modules_keep_their_dtype_and_device_in_the_cache(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...]
) -> None:
    for dtype in (*float_dtypes, torch.bfloat16):
        model = GPT(CFG).to(device=device, dtype=dtype)
        for cache in use_kv_cache(model, 3):
            for store in (cache.keys, cache.values):
                assert store.dtype == dtype and store.device.type == device.type
                assert store.shape == (3, CFG.H, CFG.T, CFG.C // CFG.H)


@pytest.mark.invariant("kv_cache.switch_refuses_unknown")
def test_refusals_are_type_errors_naming_the_module(device: torch.device) -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        use_kv_cache("model", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no attention"):
        use_kv_cache(torch.nn.Sequential(torch.nn.ReLU()), 1)
    model = GPT(CFG).to(device)

    class Sliding(CausalSelfAttention):
        def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:  # type: ignore[override]
            return super().forward(x, **kwargs)  # a forward of its own: its math is unknown

    model.blocks[1].attn.__class__ = Sliding
    with pytest.raises(TypeError, match=r"blocks\.1\.attn is a .*Sliding"):
        use_kv_cache(model, 1)
    assert type(model.blocks[0].attn) is CausalSelfAttention  # nothing switched


@pytest.mark.invariant("kv_cache.cache_fixed")
@given(sizes=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4)))
def test_a_cache_is_zeros_of_its_sizes(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], sizes: tuple[int, ...]
) -> None:
    for dtype in float_dtypes:
        cache = KVCache(*sizes, dtype=dtype, device=device)
        assert len(cache) == 0
        assert cache.keys.shape == cache.values.shape == sizes
        assert cache.keys.dtype == cache.values.dtype == dtype
        assert not cache.keys.any() and not cache.values.any()


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_a_cache_must_be_floating(device: torch.device, dtype: Any) -> None:
    with pytest.raises(InputError, match="floating"):
        KVCache(1, 1, 2, 2, dtype=dtype, device=device)


def _attached(device: torch.device, cache: KVCache, filled: int) -> tuple[Any, torch.Tensor]:
    """A directly built cached module on ``cache``, its first ``filled`` positions run."""
    attn = KVCacheAttention(CFG).to(device).eval()
    attn.kv_cache = cache
    x = torch.randn(cache.keys.shape[0], CFG.T, CFG.C, device=device)  # (B, T, C)
    if filled:
        with torch.no_grad():
            attn(x[:, :filled])
    return attn, x


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize(
    ("sizes", "filled", "chunk", "words"),
    [
        ((2, CFG.H + 1, CFG.T, 4), 0, 1, r"heads and head dim must be \(5, 4\)"),
        ((2, CFG.H, CFG.T, 2), 0, 1, r"heads and head dim must be \(5, 4\)"),
        ((2, CFG.H, 5, 4), 3, 3, "needs 6 positions; the KV cache holds 5"),
        ((2, CFG.H, CFG.T + 4, 4), 9, 3, "needs 12 positions.* cfg.T is 11"),
    ],
)
def test_a_chunk_that_does_not_fit_writes_nothing(
    device: torch.device, sizes: tuple[int, ...], filled: int, chunk: int, words: str
) -> None:
    cache = KVCache(*sizes, dtype=torch.float32, device=device)
    attn, _ = _attached(device, cache, filled)
    keys, values = cache.keys.clone(), cache.values.clone()
    x = torch.randn(sizes[0], chunk, CFG.C, device=device)  # (B, n, C)
    with pytest.raises(InputError, match=words), torch.no_grad():
        attn(x)
    assert len(cache) == filled
    assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize("batch", [1, 3])
def test_a_chunk_of_another_batch_is_refused_not_broadcast(
    device: torch.device, batch: int
) -> None:
    cache = KVCache(2, CFG.H, CFG.T, 4, dtype=torch.float32, device=device)
    attn, _ = _attached(device, cache, 2)
    keys = cache.keys.clone()
    x = torch.randn(batch, 1, CFG.C, device=device)  # (b, 1, C): one row would broadcast
    with pytest.raises(InputError, match=f"batch 2, got {batch}"), torch.no_grad():
        attn(x)
    assert len(cache) == 2 and torch.equal(cache.keys, keys)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_a_cache_on_another_device_is_refused(device: torch.device) -> None:
    cache = KVCache(1, CFG.H, CFG.T, 4, dtype=torch.float32, device=torch.device("meta"))
    attn, x = _attached(device, cache, 0)
    with pytest.raises(InputError, match="meta"), torch.no_grad():
        attn(x[:, :2])
    assert len(cache) == 0


@pytest.mark.invariant("kv_cache.switch_in_place")
@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
def test_a_directly_built_module_with_a_cache_matches_its_full_run(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], tol: Tol
) -> None:
    for dtype in float_dtypes:
        torch.manual_seed(0)
        attn = KVCacheAttention(CFG).to(device=device, dtype=dtype).eval()
        x = torch.randn(2, CFG.T, CFG.C, device=device, dtype=dtype)  # (B, T, C)
        with torch.no_grad():
            full, probs = attn(x, return_attn=True)  # (B, T, C), (B, H, T, T)
            (cache,) = use_kv_cache(attn, 2)
            p = 0
            for n in (4, 1, 1, 5):
                y, rows = attn(x[:, p : p + n], return_attn=True)  # (B, n, C), (B, H, n, p + n)
                torch.testing.assert_close(y, full[:, p : p + n], **tol(dtype))
                torch.testing.assert_close(rows, probs[:, :, p : p + n, : p + n], **tol(dtype))
                p += n
        assert len(cache) == CFG.T
        drop_kv_cache(attn)
        assert type(attn) is KVCacheAttention and attn.kv_cache is None
