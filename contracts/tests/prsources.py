"""The toy monorepo's stage sources, tests, mutants and oracle driver, as text.

``prkit`` writes them into a scratch repository (its ``FILES``) and gives
each stage its spec; they live apart so that the repository's layout and
the scenario API (``prkit``) read in one screen. The stages are described in
``prkit``'s docstring.
"""

from __future__ import annotations

CORE_MOD = """\
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    V: int = 256
    T: int = 8
"""

CORE_TEST = """\
import pytest

from ngt.config import ModelConfig


@pytest.mark.invariant("core.defaults")
def test_defaults():
    assert ModelConfig().T == 8


@pytest.mark.invariant("core.keeps_fields")
def test_keeps_fields():
    cfg = ModelConfig(T=4)
    assert (cfg.V, cfg.T) == (256, 4)
"""

ROPE_MOD = """\
from __future__ import annotations

__all__ = ["rotate"]


def rotate(xs: list[float], turns: int = 1) -> list[float]:
    if not xs:
        raise ValueError("rotate: expected a non-empty list, got []")
    n = turns % len(xs)
    return xs[n:] + xs[:n]
"""

ROPE_TEST = """\
import pytest

from ngt.model.rope import rotate


@pytest.mark.invariant("rope.keeps_length")
def test_keeps_length():
    assert len(rotate([1.0, 2.0, 3.0])) == 3


@pytest.mark.invariant("rope.turns_compose")
def test_turns_compose():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert rotate(rotate(xs)) == rotate(xs, turns=2) == [3.0, 4.0, 1.0, 2.0]
    assert rotate([1.0, 2.0, 3.0]) == [2.0, 3.0, 1.0]


@pytest.mark.invariant("rope.rejects_empty")
def test_rejects_empty():
    with pytest.raises(ValueError, match="non-empty"):
        rotate([])
"""

ROPE_MUTANTS = """
[[mutants]]
id = "turns-backwards"
text = "rotate turns the wrong way."
file = "packages/rope/src/ngt/model/rope.py"
find = "return xs[n:] + xs[:n]"
replace = "return xs[-n:] + xs[:-n]"
"""

MIXER_MOD = """\
from __future__ import annotations

import ngt.model.rope as rope

__all__ = ["mix"]


def mix(xs: list[float], *, scale: float = 0.5) -> list[float]:
    if any(not isinstance(x, float) for x in xs):
        raise TypeError(f"mix: expected floats, got {[type(x).__name__ for x in xs]}")
    turned = rope.rotate(xs)
    return [scale * (a + b) for a, b in zip(xs, turned, strict=True)]
"""

MIXER_TEST = """\
import pytest

from ngt.config import ModelConfig
from ngt.model.mixer import mix


@pytest.mark.invariant("mixer.averages")
def test_mix_averages_neighbours():
    assert mix([1.0, 3.0, 5.0]) == pytest.approx([2.0, 4.0, 3.0], abs=1e-9)


@pytest.mark.invariant("mixer.averages")
def test_mix_scale():
    assert mix([2.0, 6.0], scale=0.25) == pytest.approx([2.0, 2.0], abs=1e-9)


@pytest.mark.invariant("mixer.rejects_ints")
def test_rejects_ints():
    with pytest.raises(TypeError, match="expected floats"):
        mix([1, 2])


@pytest.mark.invariant("mixer.long_context")
def test_long_context():
    cfg = ModelConfig()
    if cfg.T < 4:
        pytest.skip("this check needs a context of at least 4")
    assert len(mix([1.0] * cfg.T)) == cfg.T


@pytest.mark.skipif(True, reason="needs an accelerator this machine lacks")
@pytest.mark.invariant("mixer.averages")
def test_mix_on_an_accelerator():
    raise AssertionError("never runs here")
"""

GPT_MOD = """\
from __future__ import annotations

import ngt.model.mixer as mixer
from ngt.config import ModelConfig

__all__ = ["forward"]


def forward(cfg: ModelConfig, xs: list[float]) -> list[float]:
    return mixer.mix(xs[: cfg.T])
"""

GPT_TEST = """\
import pytest

from ngt.config import ModelConfig
from ngt.model.gpt import forward


@pytest.mark.invariant("backbone_v1.truncates")
def test_truncates():
    assert len(forward(ModelConfig(V=3, T=2), [1.0, 2.0, 3.0])) == 2
"""

ATTN_MOD = """\
from __future__ import annotations

import math

import torch

__all__ = ["attend"]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if q.dtype != torch.float32:
        raise TypeError(f"attend: expected float32, got {q.dtype}")
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
"""

ATTN_TEST = """\
import pytest
import torch
import torch.nn.functional as F

from ngt.model.attention import attend


def _qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 5, 4, generator=gen) for _ in range(3)]


@pytest.mark.invariant("attention.matches_reference")
def test_matches_reference():
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attend(q, k, v), want, rtol=1e-5, atol=1e-6)


@pytest.mark.invariant("attention.rejects_half")
def test_rejects_half():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="float32"):
        attend(q.half(), k.half(), v.half())
"""

ATTN_DRIVER = """\
from __future__ import annotations

import torch

from ngt.model.attention import attend


def drive(device, record):
    q = torch.randn(2, 3, 5, 4, device=device, requires_grad=True)
    with record():
        attend(q, q, q).sum().backward()
        with torch.no_grad():
            attend(q, q, q)
"""

FAST_MOD = """\
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend_fast"]


def attend_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""

FAST_TEST = """\
import pytest
import torch

from ngt.model.attention import attend
from ngt.model.fastpath import attend_fast


@pytest.mark.invariant("fastpath.same_as_explicit")
def test_same_as_explicit():
    q = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(attend_fast(q, q, q), attend(q, q, q), rtol=1e-5, atol=1e-6)
"""
