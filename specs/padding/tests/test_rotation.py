"""Acceptance tests of the per-row RoPE positions (stage padding).

``apply_rope_rows`` must be ``rope.apply_rope`` row by row, each row at its own
position ids, through one ``rope.apply_rope`` call on the batch folded into the
position axis. The references are ``rope.apply_rope`` itself, called once per
row with that row's table rows, and a float64 complex-number rotation written
here from RoPE's definition (pairs ``(2i, 2i+1)``, angle ``p * theta**(-2i/D)``).

The positions the padded paths use are read from a spy on
``niels_gpt.model.rope.apply_rope``: RoPE scores depend only on position
differences, so logits cannot tell per-row positions from padded-column ones
(a whole row shifted by its pads gives the same logits up to rounding); the
table rows handed to rope can.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import padding_kit as kit
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.padding import apply_rope_rows, generate, padded_forward

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here

Call = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@contextmanager
def _spying() -> Iterator[list[Call]]:
    """Record every ``rope.apply_rope`` call (its four arguments) and run the real one."""
    real = rope.apply_rope
    calls: list[Call] = []

    def spy(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((q.detach().clone(), k.detach().clone(), sin.clone(), cos.clone()))
        return real(q, k, sin, cos)

    rope.apply_rope = spy
    try:
        yield calls
    finally:
        rope.apply_rope = real


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE from its definition in float64 complex numbers; x (B, H, n, D), positions (B, n)."""
    B, H, n, D = x.shape
    i = torch.arange(D // 2, dtype=torch.float64)  # (D/2,)
    inv_freq = theta ** (-2.0 * i / D)  # (D/2,)
    angle = positions.cpu().double()[:, None, :, None] * inv_freq  # (B, 1, n, D/2)
    pairs = x.detach().cpu().double().reshape(B, H, n, D // 2, 2)  # (B, H, n, D/2, 2)
    z = torch.complex(pairs[..., 0], pairs[..., 1]) * torch.polar(
        torch.ones_like(angle), angle
    )  # (B, H, n, D/2)
    return torch.stack([z.real, z.imag], dim=-1).reshape(B, H, n, D)  # (B, H, n, D)


def _left_padded(
    cfg: ModelConfig, lengths: list[int], t: int, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (pads included) and the left-padded mask of rows with these real lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.V, (len(lengths), t), generator=gen)  # (B, t)
    mask = torch.zeros(len(lengths), t, dtype=torch.bool)  # (B, t)
    for b, n in enumerate(lengths):
        mask[b, t - n :] = n > 0
    return ids.to(device), mask.to(device)


def _row_positions(mask: torch.Tensor) -> torch.Tensor:
    """Per-row positions, written out: real token j of a row is at j, pads at 0."""
    out = torch.zeros(mask.shape, dtype=torch.int64)  # (B, t)
    for b, row in enumerate(mask.cpu().tolist()):
        seen = 0
        for j, real in enumerate(row):
            if real:
                out[b, j] = seen
                seen += 1
    return out


# --- apply_rope_rows ---------------------------------------------------------------


@pytest.mark.invariant("padding.rotation_matches_rope")
@settings(max_examples=25)
@given(
    B=st.integers(1, 4),
    H=st.integers(1, 3),
    n=st.integers(1, 9),
    half=st.integers(1, 5),
    extra=st.integers(0, 12),
    theta=st.sampled_from([10000.0, 37.0, 1e6]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_rows_equal_rope_apply_rope_row_by_row(
    rig: kit.Rig,
    B: int,
    H: int,
    n: int,
    half: int,
    extra: int,
    theta: float,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    D, Tc = 2 * half, 1 + extra
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64).to(
        rig.device, dtype
    )  # (B, H, n, D)
    k = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64).to(
        rig.device, dtype
    )  # (B, H, n, D)
    positions = torch.randint(0, Tc, (B, n), generator=gen).to(rig.device)  # (B, n)
    sin, cos = rope.rope_cache(
        Tc, D, theta=theta, device=rig.device, dtype=dtype
    )  # (1, 1, Tc, D/2)
    rows = [
        rope.apply_rope(
            q[b : b + 1], k[b : b + 1], sin[:, :, positions[b]], cos[:, :, positions[b]]
        )
        for b in range(B)
    ]  # the reference, before the spy: B pairs of (1, H, n, D)
    with _spying() as calls:
        q_rot, k_rot = apply_rope_rows(q, k, sin, cos, positions)
    assert len(calls) == 1  # one rope call for the whole batch
    assert q_rot.shape == k_rot.shape == (B, H, n, D)
    assert q_rot.dtype == k_rot.dtype == dtype and q_rot.device == q.device
    for b, (q_ref, k_ref) in enumerate(rows):
        rig.close(q_rot[b : b + 1], q_ref, dtype)
        rig.close(k_rot[b : b + 1], k_ref, dtype)
    exact_q, exact_k = _complex_rope(q, positions, theta), _complex_rope(k, positions, theta)
    rig.close(q_rot.cpu().double(), exact_q, dtype)
    rig.close(k_rot.cpu().double(), exact_k, dtype)


@pytest.mark.invariant("padding.rotation_matches_rope")
def test_a_row_at_consecutive_positions_is_rope_with_sliced_tables(rig: kit.Rig) -> None:
    B, H, n, D, Tc = 3, 2, 5, 8, 16
    starts = [0, 4, 11]  # row b holds positions starts[b] .. starts[b] + n - 1
    for dtype in rig.float_dtypes:
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(B, H, n, D, generator=gen).to(rig.device, dtype)  # (B, H, n, D)
        k = torch.randn(B, H, n, D, generator=gen).to(rig.device, dtype)  # (B, H, n, D)
        sin, cos = rope.rope_cache(Tc, D, theta=500.0, device=rig.device, dtype=dtype)
        positions = torch.tensor([[s + i for i in range(n)] for s in starts]).to(
            rig.device
        )  # (B, n)
        q_rot, k_rot = apply_rope_rows(q, k, sin, cos, positions)
        for b, s in enumerate(starts):
            q_ref, k_ref = rope.apply_rope(q[b : b + 1], k[b : b + 1], sin[:, :, s:], cos[:, :, s:])
            rig.close(q_rot[b : b + 1], q_ref, dtype)
            rig.close(k_rot[b : b + 1], k_ref, dtype)
        assert not torch.allclose(q_rot[1], q_rot[2])  # the offsets do matter


@pytest.mark.invariant("padding.rotation_matches_rope")
@pytest.mark.invariant("padding.row_positions")
def test_the_one_call_gets_the_batch_folded_into_positions(rig: kit.Rig) -> None:
    B, H, n, D, Tc = 3, 2, 4, 6, 9
    dtype = rig.widest
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(B, H, n, D, generator=gen).to(rig.device, dtype)  # (B, H, n, D)
    k = torch.randn(B, H, n, D, generator=gen).to(rig.device, dtype)  # (B, H, n, D)
    positions = torch.randint(0, Tc, (B, n), generator=gen).to(rig.device)  # (B, n)
    sin, cos = rope.rope_cache(Tc, D, device=rig.device, dtype=dtype)  # (1, 1, Tc, D/2) each
    with _spying() as calls:
        apply_rope_rows(q, k, sin, cos, positions)
    assert len(calls) == 1
    q_in, k_in, sin_in, cos_in = calls[0]
    assert q_in.shape == k_in.shape == (1, H, B * n, D)
    assert sin_in.shape[:2] == (1, 1) and sin_in.shape[2] >= B * n
    for b in range(B):
        for i in range(n):
            r = b * n + i
            assert torch.equal(q_in[0, :, r], q[b, :, i]) and torch.equal(k_in[0, :, r], k[b, :, i])
            p = int(positions[b, i])
            assert torch.equal(sin_in[0, 0, r], sin[0, 0, p])
            assert torch.equal(cos_in[0, 0, r], cos[0, 0, p])


def _rotation_bad_calls(device: torch.device) -> dict[str, tuple[Any, ...]]:
    """name -> the five arguments of a call apply_rope_rows must refuse."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 3, 4, generator=gen).to(device)  # (B, H, n, D)
    sin, cos = rope.rope_cache(5, 4, device=device, dtype=dtype)  # (1, 1, 5, 2)
    pos = torch.zeros(2, 3, dtype=torch.int64, device=device)  # (B, n)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    odd = torch.randn(2, 2, 3, 5, generator=gen).to(device)  # D odd
    return {
        "q-not-tensor": (q.tolist(), q, sin, cos, pos),
        "q-3-d": (q[0], q[0], sin, cos, pos[:1]),
        "k-other-shape": (q, q[:, :, :2], sin, cos, pos),
        "k-other-dtype": (q, q.double(), sin, cos, pos),
        "int-q": (q.long(), q.long(), sin, cos, pos),
        "odd-D": (odd, odd, sin, cos, pos),
        "empty-batch": (q[:0], q[:0], sin, cos, pos[:0]),
        "empty-n": (q[:, :, :0], q[:, :, :0], sin, cos, pos[:, :0]),
        "table-batched": (q, q, sin.expand(2, 1, 5, 2), cos.expand(2, 1, 5, 2), pos),
        "table-wrong-width": (q, q, sin[..., :1], cos[..., :1], pos),
        "table-other-dtype": (q, q, sin.double(), cos.double(), pos),
        "table-other-device": (q, q, sin.to(other), cos.to(other), pos),
        "sin-cos-shapes-differ": (q, q, sin, cos[:, :, :4], pos),
        "positions-int32": (q, q, sin, cos, pos.int()),
        "positions-float": (q, q, sin, cos, pos.float()),
        "positions-wrong-shape": (q, q, sin, cos, pos[:, :2]),
        "positions-1-d": (q, q, sin, cos, pos[0]),
        "positions-other-device": (q, q, sin, cos, pos.to(other)),
        "position-equal-Tc": (q, q, sin, cos, pos + 5),
        "position-negative": (q, q, sin, cos, pos - 1),
    }


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.parametrize("case", sorted(_rotation_bad_calls(torch.device("cpu"))))
def test_apply_rope_rows_rejects_bad_input_before_calling_rope(
    device: torch.device, case: str
) -> None:
    args = _rotation_bad_calls(device)[case]
    with _spying() as calls, pytest.raises(InputError):
        apply_rope_rows(*args)
    assert calls == []


# --- positions used by the padded paths ----------------------------------------------


@pytest.mark.invariant("padding.row_positions")
@pytest.mark.parametrize("fast", [False, True])
def test_padded_forward_rotates_each_row_from_zero(rig: kit.Rig, fast: bool) -> None:
    cfg = ModelConfig(V=23, T=12, C=16, L=3, H=2, d_ff=12, dropout=0.0, rope_theta=70.0)
    lengths, t = [9, 4, 0, 1, 6], 9  # B = 5: unpadded, padded, all padding, one token
    expected = _row_positions(_left_padded(cfg, lengths, t, 0, torch.device("cpu"))[1])
    flat = expected.flatten().to(rig.device)  # (B*t,), row b*t + j at expected[b, j]
    for dtype in rig.float_dtypes:
        model = rig.model(cfg, dtype, 1, fast)
        ids, mask = _left_padded(cfg, lengths, t, 2, rig.device)
        for trace_layer in (None, 1):
            with torch.no_grad(), _spying() as calls:
                padded_forward(model, ids, mask, trace_layer=trace_layer)
            assert len(calls) == cfg.L  # one call a layer, whole batch at once
            for (q, _, sin, cos), block in zip(calls, model.blocks, strict=True):
                assert q.shape == (1, cfg.H, len(lengths) * t, cfg.C // cfg.H)
                table_sin = block.attn.rope_sin[0, 0].to(sin.dtype)  # (T, D/2)
                table_cos = block.attn.rope_cos[0, 0].to(cos.dtype)  # (T, D/2)
                rows = len(lengths) * t
                assert torch.equal(sin[0, 0, :rows], table_sin[flat])
                assert torch.equal(cos[0, 0, :rows], table_cos[flat])


@pytest.mark.invariant("padding.row_positions")
def test_generation_rotates_new_tokens_at_column_minus_pads(rig: kit.Rig) -> None:
    cfg = ModelConfig(V=19, T=14, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=90.0)
    lengths, t, new = [3, 6, 1], 6, 5
    pads = [t - n for n in lengths]
    model = rig.model(cfg, rig.widest, 4)
    ids, mask = _left_padded(cfg, lengths, t, 5, rig.device)
    table_sin = model.blocks[0].attn.rope_sin[0, 0]  # (T, D/2)
    table_cos = model.blocks[0].attn.rope_cos[0, 0]  # (T, D/2)
    with _spying() as calls:
        generate(model, ids, mask, new, temperature=0.0)
    assert len(calls) == cfg.L * new  # the prefill, then one step a token
    steps = [calls[i : i + cfg.L] for i in range(0, len(calls), cfg.L)]
    prefill = _row_positions(mask).flatten().to(rig.device)  # (B*t,)
    for step, layer_calls in enumerate(steps):
        if step == 0:
            want = prefill
        else:
            col = t + step - 1  # the column fed at this step
            want = torch.tensor([col - p for p in pads], device=rig.device)  # (B,)
        for q, _, sin, cos in layer_calls:
            assert q.shape[2] == want.numel()
            assert torch.equal(sin[0, 0, : want.numel()], table_sin[want])
            assert torch.equal(cos[0, 0, : want.numel()], table_cos[want])


@pytest.mark.invariant("padding.row_positions")
def test_positions_do_not_depend_on_the_pad_amount(rig: kit.Rig) -> None:
    # The same real tokens behind 0, 3 and 7 pads are rotated at the same table rows.
    cfg = ModelConfig(V=17, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    model = rig.model(cfg, torch.float32, 2)
    real = torch.tensor([[5, 1, 9, 2]], device=rig.device)  # (1, 4)
    seen = []
    for pads in (0, 3, 7):
        ids = torch.cat([torch.full((1, pads), 4, device=rig.device), real], dim=1)  # (1, 4 + pads)
        mask = torch.arange(4 + pads, device=rig.device)[None] >= pads  # (1, 4 + pads)
        with torch.no_grad(), _spying() as calls:
            padded_forward(model, ids, mask if pads else None)
        (_, _, sin, _), *_ = calls
        seen.append(sin[0, 0, pads : pads + 4])  # the real tokens' table rows
    assert torch.equal(seen[1], seen[0]) and torch.equal(seen[2], seen[0])
