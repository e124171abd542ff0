"""Padded generation: against loops over each row alone, and its caches and output.

Against each row alone (greedy, sampling, eos and steps): the references run
the model's own ``forward`` (the backbone's code, not this stage's) on each
row's real tokens alone, without any cache, and choose tokens as the spec
pins it: the argmax, or ``torch.multinomial`` on the softmax of
``kv_cache.filter_logits`` (one call over all rows with one generator, one
call a row with a generator list). Token-for-token comparisons run in float64
where the device has it, where padded and alone logits agree to ~1e-14.

The caches and the output: one KV cache a layer holding the padded frame, no
step attending to a cached pad, the output's layout, the unpadded path, and a
no-cache loop of ``padded_forward`` giving the same greedy ids.

The builders (a drawn model, a left-padding mask, a drawn prompt) are defined
here, not imported: pytest's importlib mode puts no test folder on
``sys.path``, and a helper loaded by its file path would make every mutant
proof of the stage read source text exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.attention import KVCache
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate, padded_forward

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]

# --- the builders ----------------------------------------------------------------------


def _build_model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int,
    fast: bool = False,
    scale: float = 1.0,
) -> GPT:
    """A GPT with drawn weights (times ``scale``: below 1, flatter distributions and
    several tokens in play), in ``dtype`` on ``device``, eval mode; on the fast path if ``fast``."""
    gpt = GPT(cfg)
    randomise(gpt, seed)
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(scale)  # scale < 1: flatter distributions, several tokens in play
    gpt.to(device=device, dtype=dtype).eval()
    return use_fast_attention(gpt) if fast else gpt  # type: ignore[return-value]


def _pad_mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The (B, t) left-padding mask: row b is False on its first ``pads[b]`` columns."""
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


def _draw_prompt(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


# --- drawn cases and each row alone, the reference -------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelConfig, int, list[int], int]:
    """A config with every knob drawn; padded width t < T, pads (a real token a row), new."""
    H = draw(st.integers(1, 3))
    cfg = ModelConfig(
        V=draw(st.integers(2, 16)),
        T=draw(st.integers(2, 13)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 12)),
        dropout=draw(st.sampled_from([0.0, 0.2])),
        rope_theta=draw(st.sampled_from([10000.0, 19.0, 2e5])),
    )
    t = draw(st.integers(1, cfg.T - 1))
    pads = draw(st.lists(st.integers(0, t - 1), min_size=1, max_size=4))
    return cfg, t, pads, draw(st.integers(1, cfg.T - t))


def alone_loop(
    model: GPT,
    prompt: torch.Tensor,
    pads: list[int],
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> torch.Tensor:
    """Each row's real prompt alone, no cache, the spec's token choice; ``(B, t + new)``."""
    B, t = prompt.shape
    rows = [prompt[b : b + 1, p:] for b, p in enumerate(pads)]  # B x (1, t_b)
    out = prompt.new_full((B, t + new), -1)  # (B, t + new)
    out[:, :t] = prompt
    finished = torch.zeros(B, dtype=torch.bool, device=prompt.device)  # (B,)
    with torch.no_grad():
        for i in range(new):
            last = torch.cat([model(r)[:, -1] for r in rows])  # (B, V)
            if knobs["temperature"] == 0:
                token = last.argmax(-1)  # (B,)
            else:
                probs = torch.softmax(kv_cache.filter_logits(last, **knobs), dim=-1)  # (B, V)
                if isinstance(generator, (list, tuple)):
                    drawn = [
                        torch.multinomial(probs[b : b + 1], 1, generator=g)
                        for b, g in enumerate(generator)
                    ]
                    token = torch.cat(drawn)[:, 0]  # (B,)
                else:
                    token = torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)
            if eos is not None:
                token = token.masked_fill(finished, eos)  # (B,)
                finished |= token == eos
            out[:, t + i] = token
            rows = [torch.cat([r, token[b].view(1, 1)], dim=1) for b, r in enumerate(rows)]
            if eos is not None and bool(finished.all()):
                out[:, t + i + 1 :] = eos
                break
    return out


# --- greedy and traces ---------------------------------------------


