"""Acceptance tests of ``generate`` (stage kv_cache).

References (in ``kv_cache_kit``) are no-cache loops over the model's own ``forward``: an argmax loop
for greedy decoding, and for sampling a loop that filters the last logits with
the float64 filter of ``kv_cache_kit`` (written from the spec's definitions) and draws with
``torch.multinomial`` from a generator seeded like the one ``generate`` gets.
Token-for-token comparisons run in float64, where the cached and the no-cache
logits agree to about 1e-14, so no near-tie can flip a choice.
"""

from __future__ import annotations

from typing import Any

import kv_cache_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.kv_cache import (
    drop_kv_cache,
    generate,
    use_kv_cache,
)

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

configs = kit.configs  # T in [2, 16]


# --- greedy -------------------------------------------------------------------


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
@settings(max_examples=15)
@given(case=kit.cases(configs()), B=st.integers(1, 3), data=st.data())
def test_greedy_matches_the_no_cache_argmax_loop(
    rig: kit.Rig, case: kit.Case, B: int, data: st.DataObject
) -> None:
    cfg, seed, fast = case
    dtype = rig.widest  # float64 where the device has it
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = rig.model(cfg, dtype, seed, fast)
    prompt = rig.tokens(cfg, B, t, seed)  # (B, t)
    gen = rig.generator(seed)
    state = gen.get_state()
    got = generate(model, prompt, new, temperature=0.0, generator=gen)
    assert torch.equal(got, kit.greedy_loop(model, prompt, new))
    assert torch.equal(gen.get_state(), state)  # greedy draws nothing


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
@pytest.mark.parametrize("fast", [False, True])
def test_greedy_float32_matches_the_loop(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=67, T=32, C=32, L=2, H=4, d_ff=48, dropout=0.1)
    model = rig.model(cfg, torch.float32, 21, fast)
    prompt = rig.tokens(cfg, 3, 6, 9)  # (3, 6)
    got = generate(model, prompt, cfg.T - 6, temperature=0)
    assert torch.equal(got, kit.greedy_loop(model, prompt, cfg.T - 6))


# --- sampling -------------------------------------------------------------------


