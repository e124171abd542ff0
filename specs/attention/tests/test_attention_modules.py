"""Acceptance tests of attention 3.2: ``attention_modules``, the one walk over a model's attention.

The expected list is written down while a random tree of containers is built
(pre-order, names joined with dots, a module met again left out), never read
back from ``named_modules``: the walk must find every ``CausalSelfAttention``
(subclasses included, the root included) under the name a ``state_dict`` key
would carry, in that order, and change nothing on the model.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, attention_modules

CFG = ModelConfig(V=11, T=8, C=8, L=1, H=2, d_ff=12)
Found = list[tuple[str, nn.Module]]


class OwnAttention(CausalSelfAttention):
    """A subclass another stage might write: it is attention, so the walk lists it."""


class Holder(nn.Module):
    """A plain module that holds one child as an attribute, as a Block holds its attention."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.inner = child


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@st.composite
def trees(draw: st.DrawFn, depth: int = 3) -> tuple[nn.Module, Found]:
    """A module tree and the attention modules in it, recorded in pre-order as it is built."""

    def build(prefix: str, level: int) -> tuple[nn.Module, Found]:
        kind = draw(st.sampled_from(["attention", "own", "linear", "sequential", "dict", "holder"]))
        if level == depth and kind in ("sequential", "dict", "holder"):
            kind = "linear"
        if kind in ("attention", "own"):
            module: nn.Module = (CausalSelfAttention if kind == "attention" else OwnAttention)(CFG)
            return module, [(prefix, module)]
        if kind == "linear":
            return nn.Linear(2, 2), []
        if kind == "holder":
            child, found = build(_join(prefix, "inner"), level + 1)
            return Holder(child), found
        size = draw(st.integers(0, 3))
        names = [str(i) if kind == "sequential" else f"m{i}" for i in range(size)]
        children: list[nn.Module] = []
        found = []
        for name in names:
            child, inside = build(_join(prefix, name), level + 1)
            children.append(child)
            found += inside
        if children and draw(st.booleans()):  # the first child again, under a new name
            children.append(children[0])  # named_modules meets it twice, lists it once
        if kind == "sequential":
            return nn.Sequential(*children), found
        return nn.ModuleDict({f"m{i}": c for i, c in enumerate(children)}), found

    return build("", 0)


@pytest.mark.invariant("attention.attention_modules")
@settings(max_examples=60, deadline=None)
@given(tree=trees())
def test_the_walk_lists_every_attention_module_in_preorder_with_its_name(
    tree: tuple[nn.Module, Found],
) -> None:
    model, want = tree
    state = {k: v.clone() for k, v in model.state_dict().items()}
    got = attention_modules(model)
    assert [name for name, _ in got] == [name for name, _ in want]
    assert all(a is b for (_, a), (_, b) in zip(got, want, strict=True))
    assert all(isinstance(m, CausalSelfAttention) for _, m in got)
    assert model.state_dict().keys() == state.keys()  # nothing added, nothing replaced
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.invariant("attention.attention_modules")
def test_an_attention_module_is_its_own_walk_and_its_children_are_not_attention() -> None:
    alone = CausalSelfAttention(CFG)
    assert [(n, m is alone) for n, m in attention_modules(alone)] == [("", True)]
    sub = OwnAttention(CFG)
    found = attention_modules(nn.Sequential(nn.Linear(2, 2), Holder(sub)))
    assert [(n, m is sub) for n, m in found] == [("1.inner", True)]
    assert attention_modules(nn.Linear(3, 3)) == []


@pytest.mark.invariant("attention.rejects_bad_input")
@pytest.mark.parametrize("value", [None, 3, "model", [CausalSelfAttention(CFG)]])
def test_the_walk_needs_a_module(value: object) -> None:
    with pytest.raises(InputError, match=f"model must be an nn.Module, got {type(value).__name__}"):
        attention_modules(value)  # type: ignore[arg-type]
