"""Text generation through one seam.

``generate`` is the only place the experiment samples from a model. It uses
the ``kv_cache`` stage's ``niels_gpt.model.kv_cache.generate`` (a declared
dependency), and for models whose parameters are sharded (FSDP2), which the
cache stage does not know about, a plain loop that recomputes the whole prefix
for every new token.

The plain loop draws from the stage's own ``filter_logits``, so both paths
share one contract: temperature 0 is greedy; ``top_k`` keeps the ``k`` largest
logits; ``top_p`` keeps the smallest set of tokens whose probabilities reach
``p`` (the most likely token always stays).
"""

from __future__ import annotations

from typing import Protocol, cast

import torch

from niels_gpt.model import kv_cache
from niels_gpt.model.gpt import GPT

__all__ = ["Generate", "generate", "plain_generate", "printable"]


class Generate(Protocol):
    def __call__(
        self,
        model: GPT,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor: ...


@torch.no_grad()
def plain_generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample ``max_new_tokens`` after ``prompt_ids`` without a cache.

    Args:
        model: maps ``(B, t)`` int64 ids to ``(B, t, V)`` logits; its ``cfg.T``
            bounds the context, which slides once the sequence is longer.
        prompt_ids: ``(B, t)`` int64.

    Returns:
        ``(B, t + max_new_tokens)`` int64: the prompt and the new tokens.

    Raises:
        ValueError: a negative temperature or ``max_new_tokens``; a ``top_k`` or
            ``top_p`` that ``kv_cache.filter_logits`` refuses (its ``InputError``
            is a ``ValueError``), at the first sampled step.
    """
    if temperature < 0 or max_new_tokens < 0:
        raise ValueError(
            f"temperature and max_new_tokens must be >= 0, got {temperature}, {max_new_tokens}"
        )
    limit = model.cfg.T
    ids = prompt_ids  # (B, t)
    for _ in range(max_new_tokens):
        logits = model(ids[:, -limit:])[:, -1, :].float()  # (B, V)
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            kept = kv_cache.filter_logits(
                logits, temperature=temperature, top_k=top_k, top_p=top_p
            )  # (B, V)
            probs = torch.softmax(kept, dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        ids = torch.cat((ids, nxt), dim=1)  # (B, t + 1)
    return ids


def generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    allow_cache: bool = True,
) -> torch.Tensor:
    """Sample through the ``kv_cache`` stage, or plainly with ``allow_cache=False``.

    Same arguments and result as ``plain_generate``. ``allow_cache=False`` is for
    models whose parameters are sharded (FSDP2), which the cache stage does not
    know about. The model is sampled in eval mode and handed back in its own.
    """
    # Without trace_layer the stage returns the ids alone; read at each call, so patchable.
    cached = cast(Generate, kv_cache.generate)
    chosen = cached if allow_cache else plain_generate
    was_training = model.training
    model.eval()
    try:
        return chosen(
            model,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
        )
    finally:
        model.train(was_training)


def printable(data: bytes) -> str:
    """Decode model output for a terminal: newlines and tabs stay, any other
    control character or undecodable byte becomes a visible escape (``\\x1b``),
    so sampled bytes can never drive the terminal."""
    text = data.decode("utf-8", errors="backslashreplace")
    return "".join(
        ch if ch in "\n\t" or ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )
