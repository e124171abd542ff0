"""Repository-wide pytest setup: hypothesis profiles.

``dev`` (the default) keeps property runs short enough for a 2-core laptop;
``thorough`` is for a nightly or a pre-release run:
``nox -s test-cpu -- --hypothesis-profile=thorough``.
The device comes from the contracts plugin (``--device``), not from here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, settings

# Torch kernels warm up on first call, so a per-example deadline would flake.
settings.register_profile(
    "dev",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", parent=settings.get_profile("dev"), max_examples=300)
settings.load_profile("dev")


# Comparison tolerances against float64 references, by the dtype under test.
# float64 results must agree to near machine precision; float32 ones to what
# single-precision accumulation over the tested sizes allows.
_TOLERANCES = {
    "torch.float64": {"rtol": 1e-10, "atol": 1e-12},
    "torch.float32": {"rtol": 1e-4, "atol": 1e-5},
}


@pytest.fixture(scope="session")
def tol() -> Callable[[torch.dtype], dict[str, float]]:
    """``tol(dtype)`` -> ``{"rtol": ..., "atol": ...}`` for ``assert_close``."""

    def lookup(dtype: torch.dtype) -> dict[str, float]:
        return _TOLERANCES[str(dtype)]

    return lookup


# Mixed precision (autocast, half-precision modules): tolerances derived from
# the dtype, never tuned to a run.
#
# Rounding a value to a floating dtype moves it by at most u = eps / 2 of its
# size (round to nearest; eps = torch.finfo(dtype).eps). One matmul stage in a
# 16-bit dtype rounds both operands (2u), accumulates its reduction of length
# n in float32 (at most n * u32 of the terms, u32 = 2**-24; CPU kernels
# accumulate 16-bit products in float32, and so does cuBLAS except in split-K
# reductions, which torch lets run in 16 bits by default; at the widths the
# tests use no split-K is expected, but this is unverified on CUDA so far),
# and rounds the result (u):
#
#     one stage:  3u + n * u32   of the size of its terms, sum |a_i * b_i|
#
# An elementwise op done in the 16-bit dtype (a norm or a residual add in a
# half-precision module) is one rounding, so counting it as a stage is an
# upper bound; what runs in float32 (RoPE, scale, mask and softmax, and under
# autocast the norms and the residual stream) adds nothing at this order. To
# first order the errors of successive stages add, provided no stage
# amplifies them: true for inputs of unit scale and default-initialised
# weights, the only data the tests draw, where every intermediate is of order
# one and softmax, RMSNorm and the residual adds have gains of about one
# (LayerNorm too, on rows not dominated by their mean: subtracting the mean is
# a cancellation that multiplies relative errors by |x| / std(x)). So an
# output that went through `stages` rounding stages (a backward pass counts two
# for each forward one) satisfies, element by element,
#
#     |got - exact| <= rtol * (|exact| + terms),   rtol = stages * (3u + n * u32)
#
# where `terms` is the size of the terms the element was summed from. The
# bound is relative to those terms, not to a result that cancels to nearly
# zero, and a test has to say what stands in for them. For a forward output:
# the largest |value| of its float64 reference. For gradients: the largest
# |value| among all the float64 gradients of the same backward pass (the
# input's and every parameter's). A single gradient element is a sum over
# tokens and, inside, over Jacobians that cancel by construction (LayerNorm's
# gradient is orthogonal to its input; a width-2 LayerNorm's is zero), so
# its own size says nothing about the size of the intermediates that were
# rounded on the way; the largest gradient of the pass does. The tests'
# losses are sum(output * g) with a random g, so the upstream gradient
# itself does not cancel (a cross-entropy gradient sums to zero over the
# vocabulary and cancels between equal tokens with different targets).
#
# Worked values for the attention forward (4 stages: qkv, scores, probs @ v,
# proj) at n = 64:  bfloat16 (eps 2**-7)  rtol = 4 * (3 * 2**-8  + 64 * 2**-24) = 0.047;
#                   float16  (eps 2**-10) rtol = 4 * (3 * 2**-11 + 64 * 2**-24) = 0.0059.
# The same model with u = u32 puts the fixed float32 row of _TOLERANCES above
# every size the tests use (4 stages, n <= 320: 4 * 323 * 2**-24 = 7.7e-5 <= 1e-4),
# and likewise float64 (1.4e-13 <= 1e-10).
_U32 = torch.finfo(torch.float32).eps / 2


def derived_rtol(dtype: torch.dtype, *, stages: int, reduction: int) -> float:
    """``stages * (3u + reduction * u32)`` for 16-bit ``dtype`` (derivation above).

    Raises:
        ValueError: ``stages`` or ``reduction`` below 1.
    """
    if stages < 1 or reduction < 1:
        raise ValueError(f"stages and reduction must be >= 1, got {stages} and {reduction}")
    u = torch.finfo(dtype).eps / 2
    return stages * (3 * u + reduction * _U32)


def assert_mixed_close(
    got: torch.Tensor,
    exact: torch.Tensor,
    *,
    dtype: torch.dtype,
    stages: int,
    reduction: int,
    terms: float | None = None,
) -> None:
    """Fail unless ``|got - exact| <= rtol * (|exact| + terms)`` everywhere.

    ``exact`` is a float64 reference on the CPU; ``terms`` is the size of the
    terms the elements sum (see above), the largest ``|exact|`` when omitted.
    """
    rtol = derived_rtol(dtype, stages=stages, reduction=reduction)
    got64 = got.detach().cpu().double()
    exact = exact.detach()
    assert got64.shape == exact.shape, f"shape {tuple(got64.shape)} != {tuple(exact.shape)}"
    size = exact.abs().max().item() if terms is None else terms
    allowed = rtol * (exact.abs() + size)
    diff = (got64 - exact).abs()
    bad = ~(diff <= allowed)  # NaN counts as bad
    if bool(bad.any()):
        worst = int(torch.argmax(torch.where(bad, diff - allowed, -torch.inf)))
        raise AssertionError(
            f"{int(bad.sum())} of {exact.numel()} elements beyond the {dtype} bound "
            f"(rtol {rtol:.3g}, {stages} stages, n = {reduction}, terms {size:.3g}): "
            f"worst |diff| {diff.flatten()[worst].item():.3g} > allowed "
            f"{allowed.flatten()[worst].item():.3g} at flat index {worst} "
            f"(exact {exact.flatten()[worst].item():.3g})"
        )


def assert_gradients_mixed_close(
    grads: list[torch.Tensor],
    exact: list[torch.Tensor],
    *,
    dtype: torch.dtype,
    stages: int,
    reduction: int,
) -> None:
    """``assert_mixed_close`` for every gradient of one backward pass, ``terms``
    being the largest ``|value|`` among all of ``exact`` (see above)."""
    assert len(grads) == len(exact), f"{len(grads)} gradients against {len(exact)} references"
    terms = max(e.detach().abs().max().item() for e in exact)
    for got, want in zip(grads, exact, strict=True):
        assert_mixed_close(got, want, dtype=dtype, stages=stages, reduction=reduction, terms=terms)


@pytest.fixture(scope="session")
def mixed_close() -> Callable[..., None]:
    """``mixed_close(got, exact, dtype=, stages=, reduction=, terms=None)``: see above."""
    return assert_mixed_close


@pytest.fixture(scope="session")
def mixed_close_grads() -> Callable[..., None]:
    """``mixed_close_grads(grads, exact, dtype=, stages=, reduction=)``: see above."""
    return assert_gradients_mixed_close


# Autocast dtypes worth testing on each device type; each is probed before use.
_AUTOCAST_CANDIDATES = {
    "cpu": (torch.bfloat16,),
    "cuda": (torch.float16, torch.bfloat16),
    "mps": (torch.float16, torch.bfloat16),
}
# What torch has promised on these devices since 2.4: its absence is a failure.
_AUTOCAST_REQUIRED = {"cpu": torch.bfloat16, "cuda": torch.float16}


def _autocast_computes_in(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a matmul under ``torch.autocast(device.type, dtype)`` really runs in ``dtype``.

    An unsupported pair makes torch warn and turn autocast off, or raise; both
    count as unsupported.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            a = torch.full((4, 4), 0.5, device=device)  # (4, 4)
            with torch.autocast(device.type, dtype=dtype):
                out = a @ a  # (4, 4)
            return out.dtype == dtype and bool((out == 1.0).all())
    except (RuntimeError, ValueError, TypeError, UserWarning):
        return False


@pytest.fixture(scope="session")
def autocast_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The 16-bit dtypes ``torch.autocast`` runs in on the session's device, probed.

    CPU: bfloat16; CUDA: float16 and bfloat16; MPS: whichever of the two the
    installed torch and macOS run. Half-precision modules are tested in the
    same dtypes.
    """
    found = tuple(d for d in _AUTOCAST_CANDIDATES[device.type] if _autocast_computes_in(device, d))
    required = _AUTOCAST_REQUIRED.get(device.type)
    if required is not None and required not in found:
        pytest.fail(f"torch.autocast on {device.type} must run in {required}, probe found {found}")
    if not found:
        pytest.skip(
            f"torch.autocast runs in no 16-bit dtype on {device} with torch {torch.__version__}"
        )
    return found


