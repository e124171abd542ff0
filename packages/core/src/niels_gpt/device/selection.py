"""Resolve a device name to a ``torch.device`` that is really there.

``resolve_device("auto")`` picks CUDA, then MPS, then CPU. Asking for a device
this machine lacks is an error, never a silent fall back to the CPU.
"""

from __future__ import annotations

from typing import Final, Literal

import torch

__all__ = ["DEVICE_NAMES", "DeviceName", "DeviceUnavailableError", "is_available", "resolve_device"]

DeviceName = Literal["cpu", "mps", "cuda", "auto"]
DEVICE_NAMES: Final[tuple[str, ...]] = ("cpu", "mps", "cuda", "auto")


class DeviceUnavailableError(RuntimeError):
    """The requested device type exists in PyTorch but not on this machine."""


def is_available(kind: str) -> bool:
    """Whether a concrete device type (``cpu``, ``mps`` or ``cuda``) is usable here.

    Raises:
        ValueError: ``kind`` is not one of ``cpu``, ``mps``, ``cuda``.
    """
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return torch.backends.mps.is_built() and torch.backends.mps.is_available()
    raise ValueError(f"device kind must be one of 'cpu', 'mps', 'cuda', got {kind!r}")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """Turn ``cpu | mps | cuda | auto`` (or a ``torch.device``) into a usable device.

    An index is accepted for CUDA (``"cuda:1"``) and checked against the
    device count.

    Raises:
        ValueError: an unknown device name.
        DeviceUnavailableError: the device is not present on this machine.
    """
    if isinstance(name, torch.device):
        device = name
    elif not isinstance(name, str):
        raise ValueError(
            f"device must be a str or torch.device, got {type(name).__name__} {name!r}"
        )
    elif name == "auto":
        for kind in ("cuda", "mps"):
            if is_available(kind):
                return torch.device(kind)
        return torch.device("cpu")
    else:
        kind = name.split(":", 1)[0]
        if kind not in ("cpu", "mps", "cuda"):
            raise ValueError(f"device must be one of {', '.join(DEVICE_NAMES)}, got {name!r}")
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise ValueError(f"malformed device string {name!r}: {err}") from None

    if device.type not in ("cpu", "mps", "cuda"):
        raise ValueError(f"device type must be cpu, mps or cuda, got {device.type!r}")
    if not is_available(device.type):
        raise DeviceUnavailableError(
            f"device {device.type!r} was requested but is not available here"
        )
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise DeviceUnavailableError(
                f"device {str(device)!r} was requested but only {count} CUDA device(s) exist"
            )
    return device
