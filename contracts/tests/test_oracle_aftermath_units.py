"""What a call leaves behind: the worker's measurements and the trusted comparison.

The worker side (``sandbox/_oracle_aftermath.py``) must see an input changed
in place, an earlier output overwritten, the generator moved and the storage
a module holds; the trusted side must flag a head that departs from the base
and keep one that matches it.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from niels_gpt_contracts.decoding import Malformed
from niels_gpt_contracts.sandbox.oracle_run import Stream, read_stream
from niels_gpt_contracts.verdict import oracle_aftermath

SANDBOX = Path(oracle_aftermath.__file__).parents[1] / "sandbox"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SANDBOX / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run(*calls: tuple[str, Any]) -> Stream:
    kit, after = _load("_oracle_kit"), _load("_oracle_aftermath")
    buf = io.BytesIO()
    o = kit.Oracle("s", 7, kit.Frames(buf), run=lambda n: True, watch={})
    o.after = after.Aftermath(lambda n: True)
    for name, fn in calls:
        o.call(name, fn, desc=name, stages=1, reduction=1)
    o.held("held", torch.nn.Linear(4, 4), desc="a linear layer")
    kit.Frames(buf).write({"kind": "done"})
    stream = Stream("head")
    buf.seek(0)
    assert read_stream(buf, stream)
    return stream


def _after(stream: Stream, name: str) -> Any:
    return stream.calls[("s", name)].after


def test_the_worker_sees_what_a_call_leaves_behind() -> None:
    x, buf = torch.ones(2, 4), torch.zeros(3)

    def scale(t: torch.Tensor) -> torch.Tensor:
        return t.mul_(2.0)  # in place: the caller's tensor changes

    def shared() -> torch.Tensor:
        return buf.add_(1.0)  # the same storage every call

    s = _run(
        ("lin", functools.partial(torch.nn.Linear(4, 4), x)),
        ("scale", functools.partial(scale, x)),
        ("shared", shared),
        ("shared2", shared),
        ("drop", functools.partial(torch.nn.functional.dropout, x, 0.5)),
    )
    lin = _after(s, "lin")
    assert lin["inputs"] == {"checked": ["arg0", "fn:bias", "fn:weight"], "changed": []}
    assert lin["flops"] == 2 * 2 * 4 * 4 and lin["ops"] >= 1
    assert _after(s, "scale")["inputs"]["changed"] == ["arg0"]
    assert _after(s, "shared")["clobbered"] == []
    assert _after(s, "shared2")["clobbered"] == ["shared/out"]
    assert _after(s, "drop")["clobbered"] == []  # reported once, by the call that did it
    assert _after(s, "drop")["state"]["rng"] != lin["state"]["rng"]  # dropout drew
    assert _after(s, "scale")["state"]["rng"] == lin["state"]["rng"]  # the same start
    assert _after(s, "drop")["state"]["rng_moved"] and not lin["state"]["rng_moved"]
    assert s.held[("s", "held")].bytes == 4 * (16 + 4)


def test_a_counted_call_names_every_torch_global_it_left_changed() -> None:
    """Not a list of flags: the compiler's stance, a dynamo config, a backend flag."""

    def leaves_settings() -> torch.Tensor:
        torch.compiler.set_stance("force_eager")
        torch.backends.mkldnn.enabled = False
        return torch.ones(2)

    try:
        s = _run(("clean", lambda: torch.ones(2)), ("leaves", leaves_settings))
    finally:
        torch.compiler.set_stance("default")
        torch.backends.mkldnn.enabled = True
    assert _after(s, "clean")["state"]["globals"] == []
    assert _after(s, "leaves")["state"]["globals"] == [
        "torch.backends.mkldnn.enabled",
        "torch.compiler.stance",
    ]
    base = {**BASE, "state": {**BASE["state"], "globals": []}}
    head = {**BASE, "state": {**BASE["state"], "globals": ["torch.compiler.stance"]}}
    found = oracle_aftermath.compare(head, base)
    assert ("oracle.side-effect", "left torch.compiler.stance changed, where the base's call "
            "leaves them") in found  # fmt: skip
    assert oracle_aftermath.compare(base, base) == []


