"""Acceptance tests of padded ``generate`` (stage padding).

Every reference (in ``padding_kit``) works on each row's real prompt ALONE, without padding: an
argmax loop over the model's own no-cache ``forward`` for greedy decoding,
``forward_with_attn_trace`` for the traces, and for sampling a loop that
filters the rows' last logits with a filter written from the kv_cache
spec's definitions and draws with ``torch.multinomial`` exactly as the spec
pins it (one call over all rows with one generator; row by row with a
generator list). ``kv_cache.generate`` of each row alone is the other
reference the spec names. Token-for-token comparisons run in float64, where
padded and unpadded logits agree to about 1e-14, so no near-tie can flip a
choice.
"""

from __future__ import annotations

from typing import Any

import padding_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.attention import KVCache
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

Gen = torch.Generator | list[torch.Generator] | None


@st.composite
def prompts(draw: st.DrawFn, T: int) -> tuple[int, list[int], int]:
    """(t, pads, new): a padded width below T, each row's pads (a real token a row), new tokens."""
    B = draw(st.integers(1, 4))
    t = draw(st.integers(1, T - 1))
    pads = draw(st.lists(st.integers(0, t - 1), min_size=B, max_size=B))
    return t, pads, draw(st.integers(1, T - t))


# --- row for row: each prompt alone ------------------------------------------------------


@pytest.mark.invariant("padding.generate_matches_alone")
@pytest.mark.invariant("padding.output_contract")
@settings(max_examples=15)
@given(case=kit.cases(kit.configs()), data=st.data())
def test_greedy_rows_and_traces_match_each_prompt_alone(
    rig: kit.Rig, case: kit.Case, data: st.DataObject
) -> None:
    cfg, seed, fast = case
    dtype = rig.widest  # float64 where the device has it
    t, pads, new = data.draw(prompts(cfg.T))
    layer = data.draw(st.integers(0, cfg.L - 1))
    B = len(pads)
    model = rig.model(cfg, dtype, seed, fast)
    prompt = rig.tokens(cfg, B, t, seed)  # (B, t), pads hold random ids
    gen = rig.generator(seed)
    state = gen.get_state()
    ids, traces = generate(
        model,
        prompt,
        kit.mask(pads, t, rig.device),
        new,
        temperature=0.0,
        generator=gen,
        trace_layer=layer,
    )
    assert torch.equal(gen.get_state(), state)  # greedy draws nothing
    assert ids.shape == (B, t + new) and ids.dtype == torch.int64
    assert torch.equal(ids[:, :t], prompt)  # the prompt as given, pads included
    assert len(traces) == new
    for b, p in enumerate(pads):
        assert ids[b, t:].tolist() == kit.greedy_alone(model, prompt[b, p:], new)
        seq = ids[b, p:]  # (t - p + new,): the row alone and its continuation
        want_traces = kit.traces_alone(model, seq, t - p, new, layer)
        for i, (got, want) in enumerate(zip(traces, want_traces, strict=True)):
            assert got.shape == (B, cfg.H, t + i)
            assert not got[b, :, :p].any(), "a padded key got probability"
            rig.close(got[b, :, p:], want, dtype)


@pytest.mark.invariant("padding.generate_matches_alone")
@settings(max_examples=12)
@given(
    case=kit.cases(kit.configs(max_V=12), fast=False),
    knobs=kit.knobs(temperatures=(0.0, 0.5, 1.0, 1.7), top_ps=(0.3, 0.7, 1.0)),
    use_eos=st.booleans(),
    data=st.data(),
)
def test_rows_are_kv_cache_generate_of_each_prompt_alone(
    rig: kit.Rig, case: kit.Case, knobs: dict[str, Any], use_eos: bool, data: st.DataObject
) -> None:
    # Sampling row for row needs one generator per row, seeded like the alone run's.
    cfg, seed, _ = case
    dtype = rig.widest
    t, pads, new = data.draw(prompts(cfg.T))
    layer = data.draw(st.integers(0, cfg.L - 1))
    eos = data.draw(st.integers(0, cfg.V - 1)) if use_eos else None
    model = kit.flatten(rig.model(cfg, dtype, seed), 0.3)
    prompt = rig.tokens(cfg, len(pads), t, seed)  # (B, t)
    gens = [rig.generator(seed + b) for b in range(len(pads))]
    ids, traces = generate(
        model,
        prompt,
        kit.mask(pads, t, rig.device),
        new,
        **knobs,
        eos_id=eos,
        generator=gens,
        trace_layer=layer,
    )
    steps = len(traces)
    for b, p in enumerate(pads):
        alone, alone_traces = kv_cache.generate(
            model,
            prompt[b : b + 1, p:],
            new,
            **knobs,
            eos_id=eos,
            generator=rig.generator(seed + b),
            trace_layer=layer,
        )
        assert torch.equal(ids[b, t:], alone[0, t - p :])
        assert len(alone_traces) <= steps  # the batch runs until its last row finishes
        for got, want in zip(traces, alone_traces, strict=False):
            assert not got[b, :, :p].any()
            rig.close(got[b, :, p:], want[0], dtype)


