"""Runtime-rule drivers of the padding stage (maintainer-owned; run by ``contracts pr``).

Each driver is called as ``driver(device, record)`` in the verdict's sandbox;
the ATen ops dispatched inside its ``with record():`` blocks are judged
against the rules that name it in ``specs/padding.toml``. Set-up (building the
models, the masks, the generators) stays outside the blocks.

Every batch here is padded (one row unpadded, the others left-padded, one of
the forward batches all padding), so a fast-path model must leave SDPA for the
padded core; an unpadded batch is the model's own forward, under its own
stage's rules, and is not recorded.

RoPE's own internals are left out of the blocks, as in the kv_cache drivers:
the profiler reports nested ops, and ``rope.apply_rope`` builds its tables with
``torch.stack`` (``aten::cat`` inside) wherever it cannot take its complex
path. That is the rope stage's code. The drivers record through the spec
kit's ``recording_around_rope`` (``speckit.acceptance``),
which wraps ``niels_gpt.model.rope.apply_rope`` so that the open block is
closed for the length of the real call and a new one opened after it; the
stage reaches RoPE through that module attribute (its ``rope-as-module``
rule).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from speckit import acceptance as speckit

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate, padded_forward

Record = Callable[[], AbstractContextManager[None]]


# Small, with non-default knobs; T leaves room for the generation below.
CFG = ModelConfig(V=61, T=24, C=32, L=2, H=4, d_ff=40, dropout=0.1, rope_theta=500.0)
PADS, PROMPT = [0, 3, 5], 7  # generation: every row keeps a real token
FORWARD_PADS = [0, 3, 5, PROMPT]  # the forward batches: the last row is all padding
EVERY_KNOB: dict[str, Any] = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "eos_id": 3,
                              "trace_layer": 1}  # fmt: skip


def _models(device: torch.device) -> list[GPT]:
    """The same weights twice: explicit attention, and switched to the fast path."""
    torch.manual_seed(0)
    explicit = GPT(CFG).to(device)
    fast = GPT(CFG).to(device)
    fast.load_state_dict(explicit.state_dict())
    use_fast_attention(fast)
    return [explicit, fast]


def _batch(device: torch.device, pads: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (pads included) and the left-padding mask for these pads."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CFG.V, (len(pads), PROMPT), generator=gen)  # (B, t)
    mask = torch.arange(PROMPT)[None, :] >= torch.tensor(pads)[:, None]  # (B, t) bool
    return ids.to(device), mask.to(device)


def padded_forward_backward(device: torch.device, record: Record) -> None:
    """Record padded forwards and backwards of both models in every mode that matters.

    Training mode (dropout on): a forward and a backward through the logits; a
    traced forward and a backward through logits and probabilities. Eval mode:
    a forward under ``torch.no_grad`` and a traced one under
    ``torch.inference_mode``.
    """
    ids, mask = _batch(device, FORWARD_PADS)
    for model in _models(device):
        model.train()
        with speckit.recording_around_rope(record):
            logits = padded_forward(model, ids, mask)
            assert isinstance(logits, torch.Tensor)
            torch.autograd.backward(logits.square().sum())
            logits, trace = padded_forward(model, ids, mask, trace_layer=1)
            full = trace["attn_full"]
            assert full is not None
            torch.autograd.backward(logits.square().sum() + full.square().sum())
        model.eval()
        with speckit.recording_around_rope(record):
            with torch.no_grad():
                padded_forward(model, ids, mask)
            with torch.inference_mode():
                padded_forward(model, ids, mask, trace_layer=0)


def padded_generate(device: torch.device, record: Record) -> None:
    """Record whole padded ``generate`` calls of both models.

    Sampling with every knob, eos and a trace; greedy; per-row generators.
    """
    ids, mask = _batch(device, PADS)
    steps = CFG.T - PROMPT
    for model in _models(device):
        model.eval()
        gen = torch.Generator(device=device).manual_seed(2)
        gens = [torch.Generator(device=device).manual_seed(3 + b) for b in range(len(PADS))]
        with speckit.recording_around_rope(record):
            generate(model, ids, mask, steps, generator=gen, **EVERY_KNOB)
            generate(model, ids, mask, steps, temperature=0.0)
            generate(model, ids, mask, steps, temperature=1.1, top_p=0.8, generator=gens)
