"""Acceptance tests of padded ``generate`` (stage padding).

Every reference works on each row's real prompt ALONE, without padding: an
argmax loop over the model's own no-cache ``forward`` for greedy decoding,
``forward_with_attn_trace`` for the traces, and for sampling a loop that
filters the rows' last logits with a filter written here from the kv_cache
spec's definitions and draws with ``torch.multinomial`` exactly as the spec
pins it (one call over all rows with one generator; row by row with a
generator list). ``kv_cache.generate`` of each row alone is the other
reference the spec names. Token-for-token comparisons run in float64, where
padded and unpadded logits agree to about 1e-14, so no near-tie can flip a
choice.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.attention import CausalSelfAttention, KVCache
from niels_gpt.model.fastpath import sdpa_kernel
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import use_kv_cache
from niels_gpt.model.padding import generate

_SPEC = importlib.util.spec_from_file_location("padding_kit", Path(__file__).with_name("_kit.py"))
assert _SPEC is not None and _SPEC.loader is not None
kit = importlib.util.module_from_spec(_SPEC)  # the stage's shared builders (_kit.py)
_SPEC.loader.exec_module(kit)


Gen = torch.Generator | list[torch.Generator] | None
NEG = float("-inf")


def _flatten(model: GPT, scale: float) -> GPT:
    """Scale every weight down: flatter distributions, more than one token in play."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@st.composite
def configs(draw: st.DrawFn, max_V: int = 40) -> ModelConfig:
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, max_V)),
        T=draw(st.integers(2, 14)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


@st.composite
def prompts(draw: st.DrawFn, T: int) -> tuple[int, list[int], int]:
    """(t, pads, new): a padded width below T, each row's pads (a real token a row), new tokens."""
    B = draw(st.integers(1, 4))
    t = draw(st.integers(1, T - 1))
    pads = draw(st.lists(st.integers(0, t - 1), min_size=B, max_size=B))
    return t, pads, draw(st.integers(1, T - t))


# --- references: each row alone --------------------------------------------------------


def greedy_alone(model: GPT, row: torch.Tensor, new: int) -> list[int]:
    """The argmax continuation of one unpadded (n,) prompt, no cache: new token ids."""
    ids = row[None]  # (1, n)
    with torch.no_grad():
        for _ in range(new):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, nxt], dim=1)  # (1, n + i + 1)
    return ids[0, row.numel() :].tolist()


def traces_alone(
    model: GPT, seq: torch.Tensor, n: int, steps: int, layer: int
) -> list[torch.Tensor]:
    """(H, n + i) attn_row of step i for the (len,) sequence of prompt n and its continuation."""
    with torch.no_grad():
        return [
            model.forward_with_attn_trace(seq[None, : n + i], layer)[1]["attn_row"][0]
            for i in range(steps)
        ]


def with_eos(tokens: list[int], eos: int | None, new: int) -> list[int]:
    """A row's no-eos continuation cut at its first eos and held there."""
    if eos is None or eos not in tokens:
        return tokens
    first = tokens.index(eos)
    return tokens[: first + 1] + [eos] * (new - first - 1)


def reference_filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """kv_cache's filter on (B, V) logits from its definitions, row by row in float64 Python."""
    keep_rows = []
    for row in logits.detach().to("cpu", torch.float64).tolist():
        V = len(row)
        scaled = [x / temperature for x in row]
        keep = [True] * V
        if top_k is not None and top_k < V:
            kth = sorted(scaled, reverse=True)[top_k - 1]
            keep = [x >= kth for x in scaled]
        if top_p is not None and top_p < 1.0:
            top = max(x for x, k in zip(scaled, keep, strict=True) if k)
            w = [math.exp(x - top) if k else 0.0 for x, k in zip(scaled, keep, strict=True)]
            before = 0.0
            for j in sorted(range(V), key=lambda j: (-w[j], j)):
                if before >= top_p:
                    keep[j] = False
                before += w[j] / sum(w)
        keep_rows.append(keep)
    keep_t = torch.tensor(keep_rows, dtype=torch.bool, device=logits.device)  # (B, V)
    return (logits / temperature).masked_fill(~keep_t, NEG)  # (B, V)