@pytest.mark.invariant("kv_cache.sampling_exact")
@settings(max_examples=15)
@given(
    case=kit.cases(configs(max_V=12), fast=False),
    B=st.integers(1, 3),
    knobs=kit.knobs(),
    use_eos=st.booleans(),
    data=st.data(),
)
def test_seeded_sampling_matches_the_reference_loop(
    rig: kit.Rig, case: kit.Case, B: int, knobs: dict[str, Any], use_eos: bool, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = rig.widest
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = kit.flatten(rig.model(cfg, dtype, seed), 0.3)  # more than one token in play
    prompt = rig.tokens(cfg, B, t, seed)  # (B, t)
    eos = None
    if use_eos:  # a token the run draws, so some row does finish
        drawn = kit.sampling_loop(model, prompt, new, knobs, None, rig.generator(seed))
        eos = int(data.draw(st.sampled_from(drawn[:, t:].flatten().tolist())))
    want = kit.sampling_loop(model, prompt, new, knobs, eos, rig.generator(seed))
    got = generate(model, prompt, new, **knobs, eos_id=eos, generator=rig.generator(seed))
    assert torch.equal(got, want)
    again = generate(model, prompt, new, **knobs, eos_id=eos, generator=rig.generator(seed))
    assert torch.equal(again, got)  # a seeded generator reproduces the ids


@pytest.mark.invariant("kv_cache.sampling_exact")
@pytest.mark.invariant("kv_cache.eos_rows_stop")
def test_finished_rows_still_take_part_in_every_draw(rig: kit.Rig) -> None:
    # Row 0 finishes at its first token; the draws of the later steps must still
    # cover all rows, so the other rows see the same random stream as without eos.
    cfg = ModelConfig(V=50, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.flatten(rig.model(cfg, rig.widest, 12), 0.2)  # the rows draw different tokens
    prompt = rig.tokens(cfg, 4, 3, 8)  # (4, 3)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    drawn = kit.sampling_loop(model, prompt, 11, knobs, None, rig.generator(3))
    eos = int(drawn[0, 3])
    others = [r for r in range(1, 4) if not (drawn[r, 3:] == eos).any()]
    assert others, f"test set-up: every row drew {eos}; pick another seed"
    want = kit.sampling_loop(model, prompt, 11, knobs, eos, rig.generator(3))
    got = generate(model, prompt, 11, **knobs, eos_id=eos, generator=rig.generator(3))
    assert torch.equal(got, want)
    assert (got[0, 3:] == eos).all()
    assert torch.equal(got[others], drawn[others])  # rows that never finish go on as before


@pytest.mark.invariant("kv_cache.sampling_exact")
def test_sampling_uses_the_global_generator_without_one(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=9, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = kit.flatten(rig.model(cfg, torch.float32, 1), 0.1)  # runs differ unless seeded alike
    prompt = rig.tokens(cfg, 4, 2, 0)  # (4, 2)
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
@given(case=kit.cases(configs(max_V=10), fast=False), B=st.integers(1, 3), data=st.data())
def test_rows_that_hit_eos_stop_and_the_rest_go_on(
    rig: kit.Rig, case: kit.Case, B: int, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = rig.widest
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    model = rig.model(cfg, dtype, seed)
    prompt = rig.tokens(cfg, B, t, seed)  # (B, t)
    ref = kit.greedy_loop(model, prompt, new)  # (B, t + new), no eos
    eos = int(data.draw(st.sampled_from(ref.flatten().tolist())))  # prompt or generated
    want, steps = kit.with_eos(ref, t, eos)
    with kit.attention_calls(model) as seen:
        got = generate(model, prompt, new, temperature=0.0, eos_id=eos)
    assert torch.equal(got, want)
    assert [n for n, _, _ in seen[0]] == [t] + [1] * (steps - 1)  # stops when all finished


@pytest.mark.invariant("kv_cache.eos_rows_stop")
def test_a_finished_row_is_frozen_while_the_others_go_on(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=50, T=16, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, rig.widest, 9)
    prompt = rig.tokens(cfg, 4, 3, 6)  # (4, 3)
    ref = kit.greedy_loop(model, prompt, 13)  # (4, 16), no eos
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
    want, steps = kit.with_eos(ref, 3, eos)
    assert steps == 13  # some row never finishes
    got = generate(model, prompt, 13, temperature=0.0, eos_id=eos)
    assert torch.equal(got, want)
    first = int((ref[row, 3:] == eos).nonzero()[0])
    assert (got[row, 3 + first :] == eos).all()
    assert not torch.equal(got[row], ref[row])  # the row did stop


@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
def test_generation_stops_once_every_row_has_finished(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=30, T=20, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 5)
    prompt = rig.tokens(cfg, 1, 3, 2).expand(2, 3).contiguous()  # two equal rows
    ref = kit.greedy_loop(model, prompt, 12)
    eos = int(ref[0, 3 + 4])  # generated at step 4 (or earlier)
    first = int((ref[0, 3:] == eos).nonzero()[0])
    with kit.attention_calls(model) as seen:
        got, traces = generate(model, prompt, 12, temperature=0.0, eos_id=eos, trace_layer=1)
    assert got.shape == (2, 15)
    assert (got[:, 3 + first :] == eos).all()
    assert len(seen[0]) == len(traces) == first + 1


@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_prefill_once_then_one_token_a_step_through_one_cache(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=37, T=18, C=24, L=3, H=3, d_ff=16, dropout=0.1)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 4, fast)
        prompt = rig.tokens(cfg, 2, 5, 1)  # (2, 5)
        new = cfg.T - 5
        with kit.attention_calls(model) as seen:
            generate(model, prompt, new, temperature=0.8, top_k=7)
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
def test_caches_are_sized_to_what_the_call_needs(rig: kit.Rig, fast: bool) -> None:
    """2.0: generate's caches hold t + max_new_tokens positions, not cfg.T; use_kv_cache
    takes max_len (cfg.T by default) and refuses one outside [1, cfg.T]."""
    cfg = ModelConfig(V=37, T=18, C=24, L=2, H=3, d_ff=16, dropout=0.0)
    model = rig.model(cfg, torch.float32, 4, fast)
    with kit.attention_calls(model) as seen:
        generate(model, rig.tokens(cfg, 2, 3, 1), 4, temperature=0)
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
    case=kit.cases(configs(max_V=10), fast=False),
    B=st.integers(1, 3),
    use_eos=st.booleans(),
    data=st.data(),
)
def test_step_traces_match_forward_with_attn_trace(
    rig: kit.Rig, case: kit.Case, B: int, use_eos: bool, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    layer = data.draw(st.integers(0, cfg.L - 1))
    t = data.draw(st.integers(1, cfg.T - 1))
    new = data.draw(st.integers(1, cfg.T - t))
    eos = data.draw(st.integers(0, cfg.V - 1)) if use_eos else None
    model = rig.model(cfg, dtype, seed)
    prompt = rig.tokens(cfg, B, t, seed)  # (B, t)
    ids, traces = generate(model, prompt, new, temperature=0.0, eos_id=eos, trace_layer=layer)
    assert isinstance(traces, list) and 1 <= len(traces) <= new
    if len(traces) < new:  # stopped early: every row must have finished
        assert eos is not None
        assert all((row == eos).any() for row in ids[:, t : t + len(traces)])
    with torch.no_grad():
        for i, trace in enumerate(traces):
            _, ref = model.forward_with_attn_trace(ids[:, : t + i], layer)
            assert trace.shape == (B, cfg.H, t + i) and trace.dtype == ref["attn_row"].dtype
            rig.close(trace, ref["attn_row"], dtype)
