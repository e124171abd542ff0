"""The kv_cache stage's kit: model and token builders, the float64 filter, the reference loops.

Its acceptance tests load it by path (``Path(__file__).with_name``): no test
folder is on ``sys.path``. It lives in this stage's folder because that is
what a verdict writes into its sandbox with the tests, and what the
amendment check judges as kv_cache's evidence: an edit of it is an amendment
of this stage, like an edit of the tests that use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


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


def watch_attention_calls(
    model: GPT,
) -> tuple[list[list[tuple[int, Any, tuple[Any, ...]]]], list[Any]]:
    """Per layer, for every attention call: the input length, the cache, its state."""
    seen: list[list[tuple[int, Any, tuple[Any, ...]]]] = [[] for _ in model.blocks]
    handles = []
    for layer, block in enumerate(model.blocks):

        def hook(
            module: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            layer: int = layer,
        ) -> None:
            x = args[0] if args else kwargs["x"]
            cache = getattr(module, "kv_cache", None)
            state: tuple[Any, ...] = ()
            if cache is not None:
                state = (
                    cache.keys.data_ptr(),
                    cache.values.data_ptr(),
                    tuple(cache.keys.shape),
                    tuple(cache.values.shape),
                    cache.keys.dtype,
                    len(cache),
                )
            seen[layer].append((x.shape[1], cache, state))

        handles.append(block.attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles
