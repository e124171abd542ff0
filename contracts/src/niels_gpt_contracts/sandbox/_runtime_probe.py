"""Runtime-rule probe, run in the sandbox (never imported by the checker).

stdin carries ``{"device", "root", "rules": [{"id", "driver"}]}``. For each rule
it loads the maintainer's driver (``specs/<stage>/<file>.py:<function>``, read
from ``root``) and calls ``driver(device, record)``. Inside every ``with
record():`` block the torch profiler records the name of each ATen op
dispatched (composite ops such as ``aten::scaled_dot_product_attention``
included), and a dispatch mode notes every ``aten::_to_copy`` or
``aten::copy_`` that changes dtype or device. It prints one JSON object:
``{rule id: {"ops": [...], "casts": [...], "blocks": n, "error": str | null}}``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _describe(tensor: Any) -> str:
    return f"{tensor.dtype}@{tensor.device}"


def _spy_class() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class CastSpy(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Notes every dtype or device change made by a copy."""

        def __init__(self, casts: list[str]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.casts = casts

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            name = func._schema.name
            if name == "aten::copy_" and len(args) >= 2:
                dst, src = args[0], args[1]
                if (dst.dtype, dst.device) != (src.dtype, src.device):
                    self.casts.append(f"aten::copy_ {_describe(src)} -> {_describe(dst)}")
            elif name == "aten::_to_copy" and args:
                src = args[0]
                dtype = kwargs.get("dtype") or src.dtype
                device = kwargs.get("device") or src.device
                if (dtype, str(device)) != (src.dtype, str(src.device)):
                    self.casts.append(f"aten::_to_copy {_describe(src)} -> {dtype}@{device}")
            return func(*args, **kwargs)

    return CastSpy


def _driver(root: Path, target: str) -> Any:
    path, _, name = target.partition(":")
    spec = importlib.util.spec_from_file_location(
        f"_contracts_driver_{Path(path).stem}", root / path
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the driver file {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _probe(rule: dict[str, Any], device: Any, root: Path) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ops: set[str] = set()
    casts: list[str] = []
    blocks = 0
    spy = _spy_class()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    @contextlib.contextmanager
    def record() -> Iterator[None]:
        nonlocal blocks
        with profile(activities=activities) as prof, spy(casts):
            yield
        if device.type == "cuda":
            torch.cuda.synchronize()
        ops.update(e.name for e in prof.events())
        blocks += 1

    try:
        _driver(root, rule["driver"])(device, record)
        error = None
    except BaseException as err:  # the driver's failure is the rule's verdict
        error = traceback.format_exception_only(err)[-1].strip()[:500]
    return {"ops": sorted(ops), "casts": sorted(set(casts)), "blocks": blocks, "error": error}


def main() -> None:
    request = json.loads(sys.stdin.read())
    import torch

    device = torch.device(request["device"])
    root = Path(request["root"])
    results = {rule["id"]: _probe(rule, device, root) for rule in request["rules"]}
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