def sampling_alone(
    model: GPT,
    prompt: torch.Tensor,
    pads: list[int],
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator | Sequence[torch.Generator],
) -> torch.Tensor:
    """The spec's draw on the rows alone, no cache; returns (B, t + new) ids."""
    B, t = prompt.shape
    rows = [prompt[b, p:].tolist() for b, p in enumerate(pads)]
    out = torch.full((B, t + new), -1, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    out[:, :t] = prompt
    finished = [False] * B
    with torch.no_grad():
        for i in range(new):
            logits = torch.stack(
                [model(torch.tensor([r], device=prompt.device))[0, -1] for r in rows]
            )  # (B, V)
            probs = torch.softmax(reference_filter(logits, **knobs), dim=-1)  # (B, V)
            if isinstance(gen, torch.Generator):
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()  # all rows at once
            else:
                nxt = [
                    int(torch.multinomial(probs[b : b + 1], 1, generator=gen[b])) for b in range(B)
                ]
            for b in range(B):
                token = eos if finished[b] and eos is not None else nxt[b]
                finished[b] = finished[b] or token == eos
                rows[b].append(token)
                out[b, t + i] = token
            if eos is not None and all(finished):
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
            if isinstance(cache, KVCache):
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


# --- row for row: each prompt alone ------------------------------------------------------


@pytest.mark.invariant("padding.generate_matches_alone")
@pytest.mark.invariant("padding.output_contract")
@settings(max_examples=15)
@given(cfg=configs(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_greedy_rows_and_traces_match_each_prompt_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]  # float64 where the device has it
    t, pads, new = data.draw(prompts(cfg.T))
    layer = data.draw(st.integers(0, cfg.L - 1))
    B = len(pads)
    model = kit.model(cfg, device, dtype, randomise, seed, fast)
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t), pads hold random ids
    gen = _generator(device, seed)
    state = gen.get_state()
    ids, traces = generate(
        model,
        prompt,
        kit.mask(pads, t, device),
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
        assert ids[b, t:].tolist() == greedy_alone(model, prompt[b, p:], new)
        seq = ids[b, p:]  # (t - p + new,): the row alone and its continuation
        want_traces = traces_alone(model, seq, t - p, new, layer)
        for i, (got, want) in enumerate(zip(traces, want_traces, strict=True)):
            assert got.shape == (B, cfg.H, t + i)
            assert not got[b, :, :p].any(), "a padded key got probability"
            torch.testing.assert_close(got[b, :, p:], want, **tol(dtype))


@pytest.mark.invariant("padding.generate_matches_alone")
@settings(max_examples=12)
@given(
    cfg=configs(max_V=12),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.none() | st.integers(1, 14),
    top_p=st.none() | st.sampled_from([0.3, 0.7, 1.0]),
    use_eos=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_rows_are_kv_cache_generate_of_each_prompt_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    cfg: ModelConfig,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    use_eos: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    # Sampling row for row needs one generator per row, seeded like the alone run's.
    dtype = float_dtypes[-1]
    t, pads, new = data.draw(prompts(cfg.T))
    layer = data.draw(st.integers(0, cfg.L - 1))
    eos = data.draw(st.integers(0, cfg.V - 1)) if use_eos else None
    model = _flatten(kit.model(cfg, device, dtype, randomise, seed), 0.3)
    prompt = kit.tokens(cfg, len(pads), t, seed, device)  # (B, t)
    knobs: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    gens = [_generator(device, seed + b) for b in range(len(pads))]
    ids, traces = generate(
        model,
        prompt,
        kit.mask(pads, t, device),
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
            generator=_generator(device, seed + b),
            trace_layer=layer,
        )
        assert torch.equal(ids[b, t:], alone[0, t - p :])
        assert len(alone_traces) <= steps  # the batch runs until its last row finishes
        for got, want in zip(traces, alone_traces, strict=False):
            assert not got[b, :, :p].any()
            torch.testing.assert_close(got[b, :, p:], want[0], **tol(dtype))


# --- sampling ------------------------------------------------------------------------------


@pytest.mark.invariant("padding.sampling_exact")
@settings(max_examples=12)
@given(
    cfg=configs(max_V=12),
    temperature=st.sampled_from([0.4, 1.0, 1.9]),
    top_k=st.none() | st.integers(1, 14),
    top_p=st.none() | st.sampled_from([0.3, 0.65, 0.9, 1.0]),
    per_row=st.booleans(),
    use_eos=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_seeded_sampling_matches_the_reference_loop(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    cfg: ModelConfig,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    per_row: bool,
    use_eos: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]
    t, pads, new = data.draw(prompts(cfg.T))
    B = len(pads)
    model = _flatten(kit.model(cfg, device, dtype, randomise, seed), 0.3)
    prompt = kit.tokens(cfg, B, t, seed, device)  # (B, t)
    mask = kit.mask(pads, t, device)
    knobs: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}

    def gens() -> torch.Generator | list[torch.Generator]:
        if per_row:
            return [_generator(device, seed + 7 * b) for b in range(B)]
        return _generator(device, seed)

    eos = None
    if use_eos:  # a token the run draws, so some row does finish
        drawn = sampling_alone(model, prompt, pads, new, knobs, None, gens())
        eos = int(data.draw(st.sampled_from(drawn[:, t:].flatten().tolist())))
    want = sampling_alone(model, prompt, pads, new, knobs, eos, gens())
    got = generate(model, prompt, mask, new, **knobs, eos_id=eos, generator=gens())
    assert torch.equal(got, want)
    again = generate(model, prompt, mask, new, **knobs, eos_id=eos, generator=gens())
    assert torch.equal(again, got)  # seeded generators reproduce the ids


@pytest.mark.invariant("padding.sampling_exact")
def test_a_generator_list_is_drawn_row_by_row_in_order(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    # The same generator three times: the order of the draws shows in the tokens.
    # (On the CPU this equals one draw over all rows: torch.multinomial consumes a
    # generator row after row. What is pinned is the order, row 0 first.)
    cfg = ModelConfig(V=40, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = _flatten(kit.model(cfg, device, float_dtypes[-1], randomise, 3), 0.2)
    pads, t = [2, 0, 4], 5
    prompt = kit.tokens(cfg, 3, t, 1, device)  # (3, 5)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    shared = _generator(device, 9)
    want = sampling_alone(model, prompt, pads, 6, knobs, None, [shared] * 3)
    shared = _generator(device, 9)
    got = generate(model, prompt, kit.mask(pads, t, device), 6, generator=[shared] * 3)
    assert torch.equal(got, want)


@pytest.mark.invariant("padding.sampling_exact")
@pytest.mark.invariant("padding.eos_rows_stop")
def test_finished_rows_still_take_part_in_every_draw(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    # Row 0 finishes at its first token; the later draws must still cover all rows,
    # so the other rows see the same random stream as without eos.
    cfg = ModelConfig(V=50, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = _flatten(kit.model(cfg, device, float_dtypes[-1], randomise, 12), 0.2)
    pads, t = [1, 0, 2, 1], 3
    prompt = kit.tokens(cfg, 4, t, 8, device)  # (4, 3)
    mask = kit.mask(pads, t, device)
    knobs: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None}
    drawn = sampling_alone(model, prompt, pads, 11, knobs, None, _generator(device, 3))
    eos = int(drawn[0, t])
    others = [r for r in range(1, 4) if not (drawn[r, t:] == eos).any()]
    assert others, f"test set-up: every row drew {eos}; pick another seed"
    want = sampling_alone(model, prompt, pads, 11, knobs, eos, _generator(device, 3))
    got = generate(model, prompt, mask, 11, **knobs, eos_id=eos, generator=_generator(device, 3))
    assert torch.equal(got, want)
    assert (got[0, t:] == eos).all()
    assert torch.equal(got[others], drawn[others])  # rows that never finish go on as before


# --- eos and steps -----------------------------------------------------------------------------


@pytest.mark.invariant("padding.eos_rows_stop")
@pytest.mark.invariant("padding.prefill_then_single_tokens")
@settings(max_examples=15)
@given(cfg=configs(max_V=10), seed=st.integers(0, 2**16), data=st.data())
def test_rows_that_hit_eos_stop_and_the_rest_go_on(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = float_dtypes[-1]
    t, pads, new = data.draw(prompts(cfg.T))
    model = kit.model(cfg, device, dtype, randomise, seed)
    prompt = kit.tokens(cfg, len(pads), t, seed, device)  # (B, t)
    alone = [greedy_alone(model, prompt[b, p:], new) for b, p in enumerate(pads)]
    choices = prompt.flatten().tolist() + [x for row in alone for x in row]
    eos = int(data.draw(st.sampled_from(choices)))  # a pad, a prompt token or a generated one
    want = [with_eos(row, eos, new) for row in alone]
    hits = [row.index(eos) for row in alone if eos in row]
    steps = min(new, max(hits) + 1) if len(hits) == len(alone) else new
    seen, handles = _watch(model)
    try:
        got = generate(model, prompt, kit.mask(pads, t, device), new, temperature=0.0, eos_id=eos)
    finally:
        for h in handles:
            h.remove()
    assert got[:, t:].tolist() == want
    assert torch.equal(got[:, :t], prompt)
    assert [n for n, _, _ in seen[0]] == [t] + [1] * (steps - 1)  # stops when all finished


@pytest.mark.invariant("padding.eos_rows_stop")
def test_a_pad_equal_to_eos_finishes_nothing(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=30, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, float_dtypes[-1], randomise, 4)
    pads, t, new = [3, 0, 5], 6, 8
    prompt = kit.tokens(cfg, 3, t, 2, device)  # (3, 6)
    alone = [greedy_alone(model, prompt[b, p:], new) for b, p in enumerate(pads)]
    generated = {x for row in alone for x in row}
    eos = next(v for v in range(cfg.V) if v not in generated)  # never generated
    padded = prompt.clone()
    padded[0, :3] = eos  # the pads of row 0
    padded[1, 2] = eos  # a real prompt token of row 1
    alone[1] = greedy_alone(model, padded[1], new)
    assert eos not in alone[1], "test set-up: the changed prompt generates eos; pick another"
    got = generate(model, padded, kit.mask(pads, t, device), new, temperature=0.0, eos_id=eos)
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
def test_prefill_once_then_one_token_a_step_through_kv_caches(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: kit.Tol,
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=37, T=18, C=24, L=3, H=3, d_ff=16, dropout=0.1)
    pads, t = [0, 3, 4], 5
    new = cfg.T - t
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 4, fast)
        prompt = kit.tokens(cfg, 3, t, 1, device)  # (3, 5)
        seen, handles = _watch(model)
        try:
            ids = generate(model, prompt, kit.mask(pads, t, device), new, temperature=0.8, top_k=7)
        finally:
            for h in handles:
                h.remove()
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
                torch.testing.assert_close(cache.keys[b, :, p:end], k_ref[0, :, :-1], **tol(dtype))
                torch.testing.assert_close(
                    cache.values[b, :, p:end], v_ref[0, :, :-1], **tol(dtype)
                )


# --- output and the unpadded path -------------------------------------------------------------


@pytest.mark.invariant("padding.output_contract")
def test_output_is_the_padded_prompt_then_the_new_ids(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=13, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    pads, t = [2, 0, 3], 4
    for dtype in float_dtypes:
        model = kit.model(cfg, device, dtype, randomise, 2)
        prompt = kit.tokens(cfg, 3, t, 7, device)  # (3, 4)
        mask = kit.mask(pads, t, device)
        for temperature in (0.0, 1.0):
            out = generate(model, prompt, mask, 6, temperature=temperature)
            assert isinstance(out, torch.Tensor)
            assert out.shape == (3, 10) and out.dtype == torch.int64
            assert out.device == prompt.device and not out.requires_grad
            assert torch.equal(out[:, :t], prompt)
            assert ((out >= 0) & (out < cfg.V)).all()
        ids, traces = generate(model, prompt, mask, 6, trace_layer=0)
        assert ids.shape == (3, 10) and len(traces) == 6
        assert [tuple(tr.shape) for tr in traces] == [(3, cfg.H, t + i) for i in range(6)]
        assert all(tr.device == prompt.device and not tr.requires_grad for tr in traces)
        same = generate(model, prompt, mask, 0)
        assert isinstance(same, torch.Tensor)
        assert torch.equal(same, prompt) and same.data_ptr() != prompt.data_ptr()
        assert generate(model, prompt, mask, 0, trace_layer=1)[1] == []
        full = generate(model, prompt, mask, cfg.T - t)  # exactly cfg.T in all
        assert isinstance(full, torch.Tensor) and full.shape == (3, cfg.T)


@pytest.mark.invariant("padding.unpadded_exact")
@pytest.mark.parametrize("fast", [False, True])
def test_no_padding_is_kv_cache_generate_bit_for_bit(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: kit.Randomise,
    fast: bool,
) -> None:
    cfg = ModelConfig(V=23, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    for dtype in float_dtypes:
        model = _flatten(kit.model(cfg, device, dtype, randomise, 5, fast), 0.4)
        prompt = kit.tokens(cfg, 3, 4, 3, device)  # (3, 4)
        for mask in (None, torch.ones(3, 4, dtype=torch.bool, device=device)):
            knobs: dict[str, Any] = {"temperature": 0.9, "top_k": 9, "top_p": 0.9}
            ids, traces = generate(
                model,
                prompt,
                mask,
                9,
                **knobs,
                eos_id=2,
                generator=_generator(device, 4),
                trace_layer=1,
            )
            want, want_traces = kv_cache.generate(
                model,
                prompt,
                9,
                **knobs,
                eos_id=2,
                generator=_generator(device, 4),
                trace_layer=1,
            )
            assert torch.equal(ids, want) and len(traces) == len(want_traces)
            assert all(torch.equal(a, b) for a, b in zip(traces, want_traces, strict=True))
            greedy = generate(model, prompt, mask, 9, temperature=0.0)
            assert torch.equal(greedy, kv_cache.generate(model, prompt, 9, temperature=0.0))


# --- the model afterwards ---------------------------------------------------------------------


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_generate_hands_the_model_back_as_it_was(
    device: torch.device, randomise: kit.Randomise, fast: bool, training: bool
) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = kit.model(cfg, device, torch.float32, randomise, 6, fast).train(training)
    before = kit.state(model)
    prompt = kit.tokens(cfg, 2, 4, 1, device)  # (2, 4)
    gens = [_generator(device, 1), _generator(device, 2)]
    generate(
        model, prompt, kit.mask([2, 0], 4, device), 5, top_p=0.9, generator=gens, trace_layer=1
    )
    kit.assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is (sdpa_kernel if fast else None) for b in model.blocks)


@pytest.mark.invariant("padding.leaves_model")
def test_generate_restores_the_model_when_a_step_fails(
    device: torch.device, randomise: kit.Randomise
) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 6)
    before = kit.state(model)
    calls = []

    def fail_on_third(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        calls.append(type(module))
        if len(calls) == 3:
            raise RuntimeError("injected failure")

    handle = model.blocks[1].register_forward_pre_hook(fail_on_third)
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            generate(model, kit.tokens(cfg, 2, 3, 1, device), kit.mask([1, 0], 3, device), 6)
    finally:
        handle.remove()
    kit.assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)


# --- bad input ----------------------------------------------------------------------------------

BAD_CFG = ModelConfig(V=11, T=8, C=8, L=2, H=2, d_ff=8, dropout=0.0)


def _bad_calls(
    device: torch.device,
) -> dict[str, tuple[Any, Any, tuple[Any, ...], dict[str, Any], list[str]]]:
    """name -> (prompt, mask, args after the mask, keywords, strings the message must hold)."""
    good = kit.tokens(BAD_CFG, 2, 3, 0, device)  # (2, 3)
    mask = kit.mask([1, 0], 3, device)  # (2, 3)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    empty_row = kit.mask([3, 0], 3, device)  # row 0 has no real token
    right = mask.flip(-1)
    gens = [_generator(device, 0), _generator(device, 1)]
    return {
        # the padded width counts: one new token too many for t = 3
        "too-long": (good, mask, (BAD_CFG.T - 3 + 1,), {}, []),
        # the padded width counts, though every row's real length would fit
        "too-long-every-row-padded": (
            good,
            kit.mask([1, 2], 3, device),
            (BAD_CFG.T - 3 + 1,),
            {},
            [],
        ),
        "prompt-longer-than-T": (
            kit.tokens(BAD_CFG, 1, BAD_CFG.T + 1, 0, device),
            kit.mask([4], BAD_CFG.T + 1, device),
            (0,),
            {},
            [],
        ),
        "mask-int64": (good, mask.long(), (2,), {}, ["torch.bool", "torch.int64"]),
        "mask-float": (good, mask.float(), (2,), {}, ["torch.bool", "torch.float32"]),
        "mask-list": (good, mask.tolist(), (2,), {}, []),
        "mask-shorter": (good, mask[:, :2], (2,), {}, ["(2, 3)", "(2, 2)"]),
        "mask-more-rows": (good, kit.mask([1, 0, 0], 3, device), (2,), {}, ["(2, 3)", "(3, 3)"]),
        "mask-other-device": (good, mask.to(other), (2,), {}, [str(good.device), str(other)]),
        "mask-right-padded": (good, right, (2,), {}, ["row 0"]),
        "row-without-real-token": (good, empty_row, (2,), {}, ["row 0"]),
        "all-padding": (good, torch.zeros_like(mask), (2,), {}, ["row 0"]),
        "id-equal-V-at-a-pad": (good.masked_fill(~mask, BAD_CFG.V), mask, (2,), {}, []),
        "id-negative": (good.clone().fill_(-1), mask, (2,), {}, []),
        "int32-ids": (good.to(torch.int32), mask, (2,), {}, []),
        "other-device": (good.to(other), mask.to(other), (2,), {}, []),
        "1-d": (good[0], mask[0], (2,), {}, []),
        "empty-prompt": (good[:, :0], mask[:, :0], (2,), {}, []),
        "empty-batch": (good[:0], mask[:0], (2,), {}, []),
        "list-prompt": (good.tolist(), mask, (2,), {}, []),
        "negative-new": (good, mask, (-1,), {}, []),
        "bool-new": (good, mask, (True,), {}, []),
        "float-new": (good, mask, (2.0,), {}, []),
        "negative-temperature": (good, mask, (2,), {"temperature": -1.0}, []),
        "nan-temperature": (good, mask, (2,), {"temperature": float("nan")}, []),
        "zero-top-k": (good, mask, (2,), {"top_k": 0}, []),
        "bool-top-k": (good, mask, (2,), {"top_k": True}, []),
        "zero-top-p": (good, mask, (2,), {"top_p": 0.0}, []),
        "big-top-p": (good, mask, (2,), {"top_p": 1.01}, []),
        "eos-equal-V": (good, mask, (2,), {"eos_id": BAD_CFG.V}, []),
        "eos-negative": (good, mask, (2,), {"eos_id": -1}, []),
        "bool-eos": (good, mask, (2,), {"eos_id": False}, []),
        "trace-layer-L": (good, mask, (2,), {"trace_layer": BAD_CFG.L}, []),
        "trace-layer-negative": (good, mask, (2,), {"trace_layer": -1}, []),
        "bool-trace-layer": (good, mask, (2,), {"trace_layer": True}, []),
        "seed-not-generator": (good, mask, (2,), {"generator": 1234}, []),
        "generator-list-too-short": (good, mask, (2,), {"generator": gens[:1]}, []),
        "generator-list-too-long": (good, mask, (2,), {"generator": [*gens, gens[0]]}, []),
        "generator-list-of-seeds": (good, mask, (2,), {"generator": [1, 2]}, []),
        "generator-list-with-none": (good, mask, (2,), {"generator": [gens[0], None]}, []),
    }


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_generate_rejects_bad_input_before_any_work(
    device: torch.device, randomise: kit.Randomise, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt, mask, args, kwargs, needles = _bad_calls(device)[case]
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    before = kit.state(model)
    writes = kit.watch_attention_writes(monkeypatch)
    forwards: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, a: forwards.append(type(m).__name__))
        for module in (model, model.blocks[0], model.blocks[0].attn)
    ]
    try:
        with pytest.raises(InputError) as caught:
            generate(model, prompt, mask, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    assert forwards == []  # not even GPT.forward's own checks ran
    assert writes == []  # no module was switched and no cache attached, not even for a moment
    message = str(caught.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not named in {message!r}"
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_generate_rejects_models_it_cannot_switch(
    device: torch.device, randomise: kit.Randomise
) -> None:
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    prompt = kit.tokens(BAD_CFG, 2, 3, 1, device)  # (2, 3)
    mask = kit.mask([1, 0], 3, device)
    with pytest.raises(InputError):
        generate(model.blocks, prompt, mask, 1)  # type: ignore[arg-type]
    use_kv_cache(model, 2)  # switched for cached generation: drop_kv_cache first
    before = kit.state(model)
    with pytest.raises(InputError):
        generate(model, prompt, mask, 1)
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_generators_must_live_on_the_models_device(
    device: torch.device, randomise: kit.Randomise
) -> None:
    model = kit.model(BAD_CFG, device, torch.float32, randomise, 0)
    prompt = kit.tokens(BAD_CFG, 2, 3, 0, device)  # (2, 3)
    mask = kit.mask([1, 0], 3, device)
    own = generate(model, prompt, mask, 2, generator=[_generator(device, 0), _generator(device, 1)])
    assert isinstance(own, torch.Tensor) and own.shape == (2, 5)
    if device.type != "cpu":  # CPU generators for a model elsewhere
        with pytest.raises(InputError):
            generate(model, prompt, mask, 2, generator=[torch.Generator(), torch.Generator()])
        with pytest.raises(InputError):
            generate(model, prompt, mask, 2, generator=torch.Generator())


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
def test_generate_puts_no_hook_on_the_model_before_its_checks(
    device: torch.device, randomise: kit.Randomise, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3.1: generate may run kv_cache.generate inside the frame's hooks; a call its own checks
    refuse gets none of them. Here the padded width plus the new tokens pass cfg.T while
    the real prompts are short, and a generator list has the wrong length."""
    cfg = ModelConfig(V=11, T=8, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = kit.model(cfg, device, torch.float32, randomise, 0)
    prompt = kit.tokens(cfg, 2, 5, 0, device)  # (2, 5)
    mask = kit.mask([3, 3], 5, device)  # real prompts of 2 tokens: 2 + 4 <= 8, but 5 + 4 > 8
    hooked: list[str] = []
    real = torch.nn.Module.register_forward_pre_hook

    def spy(module: torch.nn.Module, *args: Any, **kw: Any) -> Any:
        hooked.append(type(module).__name__)
        return real(module, *args, **kw)

    monkeypatch.setattr(torch.nn.Module, "register_forward_pre_hook", spy)
    with pytest.raises(InputError, match=r"cfg\.T"):
        generate(model, prompt, mask, 4, temperature=0.0)
    with pytest.raises(InputError, match="generator"):
        generate(model, prompt, mask, 2, generator=[_generator(device, 1)])
    assert hooked == []
