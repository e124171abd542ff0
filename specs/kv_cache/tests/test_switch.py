"""Acceptance tests of the in-place switch and of ``KVCache`` (stage kv_cache).

``use_kv_cache`` must reach explicit and fast-path attention alike and change
nothing but each attention module's class and attached cache;
``drop_kv_cache`` gives every module back the class it had. The fast path is
imported here as a user would; the stage itself must not depend on it.
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
from niels_gpt.model.blocks import Block
from niels_gpt.model.fastpath import FastCausalSelfAttention, sdpa_kernel, use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import KVCache, KVCacheAttention, drop_kv_cache, use_kv_cache

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]

CFG = ModelConfig(V=41, T=16, C=24, L=3, H=3, d_ff=20, dropout=0.2, rope_theta=300.0)


def _gpt(device: torch.device, randomise: Randomise, fast: bool = False) -> GPT:
    model = GPT(CFG)
    randomise(model, 7)
    model.to(device).eval()
    if fast:
        use_fast_attention(model)
    return model


def _attention(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def _snapshot(model: torch.nn.Module) -> tuple[list[int], list[int], dict[str, torch.Tensor]]:
    modules = [id(m) for m in model.modules()]
    tensors = [id(t) for t in (*model.parameters(), *model.buffers())]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return modules, tensors, state


@pytest.mark.invariant("kv_cache.switch_in_place")
@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_switch_attaches_one_fresh_cache_per_layer(
    device: torch.device, randomise: Randomise, fast: bool
) -> None:
    model = _gpt(device, randomise, fast)
    modules, tensors, state = _snapshot(model)
    keys_before = set(model.state_dict())
    caches = use_kv_cache(model, 2)
    assert isinstance(caches, list) and len(caches) == CFG.L
    D = CFG.C // CFG.H
    for block, cache in zip(model.blocks, caches, strict=True):
        assert isinstance(block, Block)
        assert type(block.attn) is CausalSelfAttention  # set up, no class switched
        assert block.attn.kv_cache is cache
        assert isinstance(cache, KVCache) and len(cache) == 0
        for store in (cache.keys, cache.values):
            assert store.shape == (2, CFG.H, CFG.T, D)
            assert store.dtype == torch.float32 and store.device.type == device.type
            assert not store.any()  # zero-filled
    assert caches[0].keys.data_ptr() != caches[1].keys.data_ptr()
    after_modules, after_tensors, after_state = _snapshot(model)
    assert after_modules == modules and after_tensors == tensors  # same objects, in place
    assert set(model.state_dict()) == keys_before  # no cache in the state_dict
    for k, v in state.items():
        assert torch.equal(after_state[k], v), k
    again = use_kv_cache(model, 3)  # a reset: fresh caches, still switched
    assert all(len(c) == 0 and c.keys.shape[0] == 3 for c in again)
    assert all(a is not b for a, b in zip(again, caches, strict=True))
    assert drop_kv_cache(model) is model
    assert all(type(m) is CausalSelfAttention for m in _attention(model))
    assert all(m.kernel is (sdpa_kernel if fast else None) for m in _attention(model))
    assert all(getattr(m, "kv_cache", None) is None for m in _attention(model))
    assert _snapshot(model)[:2] == (modules, tensors)


@pytest.mark.invariant("kv_cache.switch_in_place")
def test_switched_state_dict_loads_both_ways(device: torch.device, randomise: Randomise) -> None:
    plain = _gpt(device, randomise)
    switched = GPT(CFG).to(device)
    use_kv_cache(switched, 1)
    switched.load_state_dict(plain.state_dict(), strict=True)  # a checkpoint loads into it
    back = GPT(CFG).to(device)
    back.load_state_dict(switched.state_dict(), strict=True)
    for (name, a), b in zip(plain.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.invariant("kv_cache.switch_in_place")
def test_optimizer_built_before_the_switch_still_steps_the_weights(
    device: torch.device, randomise: Randomise
) -> None:
    model = _gpt(device, randomise)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    use_kv_cache(model, 1)
    drop_kv_cache(model)
    x = torch.randint(0, CFG.V, (1, 5), generator=torch.Generator().manual_seed(0)).to(device)
    before = model.blocks[0].attn.qkv.weight.detach().clone()
    model.train()(x).square().mean().backward()
    opt.step()
    assert not torch.equal(model.blocks[0].attn.qkv.weight, before)


@pytest.mark.invariant("kv_cache.switch_in_place")
@given(
    H=st.integers(1, 3), half_D=st.integers(1, 3), T=st.integers(1, 12), seed=st.integers(0, 999)
)
def test_attention_built_directly_without_cache_is_the_explicit_module(
    device: torch.device, tol: Tol, H: int, half_D: int, T: int, seed: int
) -> None:
    cfg = ModelConfig(V=8, T=T, C=2 * half_D * H, H=H, d_ff=8, dropout=0.0)
    torch.manual_seed(seed)
    explicit = CausalSelfAttention(cfg).to(device)
    cached = KVCacheAttention(cfg).to(device)
    assert cached.kv_cache is None
    cached.load_state_dict(explicit.state_dict(), strict=True)
    x = torch.randn(2, T, cfg.C, device=device)  # (B, T, C)
    y_e, p_e = explicit(x, return_attn=True)
    y_c, p_c = cached(x, return_attn=True)
    torch.testing.assert_close(y_c, y_e, **tol(torch.float32))
    torch.testing.assert_close(p_c, p_e, **tol(torch.float32))
    use_kv_cache(cached, 2)
    drop_kv_cache(cached)  # built directly: keeps its class, loses its cache
    assert type(cached) is KVCacheAttention and cached.kv_cache is None


@pytest.mark.invariant("kv_cache.switch_in_place")
def test_switch_reaches_any_tree_of_attention(device: torch.device) -> None:
    block = Block(CFG).to(device)
    (cache,) = use_kv_cache(block, 2)
    assert block.attn.kv_cache is cache
    drop_kv_cache(block)
    attn = FastCausalSelfAttention(CFG).to(device)
    (cache,) = use_kv_cache(attn, 1)
    assert type(attn) is FastCausalSelfAttention and attn.kv_cache is cache
    drop_kv_cache(attn)
    assert type(attn) is FastCausalSelfAttention
    tree = torch.nn.ModuleList([CausalSelfAttention(CFG), FastCausalSelfAttention(CFG)]).to(device)
    assert len(use_kv_cache(tree, 1)) == 2
    drop_kv_cache(tree)
    assert [type(m) for m in tree] == [CausalSelfAttention, FastCausalSelfAttention]


class _OtherAttention(CausalSelfAttention):
    """A subclass with a forward of its own: the cache cannot know its math."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().forward(x, **kwargs)


