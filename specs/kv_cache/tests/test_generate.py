"""Acceptance tests of ``generate`` (stage kv_cache).

References are no-cache loops over the model's own ``forward``: an argmax loop
for greedy decoding, and for sampling a loop that filters the last logits with
the float64 filter of ``_kit.py`` (written from the spec's definitions) and draws with
``torch.multinomial`` from a generator seeded like the one ``generate`` gets.
Token-for-token comparisons run in float64, where the cached and the no-cache
logits agree to about 1e-14, so no near-tie can flip a choice.
"""

from __future__ import annotations

import importlib.util
import math
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
from niels_gpt.model.kv_cache import (
    KVCacheAttention,
    check_generator,
    drop_kv_cache,
    generate,
    use_kv_cache,
)

_SPEC = importlib.util.spec_from_file_location("kv_cache_kit", Path(__file__).with_name("_kit.py"))
assert _SPEC is not None and _SPEC.loader is not None
kit = importlib.util.module_from_spec(_SPEC)  # the stage's shared builders (_kit.py)
_SPEC.loader.exec_module(kit)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@st.composite
def configs(draw: st.DrawFn, max_V: int = 40) -> ModelConfig:
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, max_V)),
        T=draw(st.integers(2, 16)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


# --- references -------------------------------------------------------------


def greedy_loop(model: GPT, prompt: torch.Tensor, new: int) -> torch.Tensor:
    ids = prompt  # (B, t)
    with torch.no_grad():
        for _ in range(new):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, nxt], dim=1)  # (B, t + i + 1)
    return ids


def with_eos(ref: torch.Tensor, t: int, eos: int) -> tuple[torch.Tensor, int]:
    """Rows of a no-eos run cut at their first generated eos; and the steps run."""
    out = ref.clone()  # (B, t + new)
    new = ref.shape[1] - t
    finished: list[int] = []
    for r in range(ref.shape[0]):
        hits = (ref[r, t:] == eos).nonzero().flatten().tolist()
        if hits:
            out[r, t + hits[0] + 1 :] = eos
            finished.append(hits[0])
    steps = new if len(finished) < ref.shape[0] else min(new, max(finished) + 1)
    return out, steps


