"""A typed downstream script: the stages from their wheels under ``mypy --strict``.

``nox -s test-experiments`` installs the wheels into a fresh venv, runs this
file there and checks it with ``mypy --strict --python-executable <that venv>``,
so mypy reads the installed stages (their ``py.typed`` markers) and not this
repository's sources. No ``cast`` and no ``type: ignore``: ``assert_type``
fails the check if a stage loses its types (a missing ``py.typed`` makes every
import an error; ``forward``'s overloads decide what ``return_attn`` gives).
"""

from __future__ import annotations

import torch
from typing_extensions import assert_type  # a dependency of torch; typing has it from 3.11

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.device import resolve_device
from niels_gpt.model import block_v0, blocks
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import FastCausalSelfAttention, use_fast_attention
from niels_gpt.model.gpt import GPT, AttnTrace
from niels_gpt.model.rope import apply_rope, rope_cache

Pair = tuple[torch.Tensor, torch.Tensor]


def last_row_entropy(trace: AttnTrace) -> torch.Tensor:
    """Entropy of the traced layer's last-query attention row, ``(B, H)``."""
    row = trace["attn_row"]  # (B, H, t)
    return -(row * row.clamp_min(1e-12).log()).sum(dim=-1)  # (B, H)


def main() -> None:
    device = resolve_device("cpu")
    cfg = ModelConfig(V=64, T=16, C=32, L=2, H=4, d_ff=64, dropout=0.0)
    x = torch.randn(2, 8, cfg.C, device=device)  # (B, T, C)

    sin, cos = rope_cache(cfg.T, cfg.head_dim)  # (1, 1, T, D/2) each
    q = torch.randn(2, cfg.H, 8, cfg.head_dim)  # (B, H, T, D)
    assert_type(apply_rope(q, q, sin, cos), Pair)

    attn = CausalSelfAttention(cfg).eval()
    assert_type(attn.forward(x), torch.Tensor)
    assert_type(attn.forward(x, return_attn=False), torch.Tensor)
    y, probs = attn.forward(x, return_attn=True)  # (B, T, C), (B, H, T, T)
    assert_type(probs, torch.Tensor)
    flag = bool(probs.sum() > 0)
    assert_type(attn.forward(x, return_attn=flag), torch.Tensor | Pair)

    fast = FastCausalSelfAttention(cfg).eval()
    assert_type(fast.forward(x), torch.Tensor)
    assert_type(fast.forward(x, return_attn=True), Pair)
    assert_type(block_v0.Block(cfg).eval().forward(x, return_attn=True), Pair)
    assert_type(blocks.Block(cfg).eval().forward(x), torch.Tensor)

    model = GPT(cfg).eval()
    use_fast_attention(model)  # in place; it returns the same model as an nn.Module
    ids = torch.randint(0, cfg.V, (2, 8), device=device)  # (B, t)
    logits, trace = model.forward_with_attn_trace(ids, trace_layer=1)
    assert_type(logits, torch.Tensor)
    assert_type(trace["layer"], int)
    assert_type(trace["attn_full"], torch.Tensor | None)
    try:
        model.forward_with_attn_trace(ids, trace_layer=cfg.L)
    except InputError as err:
        print(f"refused as expected: {err}")
    print(f"y {tuple(y.shape)}, probs {tuple(probs.shape)}, logits {tuple(logits.shape)}")
    print(f"entropy of layer {trace['layer']}'s last row: {last_row_entropy(trace).tolist()}")


if __name__ == "__main__":
    main()
