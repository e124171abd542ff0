"""Acceptance tests of padded ``generate`` (stage padding): what it returns, the
unpadded path, the model it hands back and the input it refuses.

``test_generate.py`` holds the row-for-row, sampling and eos tests; both load
the stage's builders from ``padding_kit``.
"""

from __future__ import annotations

from typing import Any

import padding_kit as kit
import pytest
import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel
from niels_gpt.model.kv_cache import use_kv_cache
from niels_gpt.model.padding import generate

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

# --- output and the unpadded path -------------------------------------------------------------


@pytest.mark.invariant("padding.output_contract")
def test_output_is_the_padded_prompt_then_the_new_ids(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=13, T=10, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    pads, t = [2, 0, 3], 4
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 2)
        prompt = rig.tokens(cfg, 3, t, 7)  # (3, 4)
        mask = kit.mask(pads, t, rig.device)
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
def test_no_padding_is_kv_cache_generate_bit_for_bit(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=23, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    for dtype in rig.float_dtypes:
        model = kit.flatten(rig.model(cfg, dtype, 5, fast), 0.4)
        prompt = rig.tokens(cfg, 3, 4, 3)  # (3, 4)
        for mask in (None, torch.ones(3, 4, dtype=torch.bool, device=rig.device)):
            knobs: dict[str, Any] = {"temperature": 0.9, "top_k": 9, "top_p": 0.9}
            ids, traces = generate(
                model,
                prompt,
                mask,
                9,
                **knobs,
                eos_id=2,
                generator=rig.generator(4),
                trace_layer=1,
            )
            want, want_traces = kv_cache.generate(
                model,
                prompt,
                9,
                **knobs,
                eos_id=2,
                generator=rig.generator(4),
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
def test_generate_hands_the_model_back_as_it_was(rig: kit.Rig, fast: bool, training: bool) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = rig.model(cfg, torch.float32, 6, fast).train(training)
    before = kit.state(model)
    prompt = rig.tokens(cfg, 2, 4, 1)  # (2, 4)
    gens = [rig.generator(1), rig.generator(2)]
    generate(
        model, prompt, kit.mask([2, 0], 4, rig.device), 5, top_p=0.9, generator=gens, trace_layer=1
    )
    kit.assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is (sdpa_kernel if fast else None) for b in model.blocks)


@pytest.mark.invariant("padding.leaves_model")
def test_generate_restores_the_model_when_a_step_fails(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=21, T=12, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 6)
    before = kit.state(model)
    with kit.failing_call(model.blocks[1], 3), pytest.raises(RuntimeError, match="injected"):
        generate(model, rig.tokens(cfg, 2, 3, 1), kit.mask([1, 0], 3, rig.device), 6)
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
    gens = [kit.generator(device, 0), kit.generator(device, 1)]
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
    rig: kit.Rig, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt, mask, args, kwargs, needles = _bad_calls(rig.device)[case]
    model = rig.model(BAD_CFG, torch.float32, 0)
    before = kit.state(model)
    writes = kit.watch_attention_writes(monkeypatch)
    kit.assert_refused_unrun(  # not even GPT.forward's own checks ran
        lambda: generate(model, prompt, mask, *args, **kwargs),
        (model, model.blocks[0], model.blocks[0].attn),
        InputError,
        needles,
    )
    assert writes == []  # no module was switched and no cache attached, not even for a moment
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_generate_rejects_models_it_cannot_switch(rig: kit.Rig) -> None:
    model = rig.model(BAD_CFG, torch.float32, 0)
    prompt, mask = kit.batch(rig, BAD_CFG, [1, 0], 3, 1)  # (2, 3)
    with pytest.raises(InputError):
        generate(model.blocks, prompt, mask, 1)  # type: ignore[arg-type]
    use_kv_cache(model, 2)  # switched for cached generation: drop_kv_cache first
    before = kit.state(model)
    with pytest.raises(InputError):
        generate(model, prompt, mask, 1)
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_generators_must_live_on_the_models_device(rig: kit.Rig) -> None:
    model = rig.model(BAD_CFG, torch.float32, 0)
    prompt, mask = kit.batch(rig, BAD_CFG, [1, 0], 3, 0)  # (2, 3)
    own = generate(model, prompt, mask, 2, generator=[rig.generator(0), rig.generator(1)])
    assert isinstance(own, torch.Tensor) and own.shape == (2, 5)
    if rig.device.type != "cpu":  # CPU generators for a model elsewhere
        with pytest.raises(InputError):
            generate(model, prompt, mask, 2, generator=[torch.Generator(), torch.Generator()])
        with pytest.raises(InputError):
            generate(model, prompt, mask, 2, generator=torch.Generator())


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
def test_generate_puts_no_hook_on_the_model_before_its_checks(
    rig: kit.Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3.1: generate may run kv_cache.generate inside the frame's hooks; a call its own checks
    refuse gets none of them. Here the padded width plus the new tokens pass cfg.T while
    the real prompts are short, and a generator list has the wrong length."""
    cfg = ModelConfig(V=11, T=8, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = rig.model(cfg, torch.float32, 0)
    prompt = rig.tokens(cfg, 2, 5, 0)  # (2, 5)
    mask = kit.mask([3, 3], 5, rig.device)  # real prompts of 2 tokens: 2 + 4 <= 8, but 5 + 4 > 8
    hooked = kit.watch_hook_registrations(monkeypatch)
    with pytest.raises(InputError, match=r"cfg\.T"):
        generate(model, prompt, mask, 4, temperature=0.0)
    with pytest.raises(InputError, match="generator"):
        generate(model, prompt, mask, 2, generator=[rig.generator(1)])
    assert hooked == []
