"""Acceptance tests of kv_cache's ``generate``: what it returns, the model and the
caches it hands back, the input it refuses, and 4.0's per-row generators and
inference mode.

``test_generate.py`` holds the greedy, sampling, eos and trace tests; both load
the stage's builders from ``kv_cache_kit``.
"""

from __future__ import annotations

import math
from typing import Any

import kv_cache_kit as kit
import pytest
import torch

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

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

# --- the output and the model afterwards -----------------------------------------


@pytest.mark.invariant("kv_cache.output_contract")
def test_output_is_the_prompt_then_the_new_ids(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=13, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 2)
        prompt = rig.tokens(cfg, 3, 4, 7)  # (3, 4)
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


@pytest.mark.invariant("kv_cache.generate_leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_generate_hands_the_model_back_as_it_was(rig: kit.Rig, fast: bool, training: bool) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = rig.model(cfg, torch.float32, 6, fast).train(training)
    before = kit.state(model)
    generate(model, rig.tokens(cfg, 2, 3, 1), 5, top_p=0.9, trace_layer=1)
    kit.assert_same_state(model, before)


@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_generate_keeps_the_callers_own_caches(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 6, fast=True)
    x = rig.tokens(cfg, 1, 4, 1)  # (1, 4)
    caches = use_kv_cache(model, 1)
    with torch.no_grad():
        model(x)
    kept = [(c.keys.clone(), c.values.clone()) for c in caches]
    before = kit.state(model)
    got = generate(model, rig.tokens(cfg, 3, 2, 2), 6, temperature=0)
    kit.assert_same_state(model, before)
    assert [len(c) for c in caches] == [4, 4]
    for c, (k, v) in zip(caches, kept, strict=True):
        assert torch.equal(c.keys, k) and torch.equal(c.values, v)
    drop_kv_cache(model)  # the fast path's kernel stays
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)
    assert torch.equal(got, generate(model, rig.tokens(cfg, 3, 2, 2), 6, temperature=0))


@pytest.mark.invariant("kv_cache.generate_leaves_model")
def test_generate_restores_the_model_when_a_step_fails(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 6)
    before = kit.state(model)
    with kit.failing_call(model.blocks[1], 3), pytest.raises(RuntimeError, match="injected"):
        generate(model, rig.tokens(cfg, 2, 3, 1), 6)
    kit.assert_same_state(model, before)
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
def test_generate_rejects_bad_input_before_any_work(rig: kit.Rig, case: str) -> None:
    calls = _bad_calls(rig.device)
    model = rig.model(BAD_CFG, torch.float32, 0)
    prompt, args, kwargs = calls[case]
    kit.assert_refused_unrun(  # not even GPT.forward's own checks ran
        lambda: generate(model, prompt, *args, **kwargs),
        (model, model.blocks[0], model.blocks[0].attn),
        InputError,
    )
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize("t", [3, BAD_CFG.T])
def test_a_too_long_generation_is_named_as_prompt_plus_new_tokens(rig: kit.Rig, t: int) -> None:
    """2.1: generate's own check names what is too long (t + max_new_tokens against cfg.T)."""
    model = rig.model(BAD_CFG, torch.float32, 0)
    with pytest.raises(InputError, match=r"t \+ max_new_tokens must be <= cfg\.T = 8"):
        generate(model, rig.tokens(BAD_CFG, 2, t, 0), BAD_CFG.T - t + 1)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_generate_rejects_a_model_that_is_not_a_gpt(device: torch.device) -> None:
    model = GPT(BAD_CFG).to(device)
    prompt = kit.tokens(BAD_CFG, 1, 2, 0, device)  # (1, 2)
    with pytest.raises(InputError):
        generate(model.blocks, prompt, 1)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        generate(model.blocks[0], prompt, 1)  # type: ignore[arg-type]


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_the_generator_must_live_on_the_models_device(rig: kit.Rig) -> None:
    model = rig.model(BAD_CFG, torch.float32, 0)
    prompt = rig.tokens(BAD_CFG, 2, 3, 0)  # (2, 3)
    own = generate(model, prompt, 2, generator=rig.generator(0))  # accepted
    assert isinstance(own, torch.Tensor) and own.shape == (2, 5)
    if rig.device.type != "cpu":  # a CPU generator for a model elsewhere
        with pytest.raises(InputError):
            generate(model, prompt, 2, generator=torch.Generator())
    with pytest.raises(InputError):
        generate(model, prompt, 2, generator=torch.Generator(device=rig.device).get_state())  # type: ignore[arg-type]


# --- 4.0: per-row generators, inference mode -------------------------------------------


@pytest.mark.invariant("kv_cache.per_row_generators")
def test_a_generator_list_draws_each_row_from_its_own(rig: kit.Rig) -> None:
    """Row b of a batch with generator[b] is row b generated alone with that generator."""
    cfg = ModelConfig(V=30, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, rig.widest, 4)
    prompt = rig.tokens(cfg, 3, 4, 2)  # (3, 4)
    knobs: dict[str, Any] = {"temperature": 0.9, "top_k": 12, "top_p": 0.95}
    seeds = (5, 6, 7)
    got = generate(model, prompt, 7, **knobs, generator=[rig.generator(s) for s in seeds])
    assert isinstance(got, torch.Tensor) and got.shape == (3, 11)
    for b, seed in enumerate(seeds):
        alone = generate(model, prompt[b : b + 1], 7, **knobs, generator=rig.generator(seed))
        assert torch.equal(got[b : b + 1], alone)
    gens = tuple(rig.generator(s) for s in seeds)
    assert torch.equal(generate(model, prompt, 7, **knobs, generator=gens), got)  # a tuple too
    if rig.device.type == "cpu":  # one generator shared by every row: drawn row 0 first
        shared = rig.generator(9)
        rows = generate(model, prompt, 7, generator=[shared] * 3)
        assert torch.equal(rows, generate(model, prompt, 7, generator=rig.generator(9)))


@pytest.mark.invariant("kv_cache.per_row_generators")
@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_a_bad_generator_list_is_refused_before_any_forward(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=20, T=10, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = rig.model(cfg, torch.float32, 1)
    prompt = rig.tokens(cfg, 2, 3, 1)  # (2, 3)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    for bad in (
        [rig.generator(1)],
        [rig.generator(1)] * 3,
        [rig.generator(1), 3],
    ):
        with pytest.raises(InputError, match="generator"):
            generate(model, prompt, 2, generator=bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="generator"):
            check_generator(bad, 2, rig.device)
    assert calls == []
    one = rig.generator(1)
    for good in (None, one, [one, rig.generator(2)], (one, one)):
        assert check_generator(good, 2, rig.device) is None


@pytest.mark.invariant("kv_cache.inference_mode")
@pytest.mark.invariant("kv_cache.output_contract")
def test_generate_decodes_in_inference_mode_and_returns_ordinary_tensors(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=20, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    model = rig.model(cfg, torch.float32, 3)
    prompt = rig.tokens(cfg, 2, 3, 1)  # (2, 3)
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
def test_check_knobs_is_the_knob_check_generate_runs(rig: kit.Rig) -> None:
    """4.2: the public knob check refuses what generate refuses, with the same message."""
    from niels_gpt.model.kv_cache import check_knobs  # 4.2's export: the rest collect without it

    cfg = ModelConfig(V=20, T=10, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = rig.model(cfg, torch.float32, 1)
    prompt = rig.tokens(cfg, 2, 3, 1)  # (2, 3)
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
