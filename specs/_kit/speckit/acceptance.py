"""The acceptance tests' and runtime drivers' shared helpers (``speckit.acceptance``).

What more than one stage's tests need, written once: the config strategy,
the model and token builders, the float64 sampling filter from its
definitions, the recorder of attention calls, and the runtime drivers'
recording that leaves RoPE's inside out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import torch
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import KVCache
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]
Calls = list[list[tuple[int, Any, tuple[Any, ...]]]]
Record = Callable[[], AbstractContextManager[None]]  # a runtime driver's recorder
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
    return cast(GPT, use_fast_attention(gpt)) if fast else gpt  # the same model, its kernel set


@st.composite
def configs(draw: st.DrawFn, max_V: int = 40, max_T: int = 16) -> ModelConfig:
    """A small GPT config with every knob drawn (dropout too: eval mode must make it
    irrelevant); ``max_V`` and ``max_T`` bound the vocabulary and the context."""
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, max_V)),
        T=draw(st.integers(2, max_T)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


def tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


def reference_keep(
    row: list[float], temperature: float, top_k: int | None, top_p: float | None
) -> tuple[list[bool], list[float]]:
    """Which entries of one row of logits survive kv_cache's filter, from its definitions,
    in float64 Python; and the top-p masses the decision used (before each entry, in
    the order it was taken). Temperature 0 keeps the first maximum alone."""
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
    """``filter_logits`` from the definitions, on (B, V) logits, in their dtype: the
    kept entries divided by the temperature (as they are at 0), the rest ``-inf``."""
    rows = logits.detach().to("cpu", torch.float64).tolist()
    kept = [reference_keep(r, temperature, top_k, top_p)[0] for r in rows]
    keep = torch.tensor(kept, dtype=torch.bool, device=logits.device)  # (B, V)
    values = logits if temperature == 0 else logits / temperature  # (B, V)
    return values.masked_fill(~keep, NEG)  # (B, V)


def watch_attention_calls(model: GPT) -> tuple[Calls, list[Any]]:
    """Per layer, for every attention call: the input length, the cache, its state.

    The state of a ``KVCache`` is its storages, shapes, dtype and length (empty
    for no cache). Returns the record, filled as the model runs, and the hook
    handles to remove.
    """
    seen: Calls = [[] for _ in model.blocks]
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
            if isinstance(cache, KVCache):
                state = (
                    cache.keys.data_ptr(),
                    cache.values.data_ptr(),
                    tuple(cache.keys.shape),
                    tuple(cache.values.shape),
                    cache.keys.dtype,
                    len(cache),
                )
            seen[layer].append((x.shape[1], cache, state))

        attn = cast(torch.nn.Module, block.attn)
        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


@contextmanager
def recording_around_rope(record: Record) -> Iterator[None]:
    """Record the enclosed code with ``record`` (a runtime driver's), except the
    inside of each ``rope.apply_rope`` call.

    While it is open, ``niels_gpt.model.rope.apply_rope`` is wrapped: the open
    block is closed for the length of the real call and a new one is opened
    after it, so that the ops RoPE dispatches itself (``aten::cat`` inside
    ``torch.stack`` wherever its complex path does not apply) are the rope
    stage's, judged by its rules. A stage reaches RoPE through that module
    attribute (its ``rope-as-module`` rule), so every call passes the wrapper.
    """
    real = rope.apply_rope
    block = [record()]

    def unrecorded(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        block[0].__exit__(None, None, None)
        try:
            return real(q, k, sin, cos)
        finally:
            block[0] = record()
            block[0].__enter__()

    block[0].__enter__()
    rope.apply_rope = unrecorded
    try:
        yield
    finally:
        rope.apply_rope = real
        block[0].__exit__(None, None, None)