@pytest.mark.invariant("kv_cache.switch_refuses_unknown")
def test_switch_refuses_unknown_subclass_before_switching_anything(device: torch.device) -> None:
    model = GPT(CFG).to(device)
    model.blocks[2].attn.__class__ = _OtherAttention
    with pytest.raises(TypeError):
        use_kv_cache(model, 1)
    assert [type(b.attn) for b in model.blocks] == [
        CausalSelfAttention,
        CausalSelfAttention,
        _OtherAttention,
    ]
    assert all(getattr(b.attn, "kv_cache", None) is None for b in model.blocks)


@pytest.mark.invariant("kv_cache.switch_refuses_unknown")
@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0, None])
def test_switch_refuses_bad_batch_size(device: torch.device, batch_size: object) -> None:
    model = GPT(CFG).to(device)
    with pytest.raises(TypeError):
        use_kv_cache(model, batch_size)  # type: ignore[arg-type]
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)


@pytest.mark.invariant("kv_cache.switch_refuses_unknown")
def test_switch_refuses_a_tree_without_attention(device: torch.device) -> None:
    with pytest.raises(TypeError):
        use_kv_cache(torch.nn.Linear(3, 3).to(device), 1)


@pytest.mark.invariant("kv_cache.cache_fixed")
def test_kv_cache_allocates_zeros_once(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...]
) -> None:
    for dtype in float_dtypes:
        cache = KVCache(2, 3, 7, 4, dtype=dtype, device=device)
        assert len(cache) == 0
        for store in (cache.keys, cache.values):
            assert store.shape == (2, 3, 7, 4) and store.dtype == dtype
            assert store.device.type == device.type and not store.any()
        assert cache.keys.data_ptr() != cache.values.data_ptr()


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize(
    "sizes",
    [(0, 1, 1, 2), (1, 0, 1, 2), (1, 1, 0, 2), (1, 1, 1, 0), (True, 1, 1, 2), (1.0, 1, 1, 2)],
)
def test_kv_cache_rejects_bad_sizes(device: torch.device, sizes: tuple[object, ...]) -> None:
    with pytest.raises(InputError):
        KVCache(*sizes, dtype=torch.float32, device=device)  # type: ignore[arg-type]
