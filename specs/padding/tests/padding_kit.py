"""The padding stage's kit: the builders and references its acceptance tests share.

What kv_cache's tests need as well (the model and token builders, the
bundled fixtures, the float64 sampling filter, the attention-call
recorder, the model-state compare and the spies) comes from the spec kit
(``speckit.acceptance``) and is bound here under the names the tests use;
what is padding's alone is written here. The tests import this module
by name (``import padding_kit as kit``); pytest does not collect it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from speckit import acceptance as speckit

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT

# bound under the names the tests use
Tol, Randomise, NEG = speckit.Tol, speckit.Randomise, speckit.NEG
Rig, rig, knobs, flatten = speckit.Rig, speckit.rig, speckit.knobs, speckit.flatten
Case, cases, attention_calls = speckit.Case, speckit.cases, speckit.attention_calls
watch_draw_dtypes = speckit.watch_draw_dtypes
state, assert_same_state = speckit.state, speckit.assert_same_state
watch_hook_registrations, failing_call = speckit.watch_hook_registrations, speckit.failing_call
assert_refused_unrun = speckit.assert_refused_unrun
model, tokens, generator = speckit.model, speckit.tokens, speckit.generator
reference_filter = speckit.reference_filter


def mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The (B, t) left-padding mask: row b is False on its first pads[b] columns."""
    cols = torch.arange(t)  # (t,)
    return (cols[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t) bool


def batch(
    rig: speckit.Rig, cfg: ModelConfig, pads: list[int], t: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch: (B, t) ids drawn from ``seed`` (pads hold ids too) and its
    (B, t) mask (``mask``), B = len(pads), on the rig's device."""
    ids = rig.tokens(cfg, len(pads), t, seed)  # (B, t)
    return ids, mask(pads, t, rig.device)  # (B, t), (B, t) bool


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


configs = partial(speckit.configs, max_T=14)  # padding's contexts: T in [2, 14]


@st.composite
def padded_shapes(draw: st.DrawFn, T: int) -> tuple[int, list[int]]:
    """(t, pads): a padded width and each row's pads; pads[b] == t is an all-padding row."""
    B = draw(st.integers(1, 4))
    t = draw(st.integers(1, T))
    return t, draw(st.lists(st.integers(0, t), min_size=B, max_size=B))


# --- references: each row alone --------------------------------------------------------


def greedy_alone(model: GPT, row: torch.Tensor, new: int) -> list[int]:
    """The argmax continuation of one unpadded (n,) prompt, no cache: new token ids."""
    ids = row[None]  # (1, n)
    with torch.no_grad():
        for _ in range(new):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, nxt], dim=1)  # (1, n + i + 1)
    return ids[0, row.numel() :].tolist()


def traces_alone(
    model: GPT, seq: torch.Tensor, n: int, steps: int, layer: int
) -> list[torch.Tensor]:
    """(H, n + i) attn_row of step i for the (len,) sequence of prompt n and its continuation."""
    with torch.no_grad():
        return [
            model.forward_with_attn_trace(seq[None, : n + i], layer)[1]["attn_row"][0]
            for i in range(steps)
        ]


def with_eos(tokens: list[int], eos: int | None, new: int) -> list[int]:
    """A row's no-eos continuation cut at its first eos and held there."""
    if eos is None or eos not in tokens:
        return tokens
    first = tokens.index(eos)
    return tokens[: first + 1] + [eos] * (new - first - 1)


def sampling_alone(
    model: GPT,
    prompt: torch.Tensor,
    pads: list[int],
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator | Sequence[torch.Generator],
) -> torch.Tensor:
    """The spec's draw on the rows alone, no cache; returns (B, t + new) ids."""
    B, t = prompt.shape
    rows = [prompt[b, p:].tolist() for b, p in enumerate(pads)]
    out = torch.full((B, t + new), -1, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    out[:, :t] = prompt
    finished = [False] * B
    with torch.no_grad():
        for i in range(new):
            logits = torch.stack(
                [model(torch.tensor([r], device=prompt.device))[0, -1] for r in rows]
            )  # (B, V)
            probs = torch.softmax(reference_filter(logits, **knobs), dim=-1)  # (B, V)
            if isinstance(gen, torch.Generator):
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()  # all rows at once
            else:
                nxt = [
                    int(torch.multinomial(probs[b : b + 1], 1, generator=gen[b])) for b in range(B)
                ]
            for b in range(B):
                token = eos if finished[b] and eos is not None else nxt[b]
                finished[b] = finished[b] or token == eos
                rows[b].append(token)
                out[b, t + i] = token
            if eos is not None and all(finished):
                out[:, t + i + 1 :] = eos
                break
    return out
