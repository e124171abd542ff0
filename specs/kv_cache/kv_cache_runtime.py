"""Runtime-rule drivers of the kv_cache stage (maintainer-owned; run by ``contracts pr``).

Each driver is called as ``driver(device, record)`` in the verdict's sandbox;
the ATen ops dispatched inside its ``with record():`` blocks are judged
against the rule that names it in ``specs/kv_cache.toml``. Set-up (building
the models, the prefill of ``decode_steps``) stays outside the blocks.

RoPE's own internals are left out of the blocks: the profiler reports every
nested op, and ``rope.apply_rope`` builds its tables with ``torch.stack``
wherever it cannot take its complex path (MPS, half precision, odd strides),
which runs ``aten::cat`` inside ``aten::stack``. That is the rope stage's
code, judged by its own rules; what these rules judge is the kv_cache code
around it. So the drivers record through the spec kit's
``recording_around_rope`` (``speckit.acceptance``), which
wraps ``niels_gpt.model.rope.apply_rope`` while a block is open: the block is
closed for the length of the real call and a new one opened after it. The
stage must reach RoPE through that module attribute anyway (its
``rope-as-module`` rule).
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
from niels_gpt.model.kv_cache import drop_kv_cache, generate, use_kv_cache

Record = Callable[[], AbstractContextManager[None]]


# Small, with non-default knobs; T leaves room for the steps below.
CFG = ModelConfig(V=61, T=24, C=32, L=2, H=4, d_ff=40, dropout=0.1, rope_theta=500.0)
BATCH, PROMPT, STEPS = 2, 5, 6
EVERY_KNOB: dict[str, Any] = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "eos_id": 3,
                              "trace_layer": 1}  # fmt: skip


def _models(device: torch.device) -> list[GPT]:
    """The same weights twice: explicit attention, and switched to the fast path."""
    torch.manual_seed(0)
    explicit = GPT(CFG).to(device).eval()
    fast = GPT(CFG).to(device).eval()
    fast.load_state_dict(explicit.state_dict())
    use_fast_attention(fast)
    return [explicit, fast]


def _prompt(device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, CFG.V, (BATCH, PROMPT), generator=gen).to(device)  # (B, t)


def decode_steps(device: torch.device, record: Record) -> None:
    """Prefill unrecorded, then record one-token decode steps of both models.

    Every step feeds the argmax of the previous logits; odd steps go through
    ``forward_with_attn_trace`` so the trace path is judged too.
    """
    models = _models(device)
    prompt = _prompt(device)
    with torch.no_grad():
        tokens = []
        for model in models:
            use_kv_cache(model, BATCH)
            logits = model(prompt)  # (B, t, V): the prefill, not recorded
            tokens.append(logits[:, -1].argmax(-1, keepdim=True))  # (B, 1)
        with speckit.recording_around_rope(record):
            for step in range(STEPS):
                for i, model in enumerate(models):
                    if step % 2:
                        logits, _ = model.forward_with_attn_trace(tokens[i], step % CFG.L)
                    else:
                        logits = model(tokens[i])  # (B, 1, V)
                    tokens[i] = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
    for model in models:
        drop_kv_cache(model)


def generate_run(device: torch.device, record: Record) -> None:
    """Record whole ``generate`` calls: sampling with every knob, eos and a trace; greedy."""
    models = _models(device)
    prompt = _prompt(device)
    gen = torch.Generator(device=device).manual_seed(2)
    steps = CFG.T - PROMPT
    with speckit.recording_around_rope(record):
        for model in models:
            generate(model, prompt, steps, generator=gen, **EVERY_KNOB)
            generate(model, prompt, steps, temperature=0.0)
