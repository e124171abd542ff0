"""Padded generation's caches and output: one KV cache a layer holding the padded
frame, no step attending to a cached pad, the output's layout, the unpadded path,
and a no-cache loop of ``padded_forward`` giving the same greedy ids.

``test_padding_generate.py`` holds the greedy, sampling and eos tests against
each row alone.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.attention import KVCache
from niels_gpt.model.padding import generate, padded_forward

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]

_SPEC = importlib.util.spec_from_file_location(
    "padding_builders", Path(__file__).with_name("_builders.py")
)
assert _SPEC is not None and _SPEC.loader is not None
kit = importlib.util.module_from_spec(_SPEC)  # the builders these tests share (_builders.py)
_SPEC.loader.exec_module(kit)

# --- the caches ---------------------------------------------


def _record(module: torch.nn.Module, args: tuple[Any, ...], calls: list[Any]) -> None:
    """(input length, attached cache, its length, its keys' storage) of one attention call."""
    cache = module.kv_cache
    assert isinstance(cache, KVCache)
    calls.append((args[0].shape[1], cache, len(cache), cache.keys.data_ptr()))


@pytest.mark.invariant("padding.prefill_then_single_tokens")
@pytest.mark.parametrize("fast", [False, True])
def test_one_kv_cache_a_layer_holds_the_padded_frame(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=29, T=13, C=12, L=2, H=3, d_ff=10, dropout=0.3, rope_theta=41.0)
    pads, t, new = [4, 0, 2], 6, 6
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 2, fast)
        prompt = kit.prompt(cfg, 3, t, 4, device)  # (3, t)
        seen: list[list[tuple[int, Any, int, int]]] = [[] for _ in model.blocks]
        handles = [
            blk.attn.register_forward_pre_hook(lambda m, a, calls=calls: _record(m, a, calls))
            for blk, calls in zip(model.blocks, seen, strict=True)
        ]
        try:
            ids = generate(
                model, prompt, kit.mask(pads, t, device), new, temperature=0.7, top_p=0.9
            )
        finally:
            for h in handles:
                h.remove()
        assert isinstance(ids, torch.Tensor)
        caches = [calls[0][1] for calls in seen]
        assert len({id(c) for c in caches}) == cfg.L
        for calls, cache in zip(seen, caches, strict=True):
            assert [n for n, _, _, _ in calls] == [t] + [1] * (new - 1)
            assert all(c is cache for _, c, _, _ in calls)
            assert [p for _, _, p, _ in calls] == [0, *range(t, t + new - 1)]
            assert len({ptr for _, _, _, ptr in calls}) == 1  # the same storage throughout
            assert cache.keys.shape == (3, cfg.H, t + new, cfg.C // cfg.H)  # what the call needs
            assert cache.keys.dtype == dtype
            assert len(cache) == t + new - 1
        # The frame: row b's real keys sit at their columns, equal to the row alone's.
        for b, p in enumerate(pads):
            row = ids[b : b + 1, p : t + new - 1]  # (1, t - p + new - 1)
            alone = kv_cache.use_kv_cache(model, 1)
            with torch.no_grad():
                model(row)
            for mine, ref in zip(caches, alone, strict=True):
                n = row.shape[1]
                torch.testing.assert_close(
                    mine.keys[b, :, p : p + n], ref.keys[0, :, :n], **tol(dtype)
                )
                torch.testing.assert_close(
                    mine.values[b, :, p : p + n], ref.values[0, :, :n], **tol(dtype)
                )
            kv_cache.drop_kv_cache(model)


@pytest.mark.invariant("padding.prefill_then_single_tokens")
def test_a_step_attends_to_no_cached_pad(device: torch.device, randomise: Randomise) -> None:
    # Garbage written over the pads' cached keys and values changes nothing.
    cfg = ModelConfig(V=23, T=12, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 3)
    prompt = kit.prompt(cfg, 2, 5, 1, device)  # (2, 5)
    mask = kit.mask([3, 0], 5, device)
    clean = generate(model, prompt, mask, 6, temperature=0.0)

    def spoil(module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
        cache = module.kv_cache
        assert isinstance(cache, KVCache)
        cache.keys[0, :, :3] = 1e4
        cache.values[0, :, :3] = -1e4

    handles = [blk.attn.register_forward_hook(spoil) for blk in model.blocks]
    try:
        spoiled = generate(model, prompt, mask, 6, temperature=0.0)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(spoiled, clean)


# --- output ---------------------------------------------


@pytest.mark.invariant("padding.output_contract")
@pytest.mark.parametrize("per_row", [False, True])
def test_output_keeps_the_padded_prompt_and_zero_new_tokens_copies(
    device: torch.device, randomise: Randomise, per_row: bool
) -> None:
    cfg = ModelConfig(V=17, T=9, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 5)
    prompt = kit.prompt(cfg, 3, 4, 2, device)  # (3, 4)
    mask = kit.mask([3, 1, 0], 4, device)
    gen: Any = [torch.Generator(device=device) for _ in range(3)] if per_row else None
    out, traces = generate(model, prompt, mask, 5, generator=gen, trace_layer=1)
    assert out.shape == (3, 9) and out.dtype == torch.int64 and out.device == prompt.device
    assert torch.equal(out[:, :4], prompt) and ((out >= 0) & (out < cfg.V)).all()
    assert len(traces) == 5 and all(not tr.requires_grad for tr in traces)
    same, none = generate(model, prompt, mask, 0, generator=gen, trace_layer=0)
    assert torch.equal(same, prompt) and same.data_ptr() != prompt.data_ptr() and none == []
    alone = generate(model, prompt, None, 0)
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, prompt)


@pytest.mark.invariant("padding.unpadded_exact")
@pytest.mark.parametrize("fast", [False, True])
def test_no_pad_is_kv_cache_generate_and_a_generator_list_still_matches_rows(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise, fast: bool
) -> None:
    cfg = ModelConfig(V=21, T=11, C=12, L=2, H=3, d_ff=10, dropout=0.0, rope_theta=77.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 6, fast, scale=0.4)
    prompt = kit.prompt(cfg, 2, 4, 8, device)  # (2, 4)
    full = torch.ones(2, 4, dtype=torch.bool, device=device)
    for mask in (None, full):
        g1, g2 = (torch.Generator(device=device).manual_seed(3) for _ in range(2))
        got, got_tr = generate(
            model, prompt, mask, 7, top_k=5, eos_id=1, generator=g1, trace_layer=0
        )
        want, want_tr = kv_cache.generate(
            model, prompt, 7, top_k=5, eos_id=1, generator=g2, trace_layer=0
        )
        assert torch.equal(got, want)
        assert all(torch.equal(a, b) for a, b in zip(got_tr, want_tr, strict=True))
        gens = [torch.Generator(device=device).manual_seed(s) for s in (4, 5)]
        rows = generate(model, prompt, mask, 7, top_k=5, generator=gens)
        for b, s in enumerate((4, 5)):
            g = torch.Generator(device=device).manual_seed(s)
            one = kv_cache.generate(model, prompt[b : b + 1], 7, top_k=5, generator=g)
            assert isinstance(one, torch.Tensor) and isinstance(rows, torch.Tensor)
            assert torch.equal(rows[b], one[0])


@pytest.mark.invariant("padding.padding_invariance")
def test_a_no_cache_loop_of_padded_forward_gives_the_same_greedy_ids(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise
) -> None:
    cfg = ModelConfig(V=33, T=12, C=16, L=2, H=4, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 9)
    pads, t, new = [0, 5, 2], 6, 6
    prompt = kit.prompt(cfg, 3, t, 3, device)  # (3, t)
    ids = generate(model, prompt, kit.mask(pads, t, device), new, temperature=0.0)
    assert isinstance(ids, torch.Tensor)
    loop = prompt.clone()  # (3, t), grown below
    with torch.no_grad():
        for _ in range(new):
            width = loop.shape[1]
            logits = padded_forward(model, loop, kit.mask(pads, width, device))  # (3, width, V)
            assert isinstance(logits, torch.Tensor)
            loop = torch.cat([loop, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ids, loop)
