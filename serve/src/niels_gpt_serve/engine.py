"""The engine: next-token logits for a batch of sequences of different lengths.

Shape notation::

    B: sequences in the batch, t: the longest one's length, t_b: sequence b's,
    V: vocabulary, L: layers, H: heads

An engine is what the batcher (``batcher.py``) asks, once a decode step, for
the next-token logits of every running sequence. It is built from the stages'
public functions only: ``PaddedEngine`` left-pads the sequences into one
``(B, t)`` batch with a ``(B, t)`` mask and runs ``padding.padded_forward``,
whose rows are the logits of each sequence alone (its positions start at its
own first token). It keeps no state between steps, so a sequence can join or
leave the batch between any two steps (continuous batching), at the cost of
recomputing every sequence's prefix at every step.

Sequences are keyed (``Sequence.key``) so that an engine that does keep state
(a KV cache a sequence) can prefill a key it has not seen and ``release`` one
that left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_forward

__all__ = ["Engine", "PaddedEngine", "Tokens", "attention_maps", "prompt_logprobs"]


class Tokens(Protocol):
    """A running sequence as the engine sees it: a key and its ids so far."""

    @property
    def key(self) -> int: ...

    @property
    def tokens(self) -> Sequence[int]: ...


class Engine(Protocol):
    """Next-token logits for a batch; see the module docstring."""

    name: str

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        """``(B, V)`` float32 logits of the token after each sequence, in batch order."""
        ...

    def release(self, key: int) -> None:
        """Forget sequence ``key`` (it finished or was cancelled)."""
        ...

    def close(self) -> None:
        """Give the model back as it was found (the server stops)."""
        ...


class PaddedEngine:
    """Stateless engine: one ``padding.padded_forward`` of the whole left-padded batch a step.

    Args:
        model: a ``GPT`` (v1, or the experiment's v0) in eval mode.
    """

    name = "padded (padding.padded_forward, no cache)"

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.device = model.tok_emb.weight.device

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        """Left-pad ``batch`` into ``(B, t)`` and return each row's last logits ``(B, V)``.

        Raises:
            ValueError: an empty batch or an empty sequence.
        """
        if not batch or any(len(s.tokens) == 0 for s in batch):
            raise ValueError("next_logits needs at least one sequence, each non-empty")
        t = max(len(s.tokens) for s in batch)
        ids = torch.zeros(len(batch), t, dtype=torch.int64)  # (B, t), pads hold id 0
        mask = torch.zeros(len(batch), t, dtype=torch.bool)  # (B, t), True = real
        for b, seq in enumerate(batch):
            n = len(seq.tokens)
            ids[b, t - n :] = torch.tensor(seq.tokens, dtype=torch.int64)  # (t_b,)
            mask[b, t - n :] = True
        with torch.no_grad():
            logits = padded_forward(self.model, ids.to(self.device), mask.to(self.device))
        assert isinstance(logits, torch.Tensor)  # no trace_layer: logits only
        return logits[:, -1].float()  # (B, V): every row's last column is real

    def release(self, key: int) -> None:
        """Nothing is kept between steps."""

    def close(self) -> None:
        """Nothing to give back."""


def attention_maps(model: GPT, tokens: Sequence[int], layers: Sequence[int]) -> torch.Tensor:
    """The attention probabilities of one sequence at the given layers, every head.

    Each layer is one ``model.forward_with_attn_trace(ids, layer,
    return_full_attn=True)``: the backbone's own trace, post-softmax and
    pre-dropout, in float32.

    Returns:
        ``(len(layers), H, t, t)`` float32 on the CPU; entry ``[i, h, q, k]``
        is how much query position ``q`` attends to key ``k <= q`` in layer
        ``layers[i]``, head ``h``.

    Raises:
        niels_gpt.checks.InputError: a layer outside ``[0, L)`` or ids the model refuses.
    """
    device = model.tok_emb.weight.device
    ids = torch.tensor([list(tokens)], dtype=torch.int64, device=device)  # (1, t)
    maps = []
    with torch.no_grad():
        for layer in layers:
            _, trace = model.forward_with_attn_trace(ids, layer, return_full_attn=True)
            full = trace["attn_full"]
            assert full is not None  # return_full_attn=True
            maps.append(full[0].float().cpu())  # (H, t, t)
    return torch.stack(maps)  # (len(layers), H, t, t)


def prompt_logprobs(
    model: GPT, tokens: Sequence[int], k: int
) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """Each prompt token's log-probability given the tokens before it, and the ``k``
    likeliest tokens there (the raw softmax, as generated tokens' ``logprobs``).

    Returns:
        ``len(tokens) - 1`` pairs ``(logprob, ((id, logprob), ...))``, for tokens 1..t-1
        (the first token has no context, so nothing to score it by).
    """
    device = model.tok_emb.weight.device
    ids = torch.tensor([list(tokens)], dtype=torch.int64, device=device)  # (1, t)
    with torch.no_grad():
        logits = model(ids)[0, :-1]  # (t - 1, V): the logits after tokens 0..t-2
    logp = torch.log_softmax(logits.to("cpu", torch.float64), dim=-1)  # (t - 1, V)
    values, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (t - 1, k), (t - 1, k)
    chosen = logp.gather(-1, ids[:, 1:].cpu().T)[:, 0]  # (t - 1,)
    return [
        (float(lp), tuple(zip(i.tolist(), v.tolist(), strict=True)))
        for lp, i, v in zip(chosen, top_ids, values, strict=True)
    ]