BASE = {
    "inputs": {"checked": ["arg0", "fn:weight"], "changed": []},
    "clobbered": [],
    "state": {"grad": False, "inference": False, "dtype": "torch.float32", "threads": True,
              "deterministic": False, "autocast": [False, "torch.bfloat16"], "rng": "aa",
              "rng_moved": True},
    "flops": 1000, "ops": 40,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "rule", "words"),
    [
        ({"inputs": {"checked": ["arg0"], "changed": ["arg0"]}}, "oracle.side-effect", "arg0"),
        ({"clobbered": ["prev/out"]}, "oracle.side-effect", "prev/out"),
        ({"state": {**BASE["state"], "rng_moved": False}}, "oracle.side-effect", "global RNG"),  # type: ignore[dict-item]
        ({"state": {**BASE["state"], "grad": True}}, "oracle.side-effect", "grad mode"),  # type: ignore[dict-item]
        ({"ops": 6600}, "oracle.cost", "6600 dispatched ATen ops"),
        ({"flops": 100000}, "oracle.cost", "100000 FLOPs"),
    ],
    ids=["input", "clobber", "rng", "grad", "ops", "flops"],
)
def test_a_head_that_departs_from_the_base_is_flagged(
    change: dict[str, Any], rule: str, words: str
) -> None:
    found = oracle_aftermath.compare({**BASE, **change}, BASE)
    assert [r for r, _ in found] == [rule] and words in found[0][1]


def test_a_head_like_the_base_passes_and_a_malformed_one_raises() -> None:
    assert oracle_aftermath.compare(dict(BASE), BASE) == []
    assert oracle_aftermath.compare({**BASE, "ops": 40 * 3 // 2 + 16}, BASE) == []  # the slack
    # a module buffer only the PR has may change (its own state), an argument may not
    new = {"inputs": {"checked": ["arg0", "self:cache"], "changed": ["self:cache"]}}
    assert oracle_aftermath.compare({**BASE, **new}, BASE) == []
    with pytest.raises(Malformed):
        oracle_aftermath.compare({**BASE, "ops": "many"}, BASE)
    with pytest.raises(Malformed):
        oracle_aftermath.compare(None, BASE)


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (
            {"inputs": {"checked": [1], "changed": []}},
            "Expected `str`, got `int` - at `$.inputs.checked[0]`",
        ),
        ({"ops": True}, "Expected `int | null`, got `bool` - at `$.ops`"),
        ({"flops": -1}, "Expected `int` >= 0 - at `$.flops`"),
        ({"state": {"grad": "yes\nno"}}, "Expected `bool | null`, got `str` - at `$.state.grad`"),
        ({"clobbered": None}, "Expected `array`, got `null` - at `$.clobbered`"),
    ],
    ids=["checked", "ops", "flops", "state", "clobbered"],
)
def test_a_malformed_report_is_refused_with_its_reason(broken: dict[str, Any], reason: str) -> None:
    """Decoded by type: the reason names the key and the type, on one line."""
    with pytest.raises(Malformed) as caught:
        oracle_aftermath.compare({**BASE, **broken}, BASE)
    assert str(caught.value) == f"a call's aftermath: {reason}"


def test_the_generator_moved_by_another_amount_is_not_a_side_effect() -> None:
    """An honest re-blocking of dropout draws a seed per block: the generator ends
    elsewhere than the base's, but both calls drew from it."""
    moved = {**BASE, "state": {**BASE["state"], "rng": "cc"}}  # type: ignore[dict-item]
    assert oracle_aftermath.compare(moved, BASE) == []


def _hvp(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Hessian-vector product through a module (the grad2 axis's kind of call)."""
    x = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(m(x).pow(2).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad((g * g).sum(), x)
    return h  # (4, 8)


def test_a_counted_call_may_take_second_derivatives_and_its_flops_are_torchs() -> None:
    """Counting must not change what a call does: a counted Hessian-vector product
    through modules answers (FlopCounterMode's module tracker makes it raise), and
    the FLOPs of a forward and backward are FlopCounterMode's own figure."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)  # (4, 8)
    stream = _run(("hvp", functools.partial(_hvp, m, x)))
    call = stream.calls[("s", "hvp")]
    assert call.error is None, call.message
    assert _after(stream, "hvp")["flops"] > 0

    def train_step() -> torch.Tensor:
        m(x).sum().backward()
        return x  # (4, 8)

    with FlopCounterMode(display=False) as counter:
        train_step()
    stream = _run(("step", train_step))
    assert _after(stream, "step")["flops"] == counter.get_total_flops()
