"""Device names resolved to a ``torch.device`` that is really there.

The code is in ``selection``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.device.selection import (
    DEVICE_NAMES,
    DeviceName,
    DeviceUnavailableError,
    is_available,
    resolve_device,
)

__all__ = ["DEVICE_NAMES", "DeviceName", "DeviceUnavailableError", "is_available", "resolve_device"]
