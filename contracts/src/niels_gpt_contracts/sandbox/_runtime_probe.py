"""Runtime-rule probe, run in the sandbox (never imported by the checker).

stdin carries ``{"device", "root", "paths", "rules": [{"id", "driver"}]}``. For
each rule it imports the maintainer's driver (``specs/<stage>/<file>.py:<function>``,
the file under ``root``) by its module name from ``paths`` (the spec kit's
folder and the stages' folders, ``specpath``) and calls ``driver(device, record)``.
Inside every ``with record():`` block the torch profiler records the name of each ATen op
dispatched (composite ops such as ``aten::scaled_dot_product_attention``
included), and the oracle kit's dispatch mode (``_oracle_kit.cast_spy``,
loaded from its file) notes every ``aten::_to_copy`` or ``aten::copy_`` that
changes dtype or device. It prints one JSON object:
``{rule id: {"ops": [...], "casts": [...], "blocks": n, "error": str | null}}``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _spy_factory() -> Any:
    """``cast_spy`` of the oracle kit beside this file (one copy of the dispatch mode)."""
    path = Path(__file__).with_name("_oracle_kit.py")
    spec = importlib.util.spec_from_file_location("_contracts_oracle_kit", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    kit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = kit  # as an import would, before its code runs
    spec.loader.exec_module(kit)
    return kit.cast_spy


def _driver(root: Path, target: str) -> Any:
    path, _, name = target.partition(":")
    module = importlib.import_module(Path(path).stem)
    if module.__file__ is None or Path(module.__file__).resolve() != (root / path).resolve():
        raise ImportError(f"expected the driver {root / path}, found {module.__file__}")
    return getattr(module, name)


def _probe(rule: dict[str, Any], device: Any, root: Path, spy: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ops: set[str] = set()
    casts: list[str] = []
    blocks = 0
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
    sys.path.extend(request.get("paths", []))
    spy = _spy_factory()  # the kit, loaded once for every rule
    results = {rule["id"]: _probe(rule, device, root, spy) for rule in request["rules"]}
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