@pytest.fixture(scope="session")
def randomise() -> Callable[[torch.nn.Module, int], None]:
    """``randomise(module, seed)``: non-trivial weights everywhere, norms included.

    Matrices get N(0, 0.3); vectors (biases, norm weights) get 1 + N(0, 0.3), so
    a wiring bug (a skipped norm, a swapped branch) changes the output.
    """

    def fill(module: torch.nn.Module, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in module.parameters():
                noise = torch.randn(p.shape, generator=gen) * 0.3  # (*p.shape)
                p.copy_(noise + (1.0 if p.ndim == 1 else 0.0))

    return fill


# README examples (``nox -s test-cpu`` passes ``--codeblocks``): pytest-codeblocks
# collects python, sh and bash blocks. Only the Python ones are examples to run;
# the shell blocks install packages and call nox, so running them inside a test
# would recurse into this very session. They are deselected rather than skipped
# (a run without xdist prints the count: 13 today).
_EXAMPLE_SYNTAX = "python"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the non-Python code blocks of Markdown files."""
    shell = [
        item
        for item in items
        if item.path.suffix == ".md"
        and getattr(getattr(item, "obj", None), "syntax", _EXAMPLE_SYNTAX) != _EXAMPLE_SYNTAX
    ]
    if shell:
        config.hook.pytest_deselected(items=shell)
        items[:] = [item for item in items if item not in shell]
