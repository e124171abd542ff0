"""Acceptance tests of ``padded_cross_entropy`` (stage padding).

The reference is written here from the definition, in float64: for each
counted position (its input real), ``logsumexp(logits) - logits[target]``,
summed and divided by the number of counted positions (1 when there is none).
Targets at padded positions hold garbage (``-100``, ``V``, large values): they
must be ignored, not read. End to end, the loss of a padded batch through
``padded_forward`` must be the token-weighted loss of the rows alone, in value
and in gradient.
"""

from __future__ import annotations

from typing import Any

import padding_kit as kit
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_cross_entropy, padded_forward

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here


def _garbage_at_pads(targets: torch.Tensor, mask: torch.Tensor, V: int) -> torch.Tensor:
    """Targets whose padded positions hold -100, V and 10 V in turn."""
    junk = torch.tensor([-100, V, 10 * V], device=targets.device)  # (3,)
    cols = torch.arange(targets.shape[1], device=targets.device) % 3  # (t,)
    return torch.where(mask, targets, junk[cols].expand_as(targets))  # (B, t)


def reference_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """The token mean of -log softmax(logits)[target] over real inputs, in float64 Python."""
    total, count = 0.0, 0
    rows = logits.detach().to("cpu", torch.float64)
    for b, row in enumerate(mask.cpu().tolist()):
        for j, real in enumerate(row):
            if real:
                z = rows[b, j]  # (V,)
                total += float(torch.logsumexp(z, 0) - z[int(targets[b, j])])
                count += 1
    return total / max(count, 1)


@pytest.mark.invariant("padding.loss_ignores_padding")
@settings(max_examples=25)
@given(
    B=st.integers(1, 4),
    t=st.integers(1, 9),
    V=st.integers(1, 30),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_loss_is_the_token_mean_over_real_inputs(
    rig: kit.Rig, B: int, t: int, V: int, seed: int, data: st.DataObject
) -> None:
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    pads = data.draw(st.lists(st.integers(0, t), min_size=B, max_size=B))  # t: all padding
    mask = kit.mask(pads, t, rig.device)
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, t, V, generator=gen) * 3).to(rig.device, dtype).requires_grad_()
    targets = torch.randint(0, V, (B, t), generator=gen).to(rig.device)  # (B, t)
    targets = _garbage_at_pads(targets, mask, V)
    loss = padded_cross_entropy(logits, targets, mask)
    assert loss.shape == () and loss.dtype == dtype and loss.device == logits.device
    want = torch.tensor(reference_loss(logits, targets, mask), dtype=torch.float64)
    rig.close(loss.detach().cpu().double(), want, dtype)
    loss.backward()
    grad = logits.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert not grad[~mask].any(), "a padded position got a gradient"
    n = int(mask.sum())
    if n:  # the gradient of a mean: (softmax - onehot) / n at every counted position
        probs = torch.softmax(logits.detach().double(), -1)  # (B, t, V)
        onehot = F.one_hot(targets.clamp(0, V - 1), V).double()  # (B, t, V)
        rig.close(grad[mask].double(), ((probs - onehot) / n)[mask], dtype)


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_nothing_counted_gives_zero_and_no_gradient(device: torch.device) -> None:
    logits = torch.randn(2, 4, 5, device=device, requires_grad=True)  # (2, 4, 5)
    targets = torch.full((2, 4), -100, device=device)  # (2, 4), every target garbage
    mask = torch.zeros(2, 4, dtype=torch.bool, device=device)  # (2, 4), no real input
    loss = padded_cross_entropy(logits, targets, mask)
    assert loss.shape == () and loss.detach().item() == 0.0
    loss.backward()
    assert logits.grad is not None and not logits.grad.any()


@pytest.mark.invariant("padding.loss_ignores_padding")
def test_the_prediction_of_the_first_real_token_from_a_pad_does_not_count(
    device: torch.device,
) -> None:
    # Row 0: two pads, then 3 real inputs. Only columns 2, 3, 4 count; column 1
    # (the last pad) predicts the first real token and must not.
    logits = torch.zeros(1, 5, 4, device=device)  # (1, 5, 4): uniform, loss log 4 a token
    logits[0, 1, 0] = 50.0  # a confident right answer at the last pad: must not lower the loss
    targets = torch.tensor([[3, 0, 1, 2, 3]], device=device)  # (1, 5)
    loss = padded_cross_entropy(logits, targets, kit.mask([2], 5, device))
    torch.testing.assert_close(loss, torch.log(torch.tensor(4.0, device=device)))


@pytest.mark.invariant("padding.loss_ignores_padding")
@pytest.mark.invariant("padding.finite_gradients")
@pytest.mark.parametrize("fast", [False, True])
def test_training_loss_of_a_padded_batch_is_that_of_the_rows_alone(
    rig: kit.Rig, fast: bool
) -> None:
    # ids = sequence[:, :-1], targets = sequence[:, 1:], one mask for the inputs.
    cfg = ModelConfig(V=29, T=10, C=16, L=2, H=2, d_ff=12, dropout=0.0, rope_theta=60.0)
    pads, t = [0, 3, 8, 10, 5], cfg.T  # row 2: one real input, row 3: none
    dtype = rig.widest
    model = GPT(cfg)
    rig.randomise(model, 3)
    model.to(device=rig.device, dtype=dtype)
    if fast:
        use_fast_attention(model)
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, cfg.V, (len(pads), t + 1), generator=gen).to(rig.device)  # (B, t + 1)
    ids, targets = seq[:, :-1], seq[:, 1:]  # (B, t) each
    mask = kit.mask(pads, t, rig.device)
    loss = padded_cross_entropy(padded_forward(model, ids, mask), targets, mask)  # type: ignore[arg-type]
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    n_total = sum(t - p for p in pads)
    want = torch.zeros((), dtype=dtype, device=rig.device)
    for b, p in enumerate(pads):
        if p == t:
            continue
        alone = F.cross_entropy(model(ids[b : b + 1, p:])[0], targets[b, p:])  # row mean
        want = want + alone * (t - p) / n_total  # weighted by the row's tokens
    want.backward()
    rig.close(loss.detach(), want.detach(), dtype)
    for name, param in model.named_parameters():
        assert param.grad is not None
        assert torch.isfinite(got[name]).all(), name
        torch.testing.assert_close(got[name], param.grad, **rig.tol(dtype), msg=name)


@pytest.mark.invariant("padding.unpadded_exact")
def test_no_mask_is_cross_entropy_itself(rig: kit.Rig) -> None:
    for dtype in rig.float_dtypes:
        gen = torch.Generator().manual_seed(4)
        logits = torch.randn(3, 6, 11, generator=gen).to(rig.device, dtype).requires_grad_()
        targets = torch.randint(0, 11, (3, 6), generator=gen).to(rig.device)  # (3, 6)
        got = padded_cross_entropy(logits, targets, None)
        (grad,) = torch.autograd.grad(got, logits)
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        (want_grad,) = torch.autograd.grad(want, logits)
        assert torch.equal(got, want) and torch.equal(grad, want_grad)


def _bad_calls(device: torch.device) -> dict[str, tuple[Any, Any, Any, list[str]]]:
    """name -> (logits, targets, mask, strings the message must hold)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=gen).to(device)  # (2, 4, 7)
    targets = torch.randint(0, 7, (2, 4), generator=gen).to(device)  # (2, 4)
    mask = kit.mask([1, 0], 4, device)  # (2, 4)
    other = torch.device("meta") if device.type == "cpu" else torch.device("cpu")
    return {
        "logits-2-d": (logits[0], targets[0], mask[0], []),
        "logits-int": (logits.long(), targets, mask, []),
        "logits-list": (logits.tolist(), targets, mask, []),
        "logits-empty-t": (logits[:, :0], targets[:, :0], mask[:, :0], []),
        "targets-int32": (logits, targets.int(), mask, []),
        "targets-float": (logits, targets.float(), mask, []),
        "targets-wrong-shape": (logits, targets[:, :3], mask[:, :3], []),
        "targets-other-device": (logits, targets.to(other), mask.to(other), []),
        "counted-target-equal-V": (logits, targets.masked_fill(mask, 7), mask, []),
        "counted-target-ignore-index": (logits, targets.masked_fill(mask, -100), mask, []),
        "mask-int64": (logits, targets, mask.long(), ["torch.bool", "torch.int64"]),
        "mask-shorter": (logits, targets, mask[:, :3], ["(2, 4)", "(2, 3)"]),
        "mask-other-device": (logits, targets, mask.to(other), [str(other)]),
        "mask-right-padded": (logits, targets, mask.flip(-1), ["row 0"]),
    }


@pytest.mark.invariant("padding.rejects_bad_input")
@pytest.mark.parametrize("case", sorted(_bad_calls(torch.device("cpu"))))
def test_padded_cross_entropy_rejects_bad_input(device: torch.device, case: str) -> None:
    logits, targets, mask, needles = _bad_calls(device)[case]
    with pytest.raises(InputError) as caught:
        padded_cross_entropy(logits, targets, mask)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not named in {message!r}"
