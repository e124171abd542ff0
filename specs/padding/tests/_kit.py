"""The padding stage's kit: the builders its acceptance tests share.

Why this folder and not one kit for every stage: a verdict copies into its
sandbox only ``specs/<stage>/`` of the stages it runs, and the amendment
check charges each path under ``specs/`` to the stage it names. Here the kit
is always written beside the tests that load it, and an edit of it is an
amendment of padding, judged like an edit of those tests. The tests load it
by path (pytest's importlib mode puts no test folder on ``sys.path``);
pytest does not collect it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]


def model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int = 0,
    fast: bool = False,
) -> GPT:
    """A GPT with drawn weights, in ``dtype`` on ``device``, in eval mode; the fast path on."""
    gpt = GPT(cfg)
    randomise(gpt, seed)
    gpt.to(device=device, dtype=dtype).eval()
    return use_fast_attention(gpt) if fast else gpt  # type: ignore[return-value]


def tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


def mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The (B, t) left-padding mask: row b is False on its first pads[b] columns."""
    cols = torch.arange(t)  # (t,)
    return (cols[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t) bool


def state(gpt: GPT) -> tuple[list[Any], list[bool], dict[str, torch.Tensor]]:
    """What a call must hand back unchanged: module classes and attributes, modes, weights."""
    return (
        [(type(m), sorted(vars(m))) for m in gpt.modules()],
        [m.training for m in gpt.modules()],
        {k: v.clone() for k, v in gpt.state_dict().items()},
    )


def assert_same_state(gpt: GPT, before: tuple[Any, ...]) -> None:
    """``gpt`` is as ``state`` found it."""
    classes, flags, weights = state(gpt)
    assert classes == before[0]
    assert flags == before[1]
    for k, v in weights.items():
        assert torch.equal(v, before[2][k]), k


def watch_attention_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every attribute write on an attention module (``__class__`` included).

    Switching a module in place or attaching a cache writes to it; "before any
    module changes" means none of that happens before an error, even where the
    module would be handed back afterwards.
    """
    writes: list[str] = []

    def spy(module: torch.nn.Module, name: str, value: Any) -> None:
        writes.append(f"{type(module).__name__}.{name}")
        torch.nn.Module.__setattr__(module, name, value)

    monkeypatch.setattr(CausalSelfAttention, "__setattr__", spy)
    return writes