# --- sampling ------------------------------------------------------------------------------


@pytest.mark.invariant("padding.sampling_exact")
@settings(max_examples=12)
@given(
    case=kit.cases(kit.configs(max_V=12), fast=False),
    knobs=kit.knobs(),
    per_row=st.booleans(),
    use_eos=st.booleans(),
    data=st.data(),
)
def test_seeded_sampling_matches_the_reference_loop(
    rig: kit.Rig,
    case: kit.Case,
    knobs: dict[str, Any],
    per_row: bool,
    use_eos: bool,
    data: st.DataObject,
) -> None:
    cfg, seed, _ = case
    dtype = rig.widest
    t, pads, new = data.draw(prompts(cfg.T))
    B = len(pads)
    model = kit.flatten(rig.model(cfg, dtype, seed), 0.3)
    prompt, mask = kit.batch(rig, cfg, pads, t, seed)  # (B, t)

    def gens() -> torch.Generator | list[torch.Generator]:
        if per_row:
            return [rig.generator(seed + 7 * b) for b in range(B)]
        return rig.generator(seed)

    eos = None
    if use_eos:  # a token the run draws, so some row does finish
        drawn = kit.sampling_alone(model, prompt, pads, new, knobs, None, gens())
        eos = int(data.draw(st.sampled_from(drawn[:, t:].flatten().tolist())))
    want = kit.sampling_alone(model, prompt, pads, new, knobs, eos, gens())
    got = generate(model, prompt, mask, new, **knobs, eos_id=eos, generator=gens())
    assert torch.equal(got, want)
    again = generate(model, prompt, mask, new, **knobs, eos_id=eos, generator=gens())
    assert torch.equal(again, got)  # seeded generators reproduce the ids


