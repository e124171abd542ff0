"""``generate`` end to end: every knob away from its default, eos, steps, the model after.

The sampling reference is a no-cache loop over the model's own ``forward`` on
the whole prefix, with a filter written here from the definitions (sorting
each row in Python) and one ``torch.multinomial`` draw a step over all rows.
Token-for-token comparisons run in float64, where cached and no-cache logits
agree to about 1e-14.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel, use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, generate, use_kv_cache

Randomise = Callable[[torch.nn.Module, int], None]
CFG = ModelConfig(V=23, T=14, C=24, L=3, H=3, d_ff=20, dropout=0.15, rope_theta=77.0)


def _model(
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int,
    cfg: ModelConfig = CFG,
    scale: float = 1.0,
) -> GPT:
    model = GPT(cfg)
    randomise(model, seed)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(scale)
    return model.to(device=device, dtype=dtype).eval()


def _prompt(B: int, t: int, seed: int, device: torch.device, V: int = CFG.V) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, t), generator=gen).to(device)  # (B, t)


def sorted_filter(
    row: list[float], temperature: float, top_k: int | None, top_p: float | None
) -> list[float]:
    """One row of the spec's filter, in float64 Python: the kept values, -inf elsewhere."""
    V = len(row)
    scaled = [x / temperature for x in row]
    kept = set(range(V))
    if top_k is not None and top_k < V:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        kept = {j for j in kept if scaled[j] >= kth}
    if top_p is not None and top_p < 1.0:
        top = max(scaled[j] for j in kept)
        total = sum(math.exp(scaled[j] - top) for j in kept)
        mass = 0.0
        survivors = set()
        for j in sorted(kept, key=lambda j: (-scaled[j], j)):  # descending, ties by index
            if mass < top_p:
                survivors.add(j)
            mass += math.exp(scaled[j] - top) / total
        kept = survivors
    return [scaled[j] if j in kept else -math.inf for j in range(V)]


def reference_run(
    model: GPT,
    prompt: torch.Tensor,
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator,
) -> torch.Tensor:
    """No-cache sampling loop: the whole prefix each step, padding finished rows."""
    ids = prompt.clone()  # (B, t)
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)  # (B,)
    with torch.no_grad():
        for _ in range(new):
            last = model(ids)[:, -1].double().cpu().tolist()  # B rows of V
            filtered = [sorted_filter(r, **knobs) for r in last]
            probs = torch.softmax(torch.tensor(filtered, dtype=torch.float64), -1)  # (B, V)
            token = torch.multinomial(probs.to(prompt.device), 1, generator=gen)[:, 0]  # (B,)
            if eos is not None:
                token = torch.where(done, torch.full_like(token, eos), token)  # (B,)
                done |= token == eos
            ids = torch.cat([ids, token[:, None]], dim=1)  # (B, t + i + 1)
            if eos is not None and bool(done.all()):
                pad = torch.full((ids.shape[0], prompt.shape[1] + new - ids.shape[1]), eos)
                return torch.cat([ids, pad.to(ids.device)], dim=1)
    return ids


