"""GPT v1 training steps (AdamW) for the explicit path, the fast path and the reference,
each in float32 and under bfloat16 autocast."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.progress import without_native_lines
from benchmarks.reference import NanoGPT
from benchmarks.timing import sync
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

MODELS = ("explicit", "fastpath", "reference")
_PROFILER_CHATTER = re.compile(r"^USDT:.*\bprofiler_(start|stop)\b")
# Training-step variants: (name, model kind, autocast dtype or None for float32).
AUTOCAST = torch.bfloat16
VARIANTS: tuple[tuple[str, str, torch.dtype | None], ...] = (
    *((kind, kind, None) for kind in MODELS),
    *((f"{kind} bf16", kind, AUTOCAST) for kind in MODELS),
)
# Dropout 0 (nanoGPT's pretraining default): with dropout > 0, SDPA on CPU leaves its
# flash kernel for the unfused math kernel, which would handicap both SDPA models.
CONFIGS: dict[str, tuple[ModelConfig, int]] = {
    "small": (ModelConfig(V=256, T=256, C=256, L=4, H=4, d_ff=768, dropout=0.0), 8),
    "default": (dataclasses.replace(ModelConfig(V=256), dropout=0.0), 1),
}


def build(kind: str, cfg: ModelConfig, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    if kind == "reference":
        return NanoGPT(cfg).to(device)
    model = GPT(cfg).to(device)
    return use_fast_attention(model) if kind == "fastpath" else model


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weight counted once


def flops_per_token(cfg: ModelConfig, params: int, t: int) -> float:
    """nanoGPT's estimate (PaLM appendix B): 6 N + 12 L C t per token, forward and backward."""
    return 6.0 * params + 12.0 * cfg.L * cfg.C * t


def make_step(
    model: nn.Module,
    cfg: ModelConfig,
    batch: int,
    t: int,
    device: torch.device,
    return_optimizer: bool = False,
    autocast: torch.dtype | None = None,
) -> Any:
    """One AdamW training step on a fixed random batch of ``batch`` x ``t`` tokens.

    With ``autocast`` the forward runs under ``torch.autocast(device, autocast)``
    (float32 weights and optimizer, as in mixed-precision training); the loss
    is taken in float32.
    """
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.V, (batch, t + 1), generator=gen).to(device)
    x, y = ids[:, :-1], ids[:, 1:]
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast or AUTOCAST, enabled=autocast is not None):
            logits = model(x)  # (B, t, V)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.V), y.reshape(-1))
        torch.autograd.backward(loss)
        opt.step()

    return (step, opt) if return_optimizer else step


def _held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state (each storage once)."""
    seen: dict[tuple[torch.device, int], int] = {}
    tensors: list[torch.Tensor] = []
    for p in model.parameters():
        tensors.append(p)
        if p.grad is not None:
            tensors.append(p.grad)
    for state in opt.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    for t in tensors:
        st = t.untyped_storage()
        seen[(t.device, st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def peak_memory(
    kind: str, config: str, device: torch.device, autocast: torch.dtype | None = None
) -> dict[str, object]:
    """Peak bytes of one steady-state training step (after a first, warm-up step).

    Peak = what is held when the step starts (parameters and AdamW moments)
    plus the highest allocation growth during the step. On CUDA the growth is the
    caching allocator's peak; elsewhere it is the running sum of the allocations
    and frees the profiler records (``profile_memory=True``), which sees every
    tensor the CPU allocator hands out.
    """
    cfg, batch = CONFIGS[config]
    model = build(kind, cfg, device)
    step, opt = make_step(
        model, cfg, batch, cfg.T, device, return_optimizer=True, autocast=autocast
    )
    step()
    opt.zero_grad(set_to_none=True)  # the step would free them first thing anyway
    sync(device)
    held = _held_bytes(model, opt)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        growth = torch.cuda.max_memory_allocated(device) - base
        method = "held + cuda max_memory_allocated growth"
    else:
        from torch.profiler import ProfilerActivity, profile

        # kineto prints "USDT: ... profiler_start" and "profiler_stop" on every use
        with (
            without_native_lines(_PROFILER_CHATTER),
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        ):
            step()
            sync(device)
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]"
        )
        live = growth = 0
        for _, nbytes in events:
            live += nbytes
            growth = max(growth, live)
        method = "held + profiler-recorded allocation growth"
    return {"peak_bytes": float(held + growth), "held_bytes": float(held), "method": method}


def autocast_matmul(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, *, linear: bool
) -> Callable[[], torch.Tensor]:
    """``a @ b`` (or ``linear(a, b)``, the projections' kernel) under bf16 autocast."""

    def run() -> torch.Tensor:
        with torch.autocast(device.type, dtype=AUTOCAST):
            return F.linear(a, b) if linear else a @ b

    return run
