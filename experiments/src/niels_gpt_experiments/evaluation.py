"""Validation loss and samples, the two things printed at every evaluation."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.batches import eval_offsets, read_rows
from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.parallel import Mode
from niels_gpt_experiments.progress import Display
from niels_gpt_experiments.runtime import Runtime, all_reduce_sum
from niels_gpt_experiments.sampling import generate, printable

__all__ = ["evaluate", "next_token_loss", "samples", "show_samples", "validation_loss"]


def next_token_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: contextlib.AbstractContextManager[object],
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``model(x)`` against ``y``, both ``(b, T)`` int64.

    The forward runs under ``autocast``; the loss is taken in float32.
    """
    with autocast:
        logits = model(x)  # (b, T, V)
    V = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1), reduction=reduction)


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    tokens: np.ndarray[Any, np.dtype[np.uint8]],
    rows: int,
    micro: int,
    T: int,
    runtime: Runtime,
    autocast: contextlib.AbstractContextManager[object],
) -> float:
    """Mean next-token loss over ``rows`` fixed validation windows.

    Each rank scores an equal, contiguous share of the windows in chunks of
    ``micro`` rows (so every rank makes the same forward calls, which FSDP
    needs); the sums are reduced over ranks.
    """
    offsets = eval_offsets(rows, len(tokens), T)  # (rows,)
    share = rows // runtime.world
    mine = offsets[runtime.rank * share : (runtime.rank + 1) * share]  # (share,)
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=runtime.device)  # (loss sum, tokens)
    try:
        for chunk in torch.split(mine, micro):
            x, y = read_rows(tokens, chunk, T, runtime.device)  # (b, T) each
            loss = next_token_loss(model, x, y, autocast, reduction="sum")  # ()
            total += torch.stack((loss.double(), torch.tensor(y.numel(), device=y.device)))
    finally:
        model.train(was_training)
    total = all_reduce_sum(runtime, total)
    return float(total[0] / total[1])


def samples(
    model: GPT,
    prompt: str,
    new_tokens: int,
    *,
    temperature: float,
    top_k: int | None,
    seed: int,
    device: torch.device,
    allow_cache: bool,
) -> dict[str, str]:
    """A greedy and a seeded sampled continuation of ``prompt``, made printable.

    ``new_tokens`` is cut so prompt plus continuation fit in the model's ``T``.
    """
    prompt_ids = torch.tensor([list(prompt.encode())], dtype=torch.int64, device=device)  # (1, t)
    room = model.cfg.T - prompt_ids.shape[1]
    n = max(0, min(new_tokens, room))
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", temperature)):
        ids = generate(
            model,
            prompt_ids,
            n,
            temperature=temp,
            top_k=top_k,
            generator=gen,
            allow_cache=allow_cache,
        )  # (1, t + n)
        out[name] = printable(bytes(ids[0].tolist()))
    return out


def evaluate(
    cfg: TrainConfig,
    model: GPT,
    tokens: np.ndarray[Any, np.dtype[np.uint8]],
    micro: int,
    runtime: Runtime,
    autocast: contextlib.AbstractContextManager[object],
) -> float:
    """The run's validation loss over its fixed windows (every rank calls it)."""
    rows = cfg.eval_batches * cfg.batch_size
    return validation_loss(model, tokens, rows, micro, cfg.T, runtime, autocast)


def show_samples(
    cfg: TrainConfig,
    model: GPT,
    runtime: Runtime,
    autocast: contextlib.AbstractContextManager[object],
    mode: Mode,
    step: int,
    display: Display,
) -> None:
    """Print a greedy and a sampled continuation of ``cfg.prompt`` (rank 0 prints).

    Under FSDP every rank takes part in every forward, so all ranks generate;
    otherwise rank 0 alone does.
    """
    if cfg.sample_tokens == 0 or not (runtime.is_main or mode == "fsdp"):
        return
    with autocast:
        texts = samples(
            model,
            cfg.prompt,
            cfg.sample_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            seed=cfg.seed + step,
            device=runtime.device,
            allow_cache=mode != "fsdp",
        )
    for name, text in texts.items():
        display.say(f"--- {name} (step {step}) ---\n{text}")
