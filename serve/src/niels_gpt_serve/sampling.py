"""Per-request sampling: each row of a batch with its own knobs and generator.

Shape notation::

    V: vocabulary

A request's next token is chosen from its own ``(V,)`` logits the way the
stages choose for one row (``kv_cache.generate`` with batch 1, and
``padding.generate`` with a generator list): a temperature below
``GREEDY_BELOW`` (1e-5, 0 included) is the argmax (the first maximum) and
draws nothing; otherwise ``torch.multinomial`` draws one sample from the
softmax of ``kv_cache.filter_logits`` with the request's own
``torch.Generator``. So a request's draws do not depend on which other
requests share its batch, and a seed reproduces its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from niels_gpt.model.kv_cache import filter_logits
from niels_gpt_serve.schemas import GREEDY_BELOW

__all__ = ["Knobs", "choose", "new_generator"]


@dataclass(frozen=True)
class Knobs:
    """The sampling knobs of one request (checked by the API before they get here)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


def new_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (one per request)."""
    return torch.Generator().manual_seed(seed)


def choose(logits: torch.Tensor, knobs: Knobs, generator: torch.Generator) -> int:
    """The next token id from one row's ``(V,)`` logits.

    Raises:
        niels_gpt.checks.InputError: a knob out of the stage's range.
    """
    wide = torch.promote_types(logits.dtype, torch.float32)  # as kv_cache: float64 stays
    row = logits.to(device="cpu", dtype=wide)[None]  # (1, V): filtered and drawn on the CPU
    if knobs.temperature < GREEDY_BELOW:
        return int(row.argmax(dim=-1))  # no draw: the generator is left untouched
    filtered = filter_logits(
        row, temperature=knobs.temperature, top_k=knobs.top_k, top_p=knobs.top_p
    )  # (1, V), dropped entries -inf
    probs = torch.softmax(filtered, dim=-1)  # (1, V)
    return int(torch.multinomial(probs, num_samples=1, generator=generator)[0, 0])
