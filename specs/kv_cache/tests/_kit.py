"""The kv_cache stage's kit: model and token builders, and the float64 filter.

Its acceptance tests load it by path (``Path(__file__).with_name``): no test
folder is on ``sys.path``. It lives in this stage's folder because that is
what a verdict writes into its sandbox with the tests, and what the
amendment check judges as kv_cache's evidence: an edit of it is an amendment
of this stage, like an edit of the tests that use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]
NEG = float("-inf")


def model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int = 0,
    fast: bool = False,
) -> GPT:
    """A GPT with drawn weights, in ``dtype`` on ``device``, in eval mode; the fast path on."""
    gpt = GPT(cfg)
    randomise(gpt, seed)
    gpt.to(device=device, dtype=dtype).eval()
    return use_fast_attention(gpt) if fast else gpt  # type: ignore[return-value]


def tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


def reference_keep(
    row: list[float], temperature: float, top_k: int | None, top_p: float | None
) -> tuple[list[bool], list[float]]:
    """Which entries of one row survive, and the top-p masses the decision used."""
    V = len(row)
    if temperature == 0:
        first_max = max(range(V), key=lambda j: (row[j], -j))
        return [j == first_max for j in range(V)], []
    scaled = [x / temperature for x in row]
    keep = [True] * V
    if top_k is not None and top_k < V:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        keep = [x >= kth for x in scaled]
    masses: list[float] = []
    if top_p is not None and top_p < 1.0:
        top = max(x for x, k in zip(scaled, keep, strict=True) if k)
        weights = [math.exp(x - top) if k else 0.0 for x, k in zip(scaled, keep, strict=True)]
        total = sum(weights)
        probs = [w / total for w in weights]
        order = sorted(range(V), key=lambda j: (-probs[j], j))
        before = 0.0
        for j in order:
            masses.append(before)
            if before >= top_p:
                keep[j] = False
            before += probs[j]
    return keep, masses


def reference_filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """``filter_logits`` from the definitions, on (B, V) logits, in their dtype."""
    rows = logits.detach().to("cpu", torch.float64).tolist()
    kept = [reference_keep(r, temperature, top_k, top_p)[0] for r in rows]
    keep = torch.tensor(kept, dtype=torch.bool, device=logits.device)  # (B, V)
    values = logits if temperature == 0 else logits / temperature  # (B, V)
    return values.masked_fill(~keep, NEG)  # (B, V)