@pytest.mark.invariant("padding.sampling_exact")
def test_a_generator_list_is_drawn_row_by_row_in_order(rig: kit.Rig) -> None:
    # The same generator three times: the order of the draws shows in the tokens.
    # (On the CPU this equals one draw over all rows: torch.multinomial consumes a
    # generator row after row. What is pinned is the order, row 0 first.)
    cfg = ModelConfig(V=40, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.flatten(rig.model(cfg, rig.widest, 3), 0.2)
    pads, t = [2, 0, 4], 5
    prompt = rig.tokens(cfg, 3, t, 1)  # (3, 5)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    shared = rig.generator(9)
    want = kit.sampling_alone(model, prompt, pads, 6, knobs, None, [shared] * 3)
    shared = rig.generator(9)
    got = generate(model, prompt, kit.mask(pads, t, rig.device), 6, generator=[shared] * 3)
    assert torch.equal(got, want)


@pytest.mark.invariant("padding.sampling_exact")
@pytest.mark.invariant("padding.eos_rows_stop")
def test_finished_rows_still_take_part_in_every_draw(rig: kit.Rig) -> None:
    # Row 0 finishes at its first token; the later draws must still cover all rows,
    # so the other rows see the same random stream as without eos.
    cfg = ModelConfig(V=50, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.flatten(rig.model(cfg, rig.widest, 12), 0.2)
    pads, t = [1, 0, 2, 1], 3
    prompt = rig.tokens(cfg, 4, t, 8)  # (4, 3)
    mask = kit.mask(pads, t, rig.device)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    drawn = kit.sampling_alone(model, prompt, pads, 11, knobs, None, rig.generator(3))
    eos = int(drawn[0, t])
    others = [r for r in range(1, 4) if not (drawn[r, t:] == eos).any()]
    assert others, f"test set-up: every row drew {eos}; pick another seed"
    want = kit.sampling_alone(model, prompt, pads, 11, knobs, eos, rig.generator(3))
    got = generate(model, prompt, mask, 11, **knobs, eos_id=eos, generator=rig.generator(3))
    assert torch.equal(got, want)
    assert (got[0, t:] == eos).all()
    assert torch.equal(got[others], drawn[others])  # rows that never finish go on as before


# --- eos and steps -----------------------------------------------------------------------------


@pytest.mark.invariant("padding.eos_rows_stop")
@pytest.mark.invariant("padding.prefill_then_single_tokens")
@settings(max_examples=15)
@given(case=kit.cases(kit.configs(max_V=10), fast=False), data=st.data())
def test_rows_that_hit_eos_stop_and_the_rest_go_on(
    rig: kit.Rig, case: kit.Case, data: st.DataObject
) -> None:
    cfg, seed, _ = case
    dtype = rig.widest
    t, pads, new = data.draw(prompts(cfg.T))
    model = rig.model(cfg, dtype, seed)
    prompt = rig.tokens(cfg, len(pads), t, seed)  # (B, t)
    alone = [kit.greedy_alone(model, prompt[b, p:], new) for b, p in enumerate(pads)]
    choices = prompt.flatten().tolist() + [x for row in alone for x in row]
    eos = int(data.draw(st.sampled_from(choices)))  # a pad, a prompt token or a generated one
    want = [kit.with_eos(row, eos, new) for row in alone]
    hits = [row.index(eos) for row in alone if eos in row]
    steps = min(new, max(hits) + 1) if len(hits) == len(alone) else new
    with kit.attention_calls(model) as seen:
        got = generate(
            model, prompt, kit.mask(pads, t, rig.device), new, temperature=0.0, eos_id=eos
        )
    assert got[:, t:].tolist() == want
    assert torch.equal(got[:, :t], prompt)
    assert [n for n, _, _ in seen[0]] == [t] + [1] * (steps - 1)  # stops when all finished


@pytest.mark.invariant("padding.eos_rows_stop")
def test_a_pad_equal_to_eos_finishes_nothing(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=30, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, rig.widest, 4)
    pads, t, new = [3, 0, 5], 6, 8
    prompt = rig.tokens(cfg, 3, t, 2)  # (3, 6)
    alone = [kit.greedy_alone(model, prompt[b, p:], new) for b, p in enumerate(pads)]
    generated = {x for row in alone for x in row}
    eos = next(v for v in range(cfg.V) if v not in generated)  # never generated
    padded = prompt.clone()
    padded[0, :3] = eos  # the pads of row 0
    padded[1, 2] = eos  # a real prompt token of row 1
    alone[1] = kit.greedy_alone(model, padded[1], new)
    assert eos not in alone[1], "test set-up: the changed prompt generates eos; pick another"
    got = generate(model, padded, kit.mask(pads, t, rig.device), new, temperature=0.0, eos_id=eos)
    assert got[:, t:].tolist() == alone  # every row ran to the end


def _reference_keys_values(model: GPT, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys (rotated from position 0) and values of an unpadded (1, n) row."""
    out = []
    h = model.tok_emb(x)  # (1, n, C), eval mode: no dropout
    B, n, C = h.shape
    for block in model.blocks:
        attn = block.attn
        H = attn.n_head
        _, k, v = attn.qkv(block.ln1(h)).split(C, dim=-1)  # (1, n, C) each
        k = k.reshape(B, n, H, C // H).transpose(1, 2)  # (1, H, n, D)
        v = v.reshape(B, n, H, C // H).transpose(1, 2)  # (1, H, n, D)
        _, k_rot = rope.apply_rope(k, k, attn.rope_sin, attn.rope_cos)  # (1, H, n, D)
        out.append((k_rot, v))
        h = block(h)  # (1, n, C)
    return out


@pytest.mark.invariant("padding.prefill_then_single_tokens")
@pytest.mark.parametrize("fast", [False, True])
def test_prefill_once_then_one_token_a_step_through_kv_caches(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=37, T=18, C=24, L=3, H=3, d_ff=16, dropout=0.1)
    pads, t = [0, 3, 4], 5
    new = cfg.T - t
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 4, fast)
        prompt = rig.tokens(cfg, 3, t, 1)  # (3, 5)
        with kit.attention_calls(model) as seen:
            ids = generate(
                model, prompt, kit.mask(pads, t, rig.device), new, temperature=0.8, top_k=7
            )
        assert isinstance(ids, torch.Tensor)
        with torch.no_grad():
            want = [_reference_keys_values(model, ids[b : b + 1, p:]) for b, p in enumerate(pads)]
        for layer, calls in enumerate(seen):
            assert [n for n, _, _ in calls] == [t] + [1] * (new - 1)
            caches = {id(c) for _, c, _ in calls}
            cache = calls[0][1]
            assert len(caches) == 1 and isinstance(cache, KVCache)
            states = [s for _, _, s in calls]
            assert len({s[:5] for s in states}) == 1  # same storage, shape and dtype
            keys_shape, values_shape, cache_dtype = states[0][2:5]
            assert keys_shape == values_shape == (3, cfg.H, cfg.T, cfg.C // cfg.H)
            assert cache_dtype == dtype
            assert [s[5] for s in states] == [0, *range(t, t + new - 1)]  # lengths
            end = t + new - 1  # the last token is never fed
            assert len(cache) == end
            for b, p in enumerate(pads):  # the padded frame: index c holds column c
                k_ref, v_ref = want[b][layer]  # (1, H, end - p + 1, D) each
                rig.close(cache.keys[b, :, p:end], k_ref[0, :, :-1], dtype)
                rig.close(cache.values[b, :, p:end], v_ref[0, :, :-1], dtype)
