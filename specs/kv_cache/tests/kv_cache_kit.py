"""The kv_cache stage's kit: the reference loops its acceptance tests share.

The config strategy, the model and token builders, the float64 filter and
the attention-call recorder come from the spec kit (``speckit.acceptance``),
which padding's tests use too, and are bound here under the names the tests
use. The tests import this module by name (``import kv_cache_kit as kit``).
"""

from __future__ import annotations

from typing import Any

import torch
from speckit import acceptance as speckit

from niels_gpt.model.gpt import GPT

# bound under the names the tests use
Tol, Randomise, NEG = speckit.Tol, speckit.Randomise, speckit.NEG
Rig, rig, knobs, flatten = speckit.Rig, speckit.rig, speckit.knobs, speckit.flatten
Case, cases, attention_calls = speckit.Case, speckit.cases, speckit.attention_calls
state, assert_same_state = speckit.state, speckit.assert_same_state
failing_call, assert_refused_unrun = speckit.failing_call, speckit.assert_refused_unrun
watch_draw_dtypes = speckit.watch_draw_dtypes
configs, model, tokens = speckit.configs, speckit.model, speckit.tokens
generator = speckit.generator
reference_keep, reference_filter = speckit.reference_keep, speckit.reference_filter


# --- references -------------------------------------------------------------


def greedy_loop(model: GPT, prompt: torch.Tensor, new: int) -> torch.Tensor:
    ids = prompt  # (B, t)
    with torch.no_grad():
        for _ in range(new):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, nxt], dim=1)  # (B, t + i + 1)
    return ids


def with_eos(ref: torch.Tensor, t: int, eos: int) -> tuple[torch.Tensor, int]:
    """Rows of a no-eos run cut at their first generated eos; and the steps run."""
    out = ref.clone()  # (B, t + new)
    new = ref.shape[1] - t
    finished: list[int] = []
    for r in range(ref.shape[0]):
        hits = (ref[r, t:] == eos).nonzero().flatten().tolist()
        if hits:
            out[r, t + hits[0] + 1 :] = eos
            finished.append(hits[0])
    steps = new if len(finished) < ref.shape[0] else min(new, max(finished) + 1)
    return out, steps


def sampling_loop(
    model: GPT,
    prompt: torch.Tensor,
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator,
) -> torch.Tensor:
    B, t = prompt.shape
    out = torch.full((B, t + new), -1, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    out[:, :t] = prompt
    finished = torch.zeros(B, dtype=torch.bool, device=prompt.device)  # (B,)
    with torch.no_grad():
        for i in range(new):
            logits = model(out[:, : t + i])[:, -1]  # (B, V)
            probs = torch.softmax(reference_filter(logits, **knobs), dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (B,), every row
            if eos is not None:
                nxt = torch.where(finished, torch.full_like(nxt, eos), nxt)  # (B,)
                finished |= nxt == eos
            out[:, t + i] = nxt
            if eos is not None and bool(finished.all()):
                out[:, t + i + 1 :] = eos
                break
    return out
