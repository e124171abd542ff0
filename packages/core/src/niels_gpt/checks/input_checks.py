"""Explicit input checks shared by the model stages.

Every check raises ``InputError`` with the expected and the actual value in
its message. The checks are plain ``if``/``raise`` statements, so they survive
``python -O`` (an ``assert`` statement would not).
"""

from __future__ import annotations

import torch

__all__ = ["InputError", "check_features", "check_length", "check_like", "is_index"]


class InputError(AssertionError, ValueError, TypeError):
    """An input broke a documented contract (rank, shape, dtype, device, length).

    It is an ``AssertionError`` because the seeds call these checks hard
    asserts, and also a ``ValueError``/``TypeError`` so callers can catch the
    kind they expect. It is raised explicitly, never by ``assert``.
    """


def check_length(t: int, limit: int, what: str = "sequence length t") -> None:
    """Require ``1 <= t <= limit`` (the hard ``t <= cfg.T`` assert of the seeds)."""
    if not 1 <= t <= limit:
        raise InputError(f"{what} must be in [1, {limit}] (cfg.T), got {t}")


def check_features(x: torch.Tensor, name: str, *, ndim: int, last: int) -> None:
    """Require ``x.ndim == ndim`` and ``x.shape[-1] == last``."""
    if x.ndim != ndim:
        raise InputError(
            f"{name} must have {ndim} dims, got {x.ndim} dims with shape {tuple(x.shape)}"
        )
    if x.shape[-1] != last:
        raise InputError(
            f"{name} last dim must be {last} (cfg.C), got {x.shape[-1]} in shape {tuple(x.shape)}"
        )


def check_like(x: torch.Tensor, name: str, reference: torch.Tensor, owner: str) -> None:
    """Require ``x`` to share dtype and device with a module parameter.

    No silent cast: a float64 input to a float32 module is an error, as is a
    CPU input to a CUDA module.
    """
    if x.dtype != reference.dtype:
        raise InputError(
            f"{name} dtype must match the {owner} parameters ({reference.dtype}), got {x.dtype}"
        )
    if x.device != reference.device:
        raise InputError(
            f"{name} device must match the {owner} parameters ({reference.device}), got {x.device}"
        )


def is_index(value: object, low: int, high: int | None) -> bool:
    """Whether ``value`` is an int (not a ``bool``) in ``[low, high)``, or ``>= low``
    when ``high`` is None.

    A predicate, not a check: callers raise their own ``InputError`` naming the
    argument and its range. ``True`` is an int to Python but never an index here.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return low <= value and (high is None or value < high)
