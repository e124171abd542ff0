"""Acceptance tests of ``padded_forward`` (stage padding): its output's shapes and
dtypes, the model it hands back and the input it refuses.
"""

from __future__ import annotations

from typing import Any

import padding_kit as kit
import pytest
import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel
from niels_gpt.model.kv_cache import use_kv_cache
from niels_gpt.model.padding import padded_forward

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

# --- the output ----------------------------------------------------------------------------------


@pytest.mark.invariant("padding.output_contract")
@pytest.mark.parametrize("fast", [False, True])
def test_output_shapes_and_dtypes_are_the_explicit_paths(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=17, T=8, C=16, L=2, H=4, d_ff=12, dropout=0.1)
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 2, fast)
        ids, mask = kit.batch(rig, cfg, [2, 0, 6], 7, 5)  # (3, 7)
        with torch.no_grad():
            _, explicit = model.forward_with_attn_trace(ids, 0, return_full_attn=True)
            logits = padded_forward(model, ids, mask)
            traced, trace = padded_forward(model, ids, mask, trace_layer=1)
        assert isinstance(logits, torch.Tensor)
        assert logits.shape == traced.shape == (3, 7, cfg.V)
        assert logits.dtype == traced.dtype == dtype and logits.device == ids.device
        assert set(trace) == {"layer", "attn_row", "attn_full"} and trace["layer"] == 1
        full = trace["attn_full"]
        assert explicit["attn_full"] is not None and full is not None
        assert full.shape == (3, cfg.H, 7, 7) and full.dtype == explicit["attn_full"].dtype
        assert trace["attn_row"].shape == (3, cfg.H, 7) and full.device == ids.device


# --- the model afterwards -----------------------------------------------------------------------


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_padded_forward_hands_the_model_back_as_it_was(
    rig: kit.Rig, fast: bool, training: bool
) -> None:
    cfg = ModelConfig(V=21, T=8, C=16, L=2, H=2, d_ff=12, dropout=0.1)
    model = rig.model(cfg, torch.float32, 6, fast).train(training)
    before = kit.state(model)
    ids = rig.tokens(cfg, 2, 8, 1)  # (2, 8)
    logits = padded_forward(model, ids, kit.mask([3, 0], 8, rig.device), trace_layer=1)[0]
    logits.sum().backward()
    kit.assert_same_state(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is (sdpa_kernel if fast else None) for b in model.blocks)
    model.zero_grad()
    with torch.no_grad():
        padded_forward(model, ids, kit.mask([0, 5], 8, rig.device))
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
def test_padded_forward_restores_the_model_when_a_layer_fails(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=21, T=8, C=16, L=2, H=2, d_ff=12, dropout=0.0)
    model = rig.model(cfg, torch.float32, 6, fast)
    before = kit.state(model)
    with kit.failing_call(model.blocks[1], 1), pytest.raises(RuntimeError, match="injected"):
        padded_forward(model, rig.tokens(cfg, 2, 6, 1), kit.mask([2, 0], 6, rig.device))
    kit.assert_same_state(model, before)


# --- bad input ---------------------------------------------------------------------------------

BAD_CFG = ModelConfig(V=11, T=8, C=8, L=2, H=2, d_ff=8, dropout=0.0)


