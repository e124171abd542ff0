"""The padding stage's kit: the builders and references its acceptance tests share.

Why this folder and not one kit for every stage: a verdict copies into its
sandbox only ``specs/<stage>/`` of the stages it runs, and the amendment
check charges each path under ``specs/`` to the stage it names. Here the kit
is always written beside the tests that load it, and an edit of it is an
amendment of padding, judged like an edit of those tests. The tests load it
by path (pytest's importlib mode puts no test folder on ``sys.path``);
pytest does not collect it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache
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


def mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The (B, t) left-padding mask: row b is False on its first pads[b] columns."""
    cols = torch.arange(t)  # (t,)
    return (cols[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t) bool


def state(gpt: GPT) -> tuple[list[Any], list[bool], dict[str, torch.Tensor]]:
    """What a call must hand back unchanged: module classes and attributes, modes, weights."""
    return (
        [(type(m), sorted(vars(m))) for m in gpt.modules()],
        [m.training for m in gpt.modules()],
        {k: v.clone() for k, v in gpt.state_dict().items()},
    )


def assert_same_state(gpt: GPT, before: tuple[Any, ...]) -> None:
    """``gpt`` is as ``state`` found it."""
    classes, flags, weights = state(gpt)
    assert classes == before[0]
    assert flags == before[1]
    for k, v in weights.items():
        assert torch.equal(v, before[2][k]), k


def watch_attention_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every attribute write on an attention module (``__class__`` included).

    Switching a module in place or attaching a cache writes to it; "before any
    module changes" means none of that happens before an error, even where the
    module would be handed back afterwards.
    """
    writes: list[str] = []

    def spy(module: torch.nn.Module, name: str, value: Any) -> None:
        writes.append(f"{type(module).__name__}.{name}")
        torch.nn.Module.__setattr__(module, name, value)

    monkeypatch.setattr(CausalSelfAttention, "__setattr__", spy)
    return writes


def flatten(model: GPT, scale: float) -> GPT:
    """Scale every weight down: flatter distributions, more than one token in play."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


@st.composite
def configs(draw: st.DrawFn, max_V: int = 40) -> ModelConfig:
    """A small GPT config with every knob drawn (dropout is drawn too: eval mode must
    make it irrelevant); ``max_V`` bounds the vocabulary."""
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, max_V)),
        T=draw(st.integers(2, 14)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


@st.composite
def padded_shapes(draw: st.DrawFn, T: int) -> tuple[int, list[int]]:
    """(t, pads): a padded width and each row's pads; pads[b] == t is an all-padding row."""
    B = draw(st.integers(1, 4))
    t = draw(st.integers(1, T))
    return t, draw(st.lists(st.integers(0, t), min_size=B, max_size=B))


# --- references: each row alone --------------------------------------------------------


def greedy_alone(model: GPT, row: torch.Tensor, new: int) -> list[int]:
    """The argmax continuation of one unpadded (n,) prompt, no cache: new token ids."""
    ids = row[None]  # (1, n)
    with torch.no_grad():
        for _ in range(new):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, nxt], dim=1)  # (1, n + i + 1)
    return ids[0, row.numel() :].tolist()


def traces_alone(
    model: GPT, seq: torch.Tensor, n: int, steps: int, layer: int
) -> list[torch.Tensor]:
    """(H, n + i) attn_row of step i for the (len,) sequence of prompt n and its continuation."""
    with torch.no_grad():
        return [
            model.forward_with_attn_trace(seq[None, : n + i], layer)[1]["attn_row"][0]
            for i in range(steps)
        ]


def with_eos(tokens: list[int], eos: int | None, new: int) -> list[int]:
    """A row's no-eos continuation cut at its first eos and held there."""
    if eos is None or eos not in tokens:
        return tokens
    first = tokens.index(eos)
    return tokens[: first + 1] + [eos] * (new - first - 1)


def reference_filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """kv_cache's filter on (B, V) logits from its definitions, row by row in float64 Python."""
    keep_rows = []
    for row in logits.detach().to("cpu", torch.float64).tolist():
        V = len(row)
        scaled = [x / temperature for x in row]
        keep = [True] * V
        if top_k is not None and top_k < V:
            kth = sorted(scaled, reverse=True)[top_k - 1]
            keep = [x >= kth for x in scaled]
        if top_p is not None and top_p < 1.0:
            top = max(x for x, k in zip(scaled, keep, strict=True) if k)
            w = [math.exp(x - top) if k else 0.0 for x, k in zip(scaled, keep, strict=True)]
            before = 0.0
            for j in sorted(range(V), key=lambda j: (-w[j], j)):
                if before >= top_p:
                    keep[j] = False
                before += w[j] / sum(w)
        keep_rows.append(keep)
    keep_t = torch.tensor(keep_rows, dtype=torch.bool, device=logits.device)  # (B, V)
    return (logits / temperature).masked_fill(~keep_t, NEG)  # (B, V)


def sampling_alone(
    model: GPT,
    prompt: torch.Tensor,
    pads: list[int],
    new: int,
    knobs: dict[str, Any],
    eos: int | None,
    gen: torch.Generator | Sequence[torch.Generator],
) -> torch.Tensor:
    """The spec's draw on the rows alone, no cache; returns (B, t + new) ids."""
    B, t = prompt.shape
    rows = [prompt[b, p:].tolist() for b, p in enumerate(pads)]
    out = torch.full((B, t + new), -1, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    out[:, :t] = prompt
    finished = [False] * B
    with torch.no_grad():
        for i in range(new):
            logits = torch.stack(
                [model(torch.tensor([r], device=prompt.device))[0, -1] for r in rows]
            )  # (B, V)
            probs = torch.softmax(reference_filter(logits, **knobs), dim=-1)  # (B, V)
            if isinstance(gen, torch.Generator):
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()  # all rows at once
            else:
                nxt = [
                    int(torch.multinomial(probs[b : b + 1], 1, generator=gen[b])) for b in range(B)
                ]
            for b in range(B):
                token = eos if finished[b] and eos is not None else nxt[b]
                finished[b] = finished[b] or token == eos
                rows[b].append(token)
                out[b, t + i] = token
            if eos is not None and all(finished):
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

        handles.append(block.attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles
