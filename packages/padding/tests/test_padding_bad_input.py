"""Bad input: ``InputError`` naming the expected and the actual value, before any work.

"Before any work": no forward hook of the model fires, no module changes
class or attributes, and ``rope.apply_rope`` is never reached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, use_kv_cache
from niels_gpt.model.padding import apply_rope_rows, generate, padded_forward

Randomise = Callable[[torch.nn.Module, int], None]
CFG = ModelConfig(V=13, T=7, C=8, L=2, H=2, d_ff=6, dropout=0.0)


def _mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


def _other(device: torch.device) -> torch.device:
    return torch.device("meta") if device.type == "cpu" else torch.device("cpu")


def _state(model: GPT) -> list[Any]:
    return [(type(m), sorted(vars(m)), m.training) for m in model.modules()]


def _refused(model: GPT, call: Callable[[], object], needles: list[str]) -> None:
    """``call`` raises InputError holding every needle, and nothing ran."""
    before = _state(model)
    fired: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args: fired.append(type(mod).__name__))
        for m in (model, model.blocks[0], model.blocks[0].attn)
    ]
    try:
        with pytest.raises(InputError) as caught:
            call()
    finally:
        for h in handles:
            h.remove()
    assert fired == [] and _state(model) == before
    for needle in needles:
        assert needle in str(caught.value), f"{needle!r} not in {caught.value!s}"


def _model(device: torch.device, randomise: Randomise) -> GPT:
    model = GPT(CFG)
    randomise(model, 0)
    return model.to(device).eval()


@pytest.mark.invariant("padding.rejects_bad_input")
def test_padded_forward_refuses_bad_masks_ids_and_layers(
    device: torch.device, randomise: Randomise
) -> None:
    model = _model(device, randomise)
    ids = torch.randint(0, CFG.V, (3, 5), generator=torch.Generator().manual_seed(0)).to(device)
    mask = _mask([0, 2, 5], 5, device)  # (3, 5), row 2 all padding: allowed here
    hole = mask.clone()
    hole[1, 3] = False
    other = _other(device)
    cases: dict[str, tuple[Any, Any, dict[str, Any], list[str]]] = {
        "mask-int8": (ids, mask.to(torch.int8), {}, ["torch.bool", "torch.int8"]),
        "mask-float64": (ids, mask.double(), {}, ["torch.bool", "torch.float64"]),
        "mask-tuple": (ids, tuple(mask.tolist()), {}, ["tuple"]),
        "mask-wider": (ids, _mask([0, 2, 5], 6, device), {}, ["(3, 5)", "(3, 6)"]),
        "mask-3-d": (ids, mask[None], {}, ["(3, 5)", "(1, 3, 5)"]),
        "mask-device": (ids, mask.to(other), {}, [str(device), str(other)]),
        "mask-hole": (ids, hole, {}, ["row 1"]),
        "mask-right": (ids, mask.flip(-1), {}, ["row 1"]),
        "ids-bool": (ids.bool(), mask, {}, ["torch.bool"]),
        "ids-no-rows": (ids[:0], mask[:0], {}, ["(0, 5)"]),
        "ids-empty": (ids[:, :0], mask[:, :0], {}, ["[1, 7]", "0"]),
        "ids-too-long": (ids.repeat(1, 2), mask.repeat(1, 2), {}, ["[1, 7]", "10"]),
        "pad-id-negative": (ids.masked_fill(~mask, -3), mask, {}, ["[0, 12]", "-3"]),
        "real-id-V": (ids.masked_fill(mask, CFG.V), mask, {}, ["[0, 12]", "13"]),
        "trace-layer-2": (ids, mask, {"trace_layer": 2}, ["[0, 1]", "2"]),
        "trace-layer-false": (ids, mask, {"trace_layer": False}, ["bool"]),
    }
    for name, (x, m, kwargs, needles) in cases.items():
        try:
            _refused(model, lambda x=x, m=m, kw=kwargs: padded_forward(model, x, m, **kw), needles)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from err


@pytest.mark.invariant("padding.rejects_bad_input")
def test_generate_refuses_bad_arguments(device: torch.device, randomise: Randomise) -> None:
    model = _model(device, randomise)
    prompt = torch.randint(0, CFG.V, (2, 4), generator=torch.Generator().manual_seed(1)).to(device)
    mask = _mask([3, 0], 4, device)
    gens = [torch.Generator(device=device), torch.Generator(device=device)]
    cases: dict[str, tuple[Any, Any, Any, dict[str, Any], list[str]]] = {
        "padded-width-over-T": (prompt, mask, 4, {}, ["cfg.T = 7", "4 + 4 = 8"]),
        "row-without-token": (prompt, _mask([4, 0], 4, device), 1, {}, ["row 0"]),
        "mask-int": (prompt, mask.int(), 1, {}, ["torch.bool", "torch.int32"]),
        "mask-shape": (prompt, mask[:, 1:], 1, {}, ["(2, 4)", "(2, 3)"]),
        "mask-hole": (
            prompt,
            torch.tensor([[True, False, True, True]] * 2, device=device),
            1,
            {},
            ["row 0"],
        ),
        "new-float": (prompt, mask, 1.0, {}, ["float"]),
        "new-negative": (prompt, mask, -2, {}, ["-2"]),
        "temperature-inf": (prompt, mask, 1, {"temperature": float("inf")}, ["inf"]),
        "temperature-str": (prompt, mask, 1, {"temperature": "hot"}, ["str"]),
        "top-k-float": (prompt, mask, 1, {"top_k": 2.0}, ["2.0"]),
        "top-p-bool": (prompt, mask, 1, {"top_p": True}, ["bool"]),
        "eos-V": (prompt, mask, 1, {"eos_id": CFG.V}, ["[0, 12]", "13"]),
        "trace-layer-L": (prompt, mask, 1, {"trace_layer": 2}, ["[0, 1]", "2"]),
        "generator-int": (prompt, mask, 1, {"generator": 7}, ["7"]),
        "generator-list-short": (prompt, mask, 1, {"generator": gens[:1]}, ["(2)", "got 1"]),
        "generator-list-item": (
            prompt,
            mask,
            1,
            {"generator": [gens[0], 3]},
            ["generator[1]", "int"],
        ),
        "generator-tuple-long": (prompt, mask, 1, {"generator": (*gens, gens[0])}, ["got 3"]),
        "prompt-int16": (prompt.short(), mask, 1, {}, ["int16"]),
    }
    for name, (p, m, new, kwargs, needles) in cases.items():
        try:
            _refused(
                model, lambda p=p, m=m, n=new, kw=kwargs: generate(model, p, m, n, **kw), needles
            )
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from err


class _Custom(CausalSelfAttention):
    """An attention subclass with a forward of its own: the stage cannot know its math."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().forward(x, **kwargs)


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.invariant("padding.leaves_model")
def test_models_with_unknown_or_cached_attention_are_refused(
    device: torch.device, randomise: Randomise
) -> None:
    model = _model(device, randomise)
    ids = torch.zeros(2, 3, dtype=torch.int64, device=device)
    mask = _mask([1, 0], 3, device)
    _refused(model, lambda: padded_forward(model.blocks[0], ids, mask), ["GPT", "Block"])  # type: ignore[arg-type]
    model.blocks[0].attn.__class__ = _Custom
    _refused(model, lambda: padded_forward(model, ids, mask), ["_Custom"])
    _refused(model, lambda: generate(model, ids, mask, 1), ["_Custom"])
    model.blocks[0].attn.__class__ = CausalSelfAttention
    use_kv_cache(model, 2)
    _refused(model, lambda: padded_forward(model, ids, mask), ["blocks.0.attn", "drop_kv_cache"])
    _refused(model, lambda: generate(model, ids, mask, 1), ["drop_kv_cache"])
    drop_kv_cache(model)
    assert isinstance(padded_forward(model, ids, mask), torch.Tensor)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_apply_rope_rows_refuses_before_rope_runs(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = rope.apply_rope

    def spy(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(rope, "apply_rope", spy)
    q = torch.randn(2, 3, 4, 6, device=device)  # (B, H, n, D)
    sin, cos = rope.rope_cache(9, 6, device=device)  # (1, 1, 9, 3) each
    pos = torch.arange(4, device=device).repeat(2, 1)  # (2, 4)
    other = _other(device)
    cases: dict[str, tuple[tuple[Any, ...], list[str]]] = {
        "k-none": ((q, None, sin, cos, pos), ["k", "NoneType"]),
        "q-5-d": ((q[None], q[None], sin, cos, pos), ["(1, 2, 3, 4, 6)"]),
        "k-other-device": ((q, q.to(other), sin, cos, pos), [str(other)]),
        "q-half-k-float": (
            (q.half(), q, sin.half(), cos.half(), pos),
            ["torch.float32", "torch.float16"],
        ),
        "sin-as-rows": (
            (q, q, sin[0, 0][pos][:, None], cos[0, 0][pos][:, None], pos),
            ["(2, 1, 4, 3)"],
        ),
        "cos-shorter": ((q, q, sin, cos[:, :, :8], pos), ["(1, 1, 9, 3)", "(1, 1, 8, 3)"]),
        "table-empty": ((q, q, sin[:, :, :0], cos[:, :, :0], pos), ["Tc >= 1"]),
        "positions-transposed": ((q, q, sin, cos, pos.T), ["(2, 4)", "(4, 2)"]),
        "positions-bool": ((q, q, sin, cos, pos.bool()), ["torch.bool"]),
        "position-9": ((q, q, sin, cos, pos + 6), ["[0, 8]", "max 9"]),
    }
    for name, (args, needles) in cases.items():
        with pytest.raises(InputError) as caught:
            apply_rope_rows(*args)
        assert calls == [], name
        for needle in needles:
            assert needle in str(caught.value), f"{name}: {needle!r} not in {caught.value!s}"
    apply_rope_rows(q, q, sin, cos, pos)
    assert calls == [1]