def sampling_loop(
    model: GPT,
    prompt: torch.Tensor,
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator,
) -> torch.Tensor:
    B, t = prompt.shape
    out = torch.full((B, t + new), -1, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    out[:, :t] = prompt
    finished = torch.zeros(B, dtype=torch.bool, device=prompt.device)  # (B,)
    with torch.no_grad():
        for i in range(new):
            logits = model(out[:, : t + i])[:, -1]  # (B, V)
            probs = torch.softmax(kit.reference_filter(logits, **knobs), dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (B,), every row
            if eos is not None:
                nxt = torch.where(finished, torch.full_like(nxt, eos), nxt)  # (B,)
                finished |= nxt == eos
            out[:, t + i] = nxt
            if eos is not None and bool(finished.all()):
                out[:, t + i + 1 :] = eos
                break
    return out


def _watch(model: GPT) -> tuple[list[list[tuple[int, Any, tuple[Any, ...]]]], list[Any]]:
    """Per layer, for every attention call: the input length, the cache, its state."""
    seen: list[list[tuple[int, Any, tuple[Any, ...]]]] = [[] for _ in model.blocks]
    handles = []
    for layer, block in enumerate(model.blocks):

        def hook(
            module: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            layer: int = layer,
        ) -> None:
            x = args[0] if args else kwargs["x"]
            cache = getattr(module, "kv_cache", None)
            state: tuple[Any, ...] = ()
            if cache is not None:
                state = (
                    cache.keys.data_ptr(),
                    cache.values.data_ptr(),
                    tuple(cache.keys.shape),
                    tuple(cache.values.shape),
                    cache.keys.dtype,
                    len(cache),
                )
            seen[layer].append((x.shape[1], cache, state))

        handles.append(block.attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


# --- greedy -------------------------------------------------------------------


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
@settings(max_examples=15)
@given(
    cfg=configs(),
    B=st.integers(1, 3),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_greedy_matches_the_no_cache_argmax_loop(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    cfg: ModelConfig,
    B: int,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]  # float64 where the device has it
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = kit.model(cfg, device, dtype, randomise, seed, fast)
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    gen = _generator(device, seed)
    state = gen.get_state()
    got = generate(model, prompt, new, temperature=0.0, generator=gen)
    assert torch.equal(got, greedy_loop(model, prompt, new))
    assert torch.equal(gen.get_state(), state)  # greedy draws nothing


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
@pytest.mark.parametrize("fast", [False, True])
def test_greedy_float32_matches_the_loop(
    device: torch.device, randomise: kit.Randomise, fast: bool
) -> None:
    cfg = ModelConfig(V=67, T=32, C=32, L=2, H=4, d_ff=48, dropout=0.1)
    model = kit.model(cfg, device, torch.float32, randomise, 21, fast)
    prompt = kit.tokens(cfg, 3, 6, 9, device)  # (3, 6)
    got = generate(model, prompt, cfg.T - 6, temperature=0)
    assert torch.equal(got, greedy_loop(model, prompt, cfg.T - 6))


# --- sampling -------------------------------------------------------------------


@pytest.mark.invariant("kv_cache.sampling_exact")
@settings(max_examples=15)
@given(
    cfg=configs(max_V=12),
    B=st.integers(1, 3),
    temperature=st.sampled_from([0.4, 1.0, 1.9]),
    top_k=st.none() | st.integers(1, 14),
    top_p=st.none() | st.sampled_from([0.3, 0.65, 0.9, 1.0]),
    use_eos=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_seeded_sampling_matches_the_reference_loop(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    cfg: ModelConfig,
    B: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    use_eos: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = kit.model(cfg, device, dtype, randomise, seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)  # flatter distributions: more than one token in play
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    knobs: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    eos = None
    if use_eos:  # a token the run draws, so some row does finish
        drawn = sampling_loop(model, prompt, new, knobs, None, _generator(device, seed))
        eos = int(data.draw(st.sampled_from(drawn[:, t:].flatten().tolist())))
    want = sampling_loop(model, prompt, new, knobs, eos, _generator(device, seed))
    got = generate(model, prompt, new, **knobs, eos_id=eos, generator=_generator(device, seed))
    assert torch.equal(got, want)
    again = generate(model, prompt, new, **knobs, eos_id=eos, generator=_generator(device, seed))
    assert torch.equal(again, got)  # a seeded generator reproduces the ids


@pytest.mark.invariant("kv_cache.sampling_exact")
@pytest.mark.invariant("kv_cache.eos_rows_stop")
def test_finished_rows_still_take_part_in_every_draw(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    # Row 0 finishes at its first token; the draws of the later steps must still
    # cover all rows, so the other rows see the same random stream as without eos.
    cfg = ModelConfig(V=50, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 12)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.2)  # nearly flat: the rows draw different tokens
    prompt = kit.tokens(cfg, 4, 3, 8, device)  # (4, 3)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    drawn = sampling_loop(model, prompt, 11, knobs, None, _generator(device, 3))
    eos = int(drawn[0, 3])
    others = [r for r in range(1, 4) if not (drawn[r, 3:] == eos).any()]
    assert others, f"test set-up: every row drew {eos}; pick another seed"
    want = sampling_loop(model, prompt, 11, knobs, eos, _generator(device, 3))
    got = generate(model, prompt, 11, **knobs, eos_id=eos, generator=_generator(device, 3))
    assert torch.equal(got, want)
    assert (got[0, 3:] == eos).all()
    assert torch.equal(got[others], drawn[others])  # rows that never finish go on as before


@pytest.mark.invariant("kv_cache.sampling_exact")
def test_sampling_uses_the_global_generator_without_one(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=9, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.1)  # nearly uniform: runs differ unless seeded alike
    prompt = kit.tokens(cfg, 4, 2, 0, device)  # (4, 2)
    torch.manual_seed(5)
    first = generate(model, prompt, 10)
    torch.manual_seed(5)
    assert torch.equal(generate(model, prompt, 10), first)
    torch.manual_seed(6)
    assert not torch.equal(generate(model, prompt, 10), first)


# --- eos, steps and the cache seen from generate ----------------------------------


@pytest.mark.invariant("kv_cache.eos_rows_stop")
@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
@settings(max_examples=15)
@given(cfg=configs(max_V=10), B=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_rows_that_hit_eos_stop_and_the_rest_go_on(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    cfg: ModelConfig,
    B: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = kit.model(cfg, device, dtype, randomise, seed)
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    ref = greedy_loop(model, prompt, new)  # (B, t + new), no eos
    eos = int(data.draw(st.sampled_from(ref.flatten().tolist())))  # prompt or generated
    want, steps = with_eos(ref, t, eos)
    seen, handles = _watch(model)
    try:
        got = generate(model, prompt, new, temperature=0.0, eos_id=eos)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(got, want)
    assert [n for n, _, _ in seen[0]] == [t] + [1] * (steps - 1)  # stops when all finished


@pytest.mark.invariant("kv_cache.eos_rows_stop")
def test_a_finished_row_is_frozen_while_the_others_go_on(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=50, T=16, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 9)
    prompt = kit.tokens(cfg, 4, 3, 6, device)  # (4, 3)
    ref = greedy_loop(model, prompt, 13)  # (4, 16), no eos
    # An eos that one row generates and would not repeat next, and another row never
    # generates: freezing, padding and carrying on are all visible.
    choices = [
        (r, int(ref[r, 3 + j]))
        for r in range(4)
        for j in range(12)
        if ref[r, 3 + j] != ref[r, 4 + j]
        and any(not (ref[o, 3:] == ref[r, 3 + j]).any() for o in range(4) if o != r)
    ]
    assert choices, "test set-up: no usable eos in this greedy run; pick another seed"
    row, eos = choices[0]
    want, steps = with_eos(ref, 3, eos)
    assert steps == 13  # some row never finishes
    got = generate(model, prompt, 13, temperature=0.0, eos_id=eos)
    assert torch.equal(got, want)
    first = int((ref[row, 3:] == eos).nonzero()[0])
    assert (got[row, 3 + first :] == eos).all()
    assert not torch.equal(got[row], ref[row])  # the row did stop


@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
def test_generation_stops_once_every_row_has_finished(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=30, T=20, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 5)
    prompt = kit.tokens(cfg, 1, 3, 2, device).expand(2, 3).contiguous()  # two equal rows
    ref = greedy_loop(model, prompt, 12)
    eos = int(ref[0, 3 + 4])  # generated at step 4 (or earlier)
    first = int((ref[0, 3:] == eos).nonzero()[0])
    seen, handles = _watch(model)
    try:
        got, traces = generate(model, prompt, 12, temperature=0.0, eos_id=eos, trace_layer=1)
    finally:
        for h in handles:
            h.remove()
    assert got.shape == (2, 15)
    assert (got[:, 3 + first :] == eos).all()
    assert len(seen[0]) == len(traces) == first + 1


@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_prefill_once_then_one_token_a_step_through_one_cache(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=37, T=18, C=24, L=3, H=3, d_ff=16, dropout=0.1)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 4, fast)
        prompt = kit.tokens(cfg, 2, 5, 1, device)  # (2, 5)
        new = cfg.T - 5
        seen, handles = _watch(model)
        try:
            generate(model, prompt, new, temperature=0.8, top_k=7)
        finally:
            for h in handles:
                h.remove()
        for calls in seen:
            assert [n for n, _, _ in calls] == [5] + [1] * (new - 1)
            caches = {id(c) for _, c, _ in calls}
            assert len(caches) == 1 and None not in [c for _, c, _ in calls]
            states = [s for _, _, s in calls]
            assert len({s[:5] for s in states}) == 1  # same storage, shape and dtype
            keys_shape, values_shape, cache_dtype = states[0][2:5]
            assert keys_shape == values_shape == (2, cfg.H, cfg.T, cfg.C // cfg.H)
            assert cache_dtype == dtype
            assert [s[5] for s in states] == [0, *range(5, 5 + new - 1)]  # lengths


@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_caches_are_sized_to_what_the_call_needs(
    device: torch.device, randomise: kit.Randomise, fast: bool
) -> None:
    """2.0: generate's caches hold t + max_new_tokens positions, not cfg.T; use_kv_cache
    takes max_len (cfg.T by default) and refuses one outside [1, cfg.T]."""
    cfg = ModelConfig(V=37, T=18, C=24, L=2, H=3, d_ff=16, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 4, fast)
    seen, handles = _watch(model)
    try:
        generate(model, kit.tokens(cfg, 2, 3, 1, device), 4, temperature=0)
    finally:
        for h in handles:
            h.remove()
    D = cfg.C // cfg.H
    for calls in seen:
        assert {s[2] for _, _, s in calls} == {(2, cfg.H, 3 + 4, D)}
    caches = use_kv_cache(model, 2, max_len=5)
    assert [tuple(c.keys.shape) for c in caches] == [(2, cfg.H, 5, D)] * cfg.L
    assert [tuple(c.values.shape) for c in use_kv_cache(model, 1)] == [(1, cfg.H, cfg.T, D)] * 2
    kept = [b.attn.kv_cache for b in model.blocks]
    for bad in (0, cfg.T + 1, True, 2.0):
        with pytest.raises(TypeError):
            use_kv_cache(model, 2, max_len=bad)  # type: ignore[arg-type]
    assert [b.attn.kv_cache for b in model.blocks] == kept  # refused: nothing set up
    drop_kv_cache(model)
    assert all(getattr(b.attn, "kv_cache", None) is None for b in model.blocks)


# --- traces -----------------------------------------------------------------


@pytest.mark.invariant("kv_cache.trace_matches_full")
@pytest.mark.invariant("kv_cache.output_contract")
@settings(max_examples=12)
@given(
    cfg=configs(max_V=10),
    B=st.integers(1, 3),
    use_eos=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_step_traces_match_forward_with_attn_trace(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    B: int,
    use_eos: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    eos = data.draw(st.integers(0, cfg.V - 1)) if use_eos else None
    model = kit.model(cfg, device, dtype, randomise, seed)
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    ids, traces = generate(model, prompt, new, temperature=0.0, eos_id=eos, trace_layer=layer)
    assert isinstance(traces, list) and 1 <= len(traces) <= new
    if len(traces) < new:  # stopped early: every row must have finished
        assert eos is not None
        assert all((row == eos).any() for row in ids[:, t : t + len(traces)])
    with torch.no_grad():
        for i, trace in enumerate(traces):
            _, ref = model.forward_with_attn_trace(ids[:, : t + i], layer)
            assert trace.shape == (B, cfg.H, t + i) and trace.dtype == ref["attn_row"].dtype
            torch.testing.assert_close(trace, ref["attn_row"], **tol(dtype))


# --- the output and the model afterwards -----------------------------------------


@pytest.mark.invariant("kv_cache.output_contract")
def test_output_is_the_prompt_then_the_new_ids(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=13, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 2)
        prompt = kit.tokens(cfg, 3, 4, 7, device)  # (3, 4)
        for temperature in (0.0, 1.0):
            out = generate(model, prompt, 6, temperature=temperature)
            assert isinstance(out, torch.Tensor)
            assert out.shape == (3, 10) and out.dtype == torch.int64
            assert out.device == prompt.device and not out.requires_grad
            assert torch.equal(out[:, :4], prompt)
            assert ((out >= 0) & (out < cfg.V)).all()
        ids, traces = generate(model, prompt, 6, trace_layer=0)
        assert ids.shape == (3, 10) and len(traces) == 6
        assert [tuple(tr.shape) for tr in traces] == [(3, cfg.H, 4 + i) for i in range(6)]
        assert all(tr.device == prompt.device and not tr.requires_grad for tr in traces)
        same = generate(model, prompt, 0)
        assert isinstance(same, torch.Tensor)
        assert torch.equal(same, prompt) and same.data_ptr() != prompt.data_ptr()
        assert generate(model, prompt, 0, trace_layer=1)[1] == []
        full = generate(model, prompt, cfg.T - 4)  # exactly cfg.T in all
        assert isinstance(full, torch.Tensor) and full.shape == (3, cfg.T)


def _state(model: GPT) -> tuple[list[type], list[Any], list[bool], dict[str, torch.Tensor]]:
    attn = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    return (
        [type(m) for m in attn],
        [getattr(m, "kv_cache", None) for m in attn],
        [m.training for m in model.modules()],
        {k: v.clone() for k, v in model.state_dict().items()},
    )


def _assert_same_state(model: GPT, before: tuple[Any, ...]) -> None:
    classes, caches, flags, weights = _state(model)
    assert classes == before[0]
    assert all(a is b for a, b in zip(caches, before[1], strict=True))
    assert flags == before[2]
    for k, v in weights.items():
        assert torch.equal(v, before[3][k]), k


@pytest.mark.invariant("kv_cache.generate_leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_generate_hands_the_model_back_as_it_was(
    device: torch.device, randomise: kit.Randomise, fast: bool, training: bool
) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = kit.model(cfg, device, torch.float32, randomise, 6, fast).train(training)
    before = _state(model)
    generate(model, kit.tokens(cfg, 2, 3, 1, device), 5, top_p=0.9, trace_layer=1)
    _assert_same_state(model, before)


@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_generate_keeps_the_callers_own_caches(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 6, fast=True)
    x = kit.tokens(cfg, 1, 4, 1, device)  # (1, 4)
    caches = use_kv_cache(model, 1)
    with torch.no_grad():
        model(x)
    kept = [(c.keys.clone(), c.values.clone()) for c in caches]
    before = _state(model)
    got = generate(model, kit.tokens(cfg, 3, 2, 2, device), 6, temperature=0)
    _assert_same_state(model, before)
    assert [len(c) for c in caches] == [4, 4]
    for c, (k, v) in zip(caches, kept, strict=True):
        assert torch.equal(c.keys, k) and torch.equal(c.values, v)
    drop_kv_cache(model)  # the fast path's kernel stays
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)
    assert torch.equal(got, generate(model, kit.tokens(cfg, 3, 2, 2, device), 6, temperature=0))


@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_generate_restores_the_model_when_a_step_fails(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 6)
    before = _state(model)
    calls = []

    def fail_on_third(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        calls.append(type(module))
        if len(calls) == 3:
            raise RuntimeError("injected failure")

    handle = model.blocks[1].register_forward_pre_hook(fail_on_third)
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            generate(model, kit.tokens(cfg, 2, 3, 1, device), 6)
    finally:
        handle.remove()
    _assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert not isinstance(model.blocks[0].attn, KVCacheAttention)


# --- bad input ----------------------------------------------------------------------

BAD_CFG = ModelConfig(V=11, T=8, C=8, L=2, H=2, d_ff=8, dropout=0.0)


def _bad_calls(device: torch.device) -> dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """name -> (prompt, positional args after the prompt, keyword args)."""
    good = kit.tokens(BAD_CFG, 2, 3, 0, device)  # (2, 3)
    other_device = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    calls: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
        "too-long": (good, (BAD_CFG.T - 3 + 1,), {}),
        "prompt-longer-than-T": (kit.tokens(BAD_CFG, 1, BAD_CFG.T + 1, 0, device), (0,), {}),
        "id-equal-V": (good.clone().fill_(BAD_CFG.V), (2,), {}),
        "id-negative": (good.clone().fill_(-1), (2,), {}),
        "int32-ids": (good.to(torch.int32), (2,), {}),
        "float-ids": (good.to(torch.float32), (2,), {}),
        "other-device": (good.to(other_device), (2,), {}),
        "1-d": (good[0], (2,), {}),
        "3-d": (good[None], (2,), {}),
        "empty-prompt": (good[:, :0], (2,), {}),
        "empty-batch": (good[:0], (2,), {}),
        "list-prompt": (good.tolist(), (2,), {}),
        "negative-new": (good, (-1,), {}),
        "bool-new": (good, (True,), {}),
        "float-new": (good, (2.0,), {}),
        "negative-temperature": (good, (2,), {"temperature": -1.0}),
        "nan-temperature": (good, (2,), {"temperature": float("nan")}),
        "zero-top-k": (good, (2,), {"top_k": 0}),
        "bool-top-k": (good, (2,), {"top_k": True}),
        "zero-top-p": (good, (2,), {"top_p": 0.0}),
        "big-top-p": (good, (2,), {"top_p": 1.01}),
        "eos-equal-V": (good, (2,), {"eos_id": BAD_CFG.V}),
        "eos-negative": (good, (2,), {"eos_id": -1}),
        "bool-eos": (good, (2,), {"eos_id": False}),
        "trace-layer-L": (good, (2,), {"trace_layer": BAD_CFG.L}),
        "trace-layer-negative": (good, (2,), {"trace_layer": -1}),
        "bool-trace-layer": (good, (2,), {"trace_layer": True}),
        "seed-not-generator": (good, (2,), {"generator": 1234}),
    }
    return calls


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_generate_rejects_bad_input_before_any_work(
    device: torch.device, randomise: kit.Randomise, case: str
) -> None:
    calls = _bad_calls(device)
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    prompt, args, kwargs = calls[case]
    forwards: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, a: forwards.append(type(m).__name__))
        for module in (model, model.blocks[0], model.blocks[0].attn)
    ]
    try:
        with pytest.raises(InputError):
            generate(model, prompt, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    assert forwards == []  # not even GPT.forward's own checks ran
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize("t", [3, BAD_CFG.T])
def test_a_too_long_generation_is_named_as_prompt_plus_new_tokens(
    device: torch.device, randomise: kit.Randomise, t: int
) -> None:
    """2.1: generate's own check names what is too long (t + max_new_tokens against cfg.T)."""
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    with pytest.raises(InputError, match=r"t \+ max_new_tokens must be <= cfg\.T = 8"):
        generate(model, kit.tokens(BAD_CFG, 2, t, 0, device), BAD_CFG.T - t + 1)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_generate_rejects_a_model_that_is_not_a_gpt(device: torch.device) -> None:
    model = GPT(BAD_CFG).to(device)
    prompt = kit.tokens(BAD_CFG, 1, 2, 0, device)  # (1, 2)
    with pytest.raises(InputError):
        generate(model.blocks, prompt, 1)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        generate(model.blocks[0], prompt, 1)  # type: ignore[arg-type]


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_the_generator_must_live_on_the_models_device(
    device: torch.device, randomise: kit.Randomise
) -> None:
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    prompt = kit.tokens(BAD_CFG, 2, 3, 0, device)  # (2, 3)
    own = generate(model, prompt, 2, generator=_generator(device, 0))  # accepted
    assert isinstance(own, torch.Tensor) and own.shape == (2, 5)
    if device.type != "cpu":  # a CPU generator for a model elsewhere
        with pytest.raises(InputError):
            generate(model, prompt, 2, generator=torch.Generator())
    with pytest.raises(InputError):
        generate(model, prompt, 2, generator=torch.Generator(device=device).get_state())  # type: ignore[arg-type]


# --- 4.0: per-row generators, inference mode -------------------------------------------


@pytest.mark.invariant("kv_cache.per_row_generators")
def test_a_generator_list_draws_each_row_from_its_own(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    """Row b of a batch with generator[b] is row b generated alone with that generator."""
    cfg = ModelConfig(V=30, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 4)
    prompt = kit.tokens(cfg, 3, 4, 2, device)  # (3, 4)
    knobs: dict[str, Any] = {"temperature": 0.9, "top_k": 12, "top_p": 0.95}
    seeds = (5, 6, 7)
    got = generate(model, prompt, 7, **knobs, generator=[_generator(device, s) for s in seeds])
    assert isinstance(got, torch.Tensor) and got.shape == (3, 11)
    for b, seed in enumerate(seeds):
        alone = generate(model, prompt[b : b + 1], 7, **knobs, generator=_generator(device, seed))
        assert torch.equal(got[b : b + 1], alone)
    gens = tuple(_generator(device, s) for s in seeds)
    assert torch.equal(generate(model, prompt, 7, **knobs, generator=gens), got)  # a tuple too
    if device.type == "cpu":  # one generator shared by every row: drawn row 0 first
        shared = _generator(device, 9)
        rows = generate(model, prompt, 7, generator=[shared] * 3)
        assert torch.equal(rows, generate(model, prompt, 7, generator=_generator(device, 9)))


@pytest.mark.invariant("kv_cache.per_row_generators")
@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_a_bad_generator_list_is_refused_before_any_forward(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=20, T=10, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 1)
    prompt = kit.tokens(cfg, 2, 3, 1, device)  # (2, 3)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    for bad in ([_generator(device, 1)], [_generator(device, 1)] * 3, [_generator(device, 1), 3]):
        with pytest.raises(InputError, match="generator"):
            generate(model, prompt, 2, generator=bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="generator"):
            check_generator(bad, 2, device)
    assert calls == []
    one = _generator(device, 1)
    for good in (None, one, [one, _generator(device, 2)], (one, one)):
        assert check_generator(good, 2, device) is None


@pytest.mark.invariant("kv_cache.inference_mode")
@pytest.mark.invariant("kv_cache.output_contract")
def test_generate_decodes_in_inference_mode_and_returns_ordinary_tensors(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=20, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 3)
    prompt = kit.tokens(cfg, 2, 3, 1, device)  # (2, 3)
    modes: list[bool] = []
    hook = model.blocks[0].register_forward_pre_hook(  # the traced steps call no GPT hook
        lambda *_: modes.append(torch.is_inference_mode_enabled())
    )
    ids, traces = generate(model, prompt, 4, temperature=0.0, trace_layer=1)
    hook.remove()
    assert modes == [True] * 4  # the prefill and three one-token steps
    assert not ids.is_inference() and not any(tr.is_inference() for tr in traces)
    model.train()
    loss = model(ids).logsumexp(-1).mean()  # generated ids as a training batch
    loss.backward()
    assert model.tok_emb.weight.grad is not None


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_check_knobs_is_the_knob_check_generate_runs(
    device: torch.device, randomise: kit.Randomise
) -> None:
    """4.2: the public knob check refuses what generate refuses, with the same message."""
    from niels_gpt.model.kv_cache import check_knobs  # 4.2's export: the rest collect without it

    cfg = ModelConfig(V=20, T=10, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 1)
    prompt = kit.tokens(cfg, 2, 3, 1, device)  # (2, 3)
    bad: list[tuple[Any, Any, Any]] = [
        (-0.5, None, None),
        (math.inf, None, None),
        (math.nan, None, None),
        (True, None, None),
        (1.0, 0, None),
        (1.0, 2.0, None),
        (1.0, True, None),
        (1.0, None, 0.0),
        (1.0, None, 1.5),
        (1.0, None, math.nan),
        (1.0, None, True),
    ]
    for temperature, top_k, top_p in bad:
        with pytest.raises(InputError) as direct:
            check_knobs(temperature, top_k, top_p)
        with pytest.raises(InputError) as through:
            generate(model, prompt, 2, temperature=temperature, top_k=top_k, top_p=top_p)
        assert str(direct.value) == str(through.value)
        assert repr(
            top_p if top_p is not None else top_k if top_k is not None else temperature
        ) in str(direct.value)
    for good in [(0.0, None, None), (0, 1, 1), (0.7, 5, 0.9), (2, None, 1.0)]:
        assert check_knobs(*good) is None
