"""``padded_cross_entropy`` against a float64 loss written from its definition.

Reference: for every position whose input is real, ``logsumexp(z) - z[target]``
in float64; their sum divided by ``max(N, 1)``. Targets at padded positions
hold values no loss may read (-100, V, huge); the gradient there must be 0.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_cross_entropy, padded_forward

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]


def _mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


def reference(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The token mean of the float64 cross-entropy over real inputs, 0 when none."""
    z = logits.detach().cpu().double()  # (B, t, V)
    real = mask.cpu()  # (B, t)
    picked = z.gather(-1, targets.cpu().clamp(0, z.shape[-1] - 1)[..., None])[..., 0]  # (B, t)
    per_token = torch.logsumexp(z, dim=-1) - picked  # (B, t)
    return (per_token * real).sum() / max(int(real.sum()), 1)


@pytest.mark.invariant("padding.loss_ignores_padding")
@settings(max_examples=30)
@given(
    B=st.integers(1, 5),
    t=st.integers(1, 8),
    V=st.integers(1, 25),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_loss_and_gradient_match_the_definition(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    B: int,
    t: int,
    V: int,
    scale: float,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    pads = data.draw(st.lists(st.integers(0, t), min_size=B, max_size=B))
    mask = _mask(pads, t, device)
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, t, V, generator=gen) * scale).to(device, dtype).requires_grad_()
    targets = torch.randint(0, V, (B, t), generator=gen).to(device)  # (B, t)
    junk = data.draw(st.sampled_from([-100, -1, V, 10**9]))
    targets = targets.masked_fill(~mask, junk)  # (B, t), unreadable at pads
    loss = padded_cross_entropy(logits, targets, mask)
    assert loss.shape == () and loss.dtype == dtype and loss.device == logits.device
    torch.testing.assert_close(
        loss.detach().cpu().double(), reference(logits, targets, mask), **tol(dtype)
    )
    loss.backward()
    grad = logits.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert not grad[~mask].any(), "a padded position got gradient"
    n = max(int(mask.sum()), 1)
    want = (torch.softmax(logits.detach().double(), -1) - F.one_hot(targets.clamp(0, V - 1), V)) / n
    torch.testing.assert_close(grad[mask].double(), want[mask], **tol(dtype))


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_the_prediction_from_the_last_pad_does_not_count(device: torch.device) -> None:
    logits = torch.zeros(2, 4, 3, device=device)  # (2, 4, 3): uniform, log 3 a token
    logits[0, 1, 2] = -40.0  # a hopeless guess at row 0's last pad: must not raise the loss
    targets = torch.tensor([[0, 2, 1, 1], [0, 0, 0, 0]], device=device)  # (2, 4)
    mask = _mask([2, 4], 4, device)  # row 1 is all padding
    loss = padded_cross_entropy(logits, targets, mask)
    torch.testing.assert_close(loss, torch.tensor(3.0, device=device).log())


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_a_token_mean_not_a_mean_of_row_means(device: torch.device) -> None:
    # Row 0 has 3 counted tokens of loss log 2 each; row 1 one token of loss ~0.
    logits = torch.zeros(2, 3, 2, device=device)  # (2, 3, 2)
    logits[1, 2] = torch.tensor([50.0, 0.0])
    targets = torch.zeros(2, 3, dtype=torch.int64, device=device)  # (2, 3)
    loss = padded_cross_entropy(logits, targets, _mask([0, 2], 3, device))
    want = 3 * torch.tensor(2.0).log() / 4  # not (log 2 + 0) / 2
    torch.testing.assert_close(loss.cpu(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_nothing_counted_is_zero_with_zero_gradient(device: torch.device) -> None:
    logits = torch.randn(3, 2, 4, device=device, requires_grad=True)  # (3, 2, 4)
    targets = torch.full((3, 2), 99, device=device)  # (3, 2), out of range everywhere
    loss = padded_cross_entropy(logits, targets, torch.zeros(3, 2, dtype=torch.bool, device=device))
    assert loss.shape == () and loss.detach().item() == 0.0
    loss.backward()
    assert logits.grad is not None and not logits.grad.any()


@pytest.mark.invariant("padding.unpadded_exact")
@pytest.mark.parametrize("with_ignored", [False, True])
def test_no_mask_is_f_cross_entropy_bit_for_bit(device: torch.device, with_ignored: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, 7, generator=gen).to(device)  # (3, 5, 7)
    targets = torch.randint(0, 7, (3, 5), generator=gen).to(device)  # (3, 5)
    if with_ignored:
        targets[1, 2] = -100  # F.cross_entropy's own ignore_index, honoured without a mask
    got = padded_cross_entropy(logits, targets, None)
    assert torch.equal(got, F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


@pytest.mark.invariant("padding.loss_ignores_padding")
@pytest.mark.invariant("padding.finite_gradients")
def test_a_padded_training_step_is_the_token_weighted_rows_alone(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], tol: Tol, randomise: Randomise
) -> None:
    cfg = ModelConfig(V=19, T=8, C=12, L=2, H=3, d_ff=10, dropout=0.0, rope_theta=33.0)
    dtype = float_dtypes[-1]
    model = GPT(cfg)
    randomise(model, 8)
    model.to(device=device, dtype=dtype)
    pads = [0, 2, 7, 8]  # full, padded, one real input, none
    seq = torch.randint(0, cfg.V, (4, cfg.T + 1), generator=torch.Generator().manual_seed(2)).to(
        device
    )
    ids, targets = seq[:, :-1], seq[:, 1:]  # (4, T) each
    mask = _mask(pads, cfg.T, device)
    logits = padded_forward(model, ids, mask)
    assert isinstance(logits, torch.Tensor)
    loss = padded_cross_entropy(logits, targets, mask)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    n = int(mask.sum())
    total = torch.zeros((), dtype=dtype, device=device)
    for b, p in enumerate(pads):
        if p < cfg.T:
            alone = model(ids[b : b + 1, p:])[0]  # (T - p, V)
            total = total + F.cross_entropy(alone, targets[b, p:], reduction="sum")
    (total / n).backward()
    torch.testing.assert_close(loss, (total / n).detach(), **tol(dtype))
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(got[name]).all()
        torch.testing.assert_close(got[name], p.grad, **tol(dtype), msg=name)


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_half_precision_logits_keep_their_dtype(device: torch.device) -> None:
    logits = torch.randn(2, 3, 5, device=device).to(torch.bfloat16)  # (2, 3, 5)
    targets = torch.randint(0, 5, (2, 3), device=device)  # (2, 3)
    loss = padded_cross_entropy(logits, targets, _mask([1, 0], 3, device))
    assert loss.dtype == torch.bfloat16
    want = reference(logits.float(), targets, _mask([1, 0], 3, device))
    # Roundings to bfloat16 (u = eps / 2 each) of positive terms: each token's
    # log-softmax and its loss, their sum, the division: at most 4u relative.
    u = torch.finfo(torch.bfloat16).eps / 2
    torch.testing.assert_close(loss.double().cpu(), want, rtol=4 * u, atol=0.0)


@pytest.mark.invariant("padding.rejects_bad_input")
def test_bad_loss_inputs_name_expected_and_actual(device: torch.device) -> None:
    logits = torch.randn(2, 3, 5, device=device)  # (2, 3, 5)
    targets = torch.randint(0, 5, (2, 3), device=device)  # (2, 3)
    mask = _mask([1, 0], 3, device)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    cases = {
        "logits-2-d": ((logits[0], targets[0], mask[0]), ["(3, 5)"]),
        "logits-int": ((logits.long(), targets, mask), ["torch.int64"]),
        "logits-empty-vocab": ((logits[..., :0], targets, mask), ["(2, 3, 0)"]),
        "logits-list": ((logits.tolist(), targets, mask), ["list"]),
        "targets-int32": ((logits, targets.int(), mask), ["int64", "torch.int32"]),
        "targets-shape": ((logits, targets[:, :2], mask[:, :2]), ["(2, 3)", "(2, 2)"]),
        "targets-device": ((logits, targets.to(other), mask), [str(device), str(other)]),
        "target-equal-V": ((logits, targets.masked_fill(mask, 5), mask), ["[0, 4]", "max 5"]),
        "target-ignored-id-counted": ((logits, targets.masked_fill(mask, -100), mask), ["-100"]),
        "mask-int": ((logits, targets, mask.long()), ["torch.bool", "torch.int64"]),
        "mask-shape": ((logits, targets, mask[:1]), ["(2, 3)", "(1, 3)"]),
        "mask-right-padded": ((logits, targets, mask.flip(-1)), ["row 0"]),
    }
    for name, (args, needles) in cases.items():
        with pytest.raises(InputError) as caught:
            padded_cross_entropy(*args)  # type: ignore[arg-type]
        for needle in needles:
            assert needle in str(caught.value), f"{name}: {needle!r} not in {caught.value}"
