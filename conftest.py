"""Repository-wide pytest setup: hypothesis profiles.

``dev`` (the default) keeps property runs short enough for a 2-core laptop;
``thorough`` is for a nightly or a pre-release run:
``nox -s test-cpu -- --hypothesis-profile=thorough``.
The device comes from the contracts plugin (``--device``), not from here.
"""

from __future__ import annotations

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