@pytest.mark.invariant("padding.generate_matches_alone")
@settings(max_examples=15)
@given(case=cases(), fast=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_greedy_tokens_and_traces_are_each_row_alone(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    case: tuple[ModelConfig, int, list[int], int],
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg, t, pads, new = case
    dtype = float_dtypes[-1]
    layer = data.draw(st.integers(0, cfg.L - 1))
    model = _build_model(cfg, device, dtype, randomise, seed, fast)
    prompt = _draw_prompt(cfg, len(pads), t, seed, device)  # (B, t)
    knobs = {"temperature": 0.0, "top_k": None, "top_p": None}
    ids, traces = generate(
        model, prompt, _pad_mask(pads, t, device), new, temperature=0.0, trace_layer=layer
    )
    assert torch.equal(ids, alone_loop(model, prompt, pads, new, knobs, None, None))
    assert [tuple(tr.shape) for tr in traces] == [(len(pads), cfg.H, t + i) for i in range(new)]
    for b, p in enumerate(pads):
        for i, trace in enumerate(traces):
            with torch.no_grad():
                _, want = model.forward_with_attn_trace(ids[b : b + 1, p : t + i], layer)
            assert not trace[b, :, :p].any()
            torch.testing.assert_close(trace[b, :, p:], want["attn_row"][0], **tol(dtype))


# --- sampling ---------------------------------------------


@pytest.mark.invariant("padding.sampling_exact")
@pytest.mark.invariant("padding.generate_matches_alone")
@settings(max_examples=15)
@given(
    case=cases(),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
    top_k=st.none() | st.integers(1, 20),
    top_p=st.none() | st.sampled_from([0.2, 0.8, 1.0]),
    per_row=st.booleans(),
    use_eos=st.booleans(),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_sampling_draws_as_the_reference_loop(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: Randomise,
    case: tuple[ModelConfig, int, list[int], int],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    per_row: bool,
    use_eos: bool,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg, t, pads, new = case
    model = _build_model(cfg, device, float_dtypes[-1], randomise, seed, fast, scale=0.3)
    prompt = _draw_prompt(cfg, len(pads), t, seed, device)  # (B, t)
    mask = _pad_mask(pads, t, device)
    knobs = {"temperature": temperature, "top_k": top_k, "top_p": top_p}

    def gens() -> torch.Generator | list[torch.Generator]:
        if per_row:
            return [
                torch.Generator(device=device).manual_seed(seed + 3 * b) for b in range(len(pads))
            ]
        return torch.Generator(device=device).manual_seed(seed)

    eos = data.draw(st.integers(0, cfg.V - 1)) if use_eos else None
    want = alone_loop(model, prompt, pads, new, knobs, eos, gens())
    got = generate(model, prompt, mask, new, **knobs, eos_id=eos, generator=gens())
    assert torch.equal(got, want)
    if per_row:  # and each row is kv_cache.generate of its prompt alone, seeded alike
        for b, p in enumerate(pads):
            g = torch.Generator(device=device).manual_seed(seed + 3 * b)
            alone = kv_cache.generate(
                model, prompt[b : b + 1, p:], new, **knobs, eos_id=eos, generator=g
            )
            assert isinstance(alone, torch.Tensor)
            assert torch.equal(got[b, t:], alone[0, t - p :])


@pytest.mark.invariant("padding.sampling_exact")
def test_unseeded_sampling_uses_the_global_generator(
    device: torch.device, randomise: Randomise
) -> None:
    cfg = ModelConfig(V=30, T=10, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = _build_model(cfg, device, torch.float32, randomise, 1, scale=0.2)
    prompt = _draw_prompt(cfg, 2, 4, 0, device)  # (2, 4)
    mask = _pad_mask([1, 0], 4, device)
    torch.manual_seed(5)
    a = generate(model, prompt, mask, 5)
    torch.manual_seed(5)
    b = generate(model, prompt, mask, 5)
    torch.manual_seed(6)
    c = generate(model, prompt, mask, 5)
    assert torch.equal(a, b) and not torch.equal(a, c)


# --- eos ---------------------------------------------


@pytest.mark.invariant("padding.eos_rows_stop")
@pytest.mark.invariant("padding.prefill_then_single_tokens")
@settings(max_examples=15)
@given(case=cases(), seed=st.integers(0, 2**16), data=st.data())
def test_eos_rows_hold_and_generation_stops_when_all_have(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: Randomise,
    case: tuple[ModelConfig, int, list[int], int],
    seed: int,
    data: st.DataObject,
) -> None:
    cfg, t, pads, new = case
    model = _build_model(cfg, device, float_dtypes[-1], randomise, seed)
    prompt = _draw_prompt(cfg, len(pads), t, seed, device)  # (B, t)
    greedy = {"temperature": 0.0, "top_k": None, "top_p": None}
    free = alone_loop(model, prompt, pads, new, greedy, None, None)  # (B, t + new)
    eos = data.draw(st.sampled_from(free.flatten().tolist()))  # pad, prompt or generated
    sizes: list[int] = []
    hook = model.blocks[0].register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[1]))
    try:
        got = generate(model, prompt, _pad_mask(pads, t, device), new, temperature=0.0, eos_id=eos)
    finally:
        hook.remove()
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, alone_loop(model, prompt, pads, new, greedy, eos, None))
    hit = [(free[b, t:] == eos).nonzero() for b in range(len(pads))]
    steps = new
    if all(h.numel() for h in hit):
        steps = min(new, max(int(h[0]) for h in hit) + 1)
    assert sizes == [t] + [1] * (steps - 1)


@pytest.mark.invariant("padding.eos_rows_stop")
@pytest.mark.parametrize("per_row", [False, True])
def test_a_finished_row_holds_eos_while_the_others_sample_on(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise, per_row: bool
) -> None:
    cfg = ModelConfig(V=40, T=14, C=12, L=2, H=2, d_ff=10, dropout=0.0, rope_theta=60.0)
    # scale 0.2: near-uniform draws
    model = _build_model(cfg, device, float_dtypes[-1], randomise, 7, scale=0.2)
    pads, t, new = [2, 0, 3], 4, 10
    prompt = _draw_prompt(cfg, 3, t, 5, device)  # (3, 4)
    knobs = {"temperature": 1.0, "top_k": None, "top_p": None}

    def gens() -> torch.Generator | list[torch.Generator]:
        if per_row:
            return [torch.Generator(device=device).manual_seed(20 + b) for b in range(3)]
        return torch.Generator(device=device).manual_seed(20)

    free = generate(model, prompt, _pad_mask(pads, t, device), new, generator=gens())
    assert isinstance(free, torch.Tensor)
    eos = int(free[0, t])  # row 0 finishes at its first token
    later = free[0, t + 1 :]
    assert not (later == eos).all(), "test set-up: row 0 repeats its first token; pick a seed"
    got = generate(model, prompt, _pad_mask(pads, t, device), new, eos_id=eos, generator=gens())
    assert isinstance(got, torch.Tensor)
    assert (got[0, t:] == eos).all()
    assert torch.equal(got, alone_loop(model, prompt, pads, new, knobs, eos, gens()))
    for b in (1, 2):  # rows that never draw eos go on exactly as before: every row is drawn
        if not (free[b, t:] == eos).any():
            assert torch.equal(got[b], free[b])


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
        model = _build_model(cfg, device, dtype, randomise, 2, fast)
        prompt = _draw_prompt(cfg, 3, t, 4, device)  # (3, t)
        seen: list[list[tuple[int, Any, int, int]]] = [[] for _ in model.blocks]
        handles = [
            blk.attn.register_forward_pre_hook(lambda m, a, calls=calls: _record(m, a, calls))
            for blk, calls in zip(model.blocks, seen, strict=True)
        ]
        try:
            ids = generate(
                model, prompt, _pad_mask(pads, t, device), new, temperature=0.7, top_p=0.9
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
    model = _build_model(cfg, device, torch.float32, randomise, 3)
    prompt = _draw_prompt(cfg, 2, 5, 1, device)  # (2, 5)
    mask = _pad_mask([3, 0], 5, device)
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
    model = _build_model(cfg, device, torch.float32, randomise, 5)
    prompt = _draw_prompt(cfg, 3, 4, 2, device)  # (3, 4)
    mask = _pad_mask([3, 1, 0], 4, device)
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
    model = _build_model(cfg, device, float_dtypes[-1], randomise, 6, fast, scale=0.4)
    prompt = _draw_prompt(cfg, 2, 4, 8, device)  # (2, 4)
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
    model = _build_model(cfg, device, float_dtypes[-1], randomise, 9)
    pads, t, new = [0, 5, 2], 6, 6
    prompt = _draw_prompt(cfg, 3, t, 3, device)  # (3, t)
    ids = generate(model, prompt, _pad_mask(pads, t, device), new, temperature=0.0)
    assert isinstance(ids, torch.Tensor)
    loop = prompt.clone()  # (3, t), grown below
    with torch.no_grad():
        for _ in range(new):
            width = loop.shape[1]
            logits = padded_forward(model, loop, _pad_mask(pads, width, device))  # (3, width, V)
            assert isinstance(logits, torch.Tensor)
            loop = torch.cat([loop, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ids, loop)
