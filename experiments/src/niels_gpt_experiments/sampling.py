"""Text generation through one seam.

``generate`` is the only place the experiment samples from a model. It uses
the ``kv_cache`` stage's ``niels_gpt.model.kv_cache.generate`` when that stage
is installed, and otherwise a plain loop that recomputes the whole prefix for
every new token. Making the cache mandatory later is a one-line change in
``_cached_generate`` (a plain ``from niels_gpt.model.kv_cache import generate``).

The plain loop follows the stage's contract: temperature 0 is greedy; ``top_k``
keeps the ``k`` largest logits; ``top_p`` keeps the smallest set of tokens
whose probabilities reach ``p`` (the most likely token always stays).
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

import torch

from niels_gpt.model.gpt import GPT

__all__ = ["Generate", "filter_logits", "generate", "plain_generate", "printable"]

_STAGE_MODULE = "niels_gpt.model.kv_cache"


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


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set every logit outside the top-k / top-p set to ``-inf``.

    Args:
        logits: ``(B, V)`` float.

    Returns:
        ``(B, V)`` logits with the filtered entries at ``-inf``.
    """
    if top_k is not None:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (B, V)
    if top_p is not None:
        ordered, order = torch.sort(logits, dim=-1, descending=True)  # (B, V) each
        cum = torch.softmax(ordered, dim=-1).cumsum(dim=-1)  # (B, V)
        drop_sorted = cum - torch.softmax(ordered, dim=-1) >= top_p  # (B, V) mass before >= p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # (B, V)
    return logits


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
        ValueError: a negative temperature or ``max_new_tokens``.
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
            probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        ids = torch.cat((ids, nxt), dim=1)  # (B, t + 1)
    return ids


def _cached_generate() -> Generate | None:
    try:
        module = importlib.import_module(_STAGE_MODULE)
    except ImportError:
        return None
    return cast(Generate, module.generate)


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
    """Sample through the ``kv_cache`` stage when installed (and ``allow_cache``), else plainly.

    Same arguments and result as ``plain_generate``. ``allow_cache=False`` is for
    models whose parameters are sharded (FSDP2), which the cache stage does not
    know about.
    """
    chosen = (_cached_generate() if allow_cache else None) or plain_generate
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
