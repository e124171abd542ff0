"""resolve_device: present devices resolve, absent ones fail loudly."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.device import DeviceUnavailableError, is_available, resolve_device


@pytest.mark.invariant("core.device_resolution")
def test_cpu_and_auto_resolve() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert is_available(resolve_device("auto").type)
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.invariant("core.device_resolution")
def test_auto_prefers_accelerators() -> None:
    expected = "cuda" if is_available("cuda") else "mps" if is_available("mps") else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.invariant("core.device_resolution")
@pytest.mark.parametrize("kind", ["mps", "cuda"])
def test_absent_accelerator_is_an_error(kind: str) -> None:
    if is_available(kind):
        assert resolve_device(kind).type == kind
    else:
        with pytest.raises(DeviceUnavailableError, match=kind):
            resolve_device(kind)


@pytest.mark.invariant("core.device_resolution")
@pytest.mark.parametrize("name", ["gpu", "tpu", "", "cuda0", "xla"])
def test_unknown_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="device"):
        resolve_device(name)


@pytest.mark.invariant("core.device_resolution")
def test_device_index_beyond_count_is_an_error() -> None:
    if not is_available("cuda"):
        with pytest.raises(DeviceUnavailableError):
            resolve_device("cuda:0")
    else:
        with pytest.raises(DeviceUnavailableError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.invariant("core.device_resolution")
def test_device_is_the_session_device(device: torch.device) -> None:
    assert resolve_device(device.type).type == device.type