@pytest.mark.invariant("kv_cache.sampling_exact")
@pytest.mark.invariant("kv_cache.eos_rows_stop")
@settings(max_examples=10)
@given(
    B=st.integers(1, 4),
    temperature=st.sampled_from([0.35, 1.3]),
    top_k=st.none() | st.integers(2, 9),
    top_p=st.none() | st.sampled_from([0.5, 0.8, 0.97]),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_sampling_with_every_knob_matches_the_no_cache_loop(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    randomise: Randomise,
    B: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    model = _model(device, float_dtypes[-1], randomise, seed, scale=0.4)
    if fast:
        use_fast_attention(model)
    t = data.draw(st.integers(1, 6))
    new = CFG.T - t
    prompt = _prompt(B, t, seed, device)
    knobs: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    free = reference_run(model, prompt, new, knobs, None, torch.Generator(device).manual_seed(seed))
    eos = int(data.draw(st.sampled_from(free[:, t:].flatten().tolist())))  # one some row draws
    want = reference_run(model, prompt, new, knobs, eos, torch.Generator(device).manual_seed(seed))
    gen = torch.Generator(device).manual_seed(seed)
    got = generate(model, prompt, new, **knobs, eos_id=eos, generator=gen)
    assert torch.equal(got, want)


@pytest.mark.invariant("kv_cache.eos_rows_stop")
def test_an_eos_in_the_prompt_does_not_finish_the_row(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise
) -> None:
    model = _model(device, float_dtypes[-1], randomise, 3)
    prompt = _prompt(2, 5, 1, device)
    free = generate(model, prompt, 6, temperature=0)  # (2, 11), no eos
    assert isinstance(free, torch.Tensor)
    absent = [v for v in range(CFG.V) if not (free[:, 5:] == v).any()]
    eos = absent[0]  # never generated, so nothing may stop
    prompt[:, 2] = eos  # ... though every prompt holds it
    free = generate(model, prompt, 6, temperature=0)
    assert isinstance(free, torch.Tensor) and not (free[:, 5:] == eos).any()
    assert torch.equal(generate(model, prompt, 6, temperature=0, eos_id=eos), free)


@pytest.mark.invariant("kv_cache.eos_rows_stop")
@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
def test_finished_rows_are_padded_with_eos_and_fed_it(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], randomise: Randomise
) -> None:
    model = _model(device, float_dtypes[-1], randomise, 5)
    prompt = _prompt(3, 2, 9, device)
    free = generate(model, prompt, 12, temperature=0)  # (3, 14)
    assert isinstance(free, torch.Tensor)
    row, col = 1, 2 + 3
    eos = int(free[row, col])
    hits = [r for r in range(3) if (free[r, 2:] == eos).any()]
    assert hits != [0, 1, 2], "test set-up: every row hits eos; pick another seed"
    fed: list[torch.Tensor] = []
    handle = model.blocks[0].register_forward_pre_hook(lambda m, a: fed.append(a[0].clone()))
    try:
        got = generate(model, prompt, 12, temperature=0, eos_id=eos)
    finally:
        handle.remove()
    assert isinstance(got, torch.Tensor)
    first = int((free[row, 2:] == eos).nonzero()[0]) + 2
    assert torch.equal(got[row, : first + 1], free[row, : first + 1])
    assert (got[row, first:] == eos).all()  # padding is eos_id, not 0
    for r in set(range(3)) - set(hits):
        assert torch.equal(got[r], free[r])  # the others go on as without eos
    assert [x.shape[1] for x in fed] == [2] + [1] * 11  # some row goes on: no early stop
    embedded = model.tok_emb.weight[eos]  # (C,), what block 0 sees of an eos input
    for step in range(first - 1, 12):  # step s >= 1 feeds the token at column 2 + s - 1
        torch.testing.assert_close(fed[step][row, -1], embedded, rtol=0, atol=0)


@pytest.mark.invariant("kv_cache.prefill_then_single_tokens")
@pytest.mark.invariant("kv_cache.cache_fixed")
def test_one_prefill_then_one_token_a_step_into_one_storage(
    device: torch.device, randomise: Randomise
) -> None:
    model = _model(device, torch.float32, randomise, 2)
    seen: list[tuple[int, int, int, int]] = []

    def watch(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        cache = module.kv_cache  # type: ignore[union-attr]
        seen.append((args[0].shape[1], len(cache), cache.keys.data_ptr(), cache.values.data_ptr()))

    handle = model.blocks[2].attn.register_forward_pre_hook(watch)
    try:
        generate(model, _prompt(2, 4, 0, device), 9, temperature=0.7, top_k=5)
    finally:
        handle.remove()
    assert [s[0] for s in seen] == [4] + [1] * 8
    assert [s[1] for s in seen] == [0, *range(4, 12)]
    assert len({s[2:] for s in seen}) == 1


@pytest.mark.invariant("kv_cache.output_contract")
@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_generate_runs_without_grad_and_leaves_grad_mode(
    device: torch.device, randomise: Randomise
) -> None:
    model = _model(device, torch.float32, randomise, 1).train()
    modes: list[bool] = []
    handle = model.blocks[0].register_forward_pre_hook(
        lambda m, a: modes.append(torch.is_grad_enabled())
    )
    try:
        with torch.enable_grad():
            ids, traces = generate(model, _prompt(2, 3, 4, device), 4, trace_layer=2)
            assert torch.is_grad_enabled()
    finally:
        handle.remove()
    assert modes == [False] * 4
    assert not ids.requires_grad and not any(t.requires_grad for t in traces)
    assert all(m.training for m in model.modules())  # still in training mode


@pytest.mark.invariant("kv_cache.output_contract")
def test_no_new_tokens_is_a_copy_and_no_forward(device: torch.device, randomise: Randomise) -> None:
    model = _model(device, torch.float32, randomise, 1)
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    prompt = _prompt(2, CFG.T, 3, device)  # a full-length prompt may ask for nothing more
    try:
        ids, traces = generate(model, prompt, 0, trace_layer=0)
    finally:
        handle.remove()
    assert calls == [] and traces == []
    assert torch.equal(ids, prompt) and ids.data_ptr() != prompt.data_ptr()
    assert all(
        type(m) is CausalSelfAttention
        for m in model.modules()
        if isinstance(m, CausalSelfAttention)
    )


@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_a_failing_step_gives_back_the_callers_own_caches(
    device: torch.device, randomise: Randomise
) -> None:
    model = _model(device, torch.float32, randomise, 8)
    use_fast_attention(model)
    mine = use_kv_cache(model, 1)
    with torch.no_grad():
        model(_prompt(1, 3, 2, device))
    steps: list[int] = []

    def fail_on_decode(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        steps.append(args[0].shape[1])
        if len(steps) == 2:
            raise RuntimeError("decode failed")

    handle = model.blocks[0].register_forward_pre_hook(fail_on_decode)
    try:
        with pytest.raises(RuntimeError, match="decode failed"):
            generate(model, _prompt(2, 3, 5, device), 5)
    finally:
        handle.remove()
    assert [b.attn.kv_cache for b in model.blocks] == mine
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)  # no class switched
    assert [len(c) for c in mine] == [3, 3, 3]
    drop_kv_cache(model)
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)  # the fast path stays


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_new_tokens": 12}, "cfg.T = 14"),
        ({"eos_id": CFG.V + 3}, "eos_id"),
        ({"eos_id": 2.0}, "eos_id"),
        ({"trace_layer": CFG.L}, "trace_layer"),
        ({"trace_layer": "0"}, "trace_layer"),
        ({"generator": [torch.Generator()]}, "generator"),
        ({"top_k": -1}, "top_k"),
        ({"temperature": float("inf")}, "temperature"),
    ],
)
def test_bad_arguments_are_named_before_any_work(
    device: torch.device, randomise: Randomise, kwargs: dict[str, Any], words: str
) -> None:
    model = _model(device, torch.float32, randomise, 0)
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    args = {"max_new_tokens": 4, **kwargs}
    try:
        with pytest.raises(InputError, match=words):
            generate(model, _prompt(2, 3, 1, device), **args)
    finally:
        handle.remove()
    assert calls == []
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_a_bad_prompt_names_what_was_expected(device: torch.device, randomise: Randomise) -> None:
    model = _model(device, torch.float32, randomise, 0)
    good = _prompt(2, 3, 1, device)
    with pytest.raises(InputError, match=r"\[0, 22\].*max 23"):
        generate(model, good.clone().fill_(CFG.V), 1)
    with pytest.raises(InputError, match="int64"):
        generate(model, good.to(torch.int16), 1)
    with pytest.raises(InputError, match="meta"):
        generate(model, good.to("meta"), 1)
    with pytest.raises(InputError, match="GPT"):
        generate(model.blocks[0].attn, good, 1)  # type: ignore[arg-type]