def _bad_calls(device: torch.device) -> dict[str, tuple[Any, Any, dict[str, Any], list[str]]]:
    """name -> (ids, mask, keywords, strings the message must hold)."""
    ids = kit.tokens(BAD_CFG, 2, 5, 0, device)  # (2, 5)
    mask = kit.mask([2, 0], 5, device)  # (2, 5)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    right = mask.flip(-1)  # (2, 5): real tokens first, pads after
    hole = mask.clone()
    hole[1, 2] = False  # a pad between real tokens
    return {
        "mask-int64": (ids, mask.long(), {}, ["torch.bool", "torch.int64"]),
        "mask-float": (ids, mask.float(), {}, ["torch.bool", "torch.float32"]),
        "mask-uint8": (ids, mask.to(torch.uint8), {}, ["torch.bool", "torch.uint8"]),
        "mask-list": (ids, mask.tolist(), {}, []),
        "mask-shorter": (ids, mask[:, :4], {}, ["(2, 5)", "(2, 4)"]),
        "mask-more-rows": (ids, kit.mask([2, 0, 1], 5, device), {}, ["(2, 5)", "(3, 5)"]),
        "mask-1-d": (ids, mask[1], {}, ["(2, 5)", "(5,)"]),
        "mask-other-device": (ids, mask.to(other), {}, [str(ids.device), str(other)]),
        "mask-right-padded": (ids, right, {}, ["row 0"]),
        "mask-hole": (ids, hole, {}, ["row 1"]),
        "ids-int32": (ids.int(), mask, {}, []),
        "ids-float": (ids.float(), mask, {}, []),
        "ids-1-d": (ids[0], mask[0], {}, []),
        "ids-empty": (ids[:, :0], mask[:, :0], {}, []),
        "ids-other-device": (ids.to(other), mask.to(other), {}, []),
        "pad-id-equal-V": (ids.masked_fill(~mask, BAD_CFG.V), mask, {}, []),
        "real-id-negative": (ids.masked_fill(mask, -1), mask, {}, []),
        "longer-than-T": (
            kit.tokens(BAD_CFG, 2, BAD_CFG.T + 1, 0, device),
            kit.mask([2, 0], BAD_CFG.T + 1, device),
            {},
            [],
        ),
        "trace-layer-L": (ids, mask, {"trace_layer": BAD_CFG.L}, []),
        "trace-layer-negative": (ids, mask, {"trace_layer": -1}, []),
        "trace-layer-bool": (ids, mask, {"trace_layer": True}, []),
        "trace-layer-float": (ids, mask, {"trace_layer": 1.0}, []),
    }


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_padded_forward_rejects_bad_input_before_any_work(
    rig: kit.Rig, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, mask, kwargs, needles = _bad_calls(rig.device)[case]
    model = rig.model(BAD_CFG, torch.float32, 0)
    before = kit.state(model)
    writes = kit.watch_attention_writes(monkeypatch)
    kit.assert_refused_unrun(
        lambda: padded_forward(model, ids, mask, **kwargs),
        (model.blocks[0], model.blocks[0].attn),
        InputError,
        needles,
    )
    assert writes == []  # no module was switched, not even for a moment
    kit.assert_same_state(model, before)


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_no_hook_is_put_on_the_model_before_the_checks(
    rig: kit.Rig, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.1: a padded call reaches the attention through hooks; bad input gets none of them,
    not even for a moment (the checks come first, not the model's own)."""
    ids, mask, kwargs, _ = _bad_calls(rig.device)[case]
    model = rig.model(BAD_CFG, torch.float32, 0)
    hooked = kit.watch_hook_registrations(monkeypatch)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask, **kwargs)
    assert hooked == []


class _OtherAttention(CausalSelfAttention):
    """An attention subclass with a forward of its own: the stage cannot know its math."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().forward(x, **kwargs)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_padded_forward_rejects_models_it_cannot_switch(rig: kit.Rig) -> None:
    model = rig.model(BAD_CFG, torch.float32, 0)
    ids, mask = kit.batch(rig, BAD_CFG, [1, 0], 4, 1)  # (2, 4)
    with pytest.raises(InputError):
        padded_forward(model.blocks, ids, mask)  # type: ignore[arg-type]
    model.blocks[1].attn.__class__ = _OtherAttention
    before = kit.state(model)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask)
    kit.assert_same_state(model, before)
    model.blocks[1].attn.__class__ = CausalSelfAttention
    use_kv_cache(model, 2)  # switched for cached generation
    before = kit.state(model)
    with pytest.raises(InputError):
        padded_forward(model, ids, mask)
    kit.assert_same_state(model, before)
