"""Oracle worker: drives the stages' public APIs like a user's script (sandbox side).

Started by ``oracle_run`` as ``python -I <this file>`` with a user-like
environment (no pytest or sandbox variables, default thread count, a random
hash seed). ``-I`` ignores ``PYTHON*`` variables, user site-packages and the
script's folder, so nothing but this file decides the import path: every
entry that provides one of the stages' top-level names (an editable install)
and every editable-install finder is dropped, and the tree under check is
appended the way an installed wheel would be found.

stdin carries one JSON request, read whole before any stage code runs:
``{"seed", "fd", "roots", "paths", "names", "preload", "references", "drivers":
[{"stage", "file", "function", "watch": {rule: casts}, "only" | "skip": [...],
"capture"?}]}`` (``capture``: send each call's recipe first, ``_oracle_capture``).
``paths`` (the spec kit's folder and the drivers' stage folders, ``specpath``)
go after the roots; a driver is imported by its module name from there, and
must be the file named.
Answers go to file descriptor ``fd`` (a pipe the stage code has no name for)
as frames (see ``_oracle_kit.Frames``): one per call (with what it left behind,
``_oracle_aftermath``), one ``held`` frame per ``Oracle.held``, one ``ops`` frame per
stage whose calls were watched, ``driver-error`` or ``fatal`` frames, and a
final ``done``. This process decides nothing.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE

import bisect  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

COUNT_EVERY = 4  # one call in this many (keyed by the seed) has its FLOPs and ops counted


def _isolate(roots: list[str], names: list[str], paths: Sequence[str] = ()) -> None:
    def foreign(entry: str) -> bool:
        return bool(entry) and any(
            os.path.exists(os.path.join(entry, n)) or os.path.exists(os.path.join(entry, n + ".py"))
            for n in names
        )

    sys.path[:] = [p for p in sys.path if not foreign(p)] + roots + list(paths)
    sys.meta_path[:] = [
        f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")
    ]


def _load(name: str, path: str) -> ModuleType:
    """Execute ``path`` as module ``name`` (a reference in place of a stage's module:
    its parent package imported first and the module set on it, as an import would)."""
    parent, _, leaf = name.rpartition(".")
    package = importlib.import_module(parent) if parent else None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if package is not None:
        setattr(package, leaf, module)
    return module


def _driver(path: str) -> ModuleType:
    """The driver file ``path``, imported by its module name from the spec folders."""
    module = importlib.import_module(Path(path).stem)
    if module.__file__ is None or Path(module.__file__).resolve() != Path(path).resolve():
        raise ImportError(f"expected the driver {path}, found {module.__file__}")
    return module


def _ops(prof: Any, labels: dict[str, str]) -> dict[str, list[str]]:
    """Distinct op names dispatched inside each watched call's profiler range.

    The ranges (one per watched call, never overlapping: calls run one after
    another) are sorted by start; each op goes to the range that holds its start.
    """
    events = prof.profiler.kineto_results.events()
    ranges = sorted(
        (e.start_ns(), e.end_ns(), labels[e.name()]) for e in events if e.name() in labels
    )
    starts = [lo for lo, _, _ in ranges]
    found: dict[str, set[str]] = {name: set() for _, _, name in ranges}
    for e in events:
        name = e.name()
        if name in labels:
            continue
        at = bisect.bisect_right(starts, e.start_ns()) - 1
        if at >= 0 and e.start_ns() <= ranges[at][1]:
            found[ranges[at][2]].add(name)
    return {call: sorted(ops) for call, ops in found.items()}


def _not_dumpable() -> None:
    """Other processes of this user may not read this one's memory or open its
    descriptors through /proc (the PR's worker runs beside the base's)."""
    if sys.platform.startswith("linux"):
        import contextlib
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def main() -> None:
    _not_dumpable()
    request = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(int(request["fd"]), "wb", closefd=True)
    _isolate(list(request["roots"]), list(request["names"]), list(request.get("paths", [])))
    kit = _load("_oracle_kit", str(Path(__file__).with_name("_oracle_kit.py")))
    after = _load("_oracle_aftermath", str(Path(__file__).with_name("_oracle_aftermath.py")))
    frames = kit.Frames(out)
    try:
        for module, path in request.get("references", {}).items():
            _load(module, path)
        for module in request["preload"]:
            importlib.import_module(module)
    except BaseException as err:  # the tree cannot even be imported
        frames.write({"kind": "fatal", "error": _why(err)})
        return
    import torch

    for driver in request["drivers"]:
        stage, watch = driver["stage"], dict(driver["watch"])
        only, skip = driver.get("only"), list(driver.get("skip", []))

        def runs(call: str, only: list[str] | None = only, skip: list[str] = skip) -> bool:
            if only is not None:
                return bool(kit.matches(only, call))
            return not kit.matches(skip, call)

        oracle = kit.Oracle(stage, int(request["seed"]), frames, run=runs, watch=watch)
        if driver.get("capture"):  # a reproducer's run: each call's recipe before its answer
            cap = _load("_oracle_capture", str(Path(__file__).with_name("_oracle_capture.py")))
            oracle.capture = cap.capture
        oracle.after = after.Aftermath(partial(_counted, kit, int(request["seed"]), stage))
        try:
            fn = getattr(_driver(driver["file"]), driver["function"])
            if watch:
                activity = [torch.profiler.ProfilerActivity.CPU]
                with torch.profiler.profile(activities=activity) as prof:
                    prof.toggle_collection_dynamic(False, activity)
                    oracle.profiler = prof
                    fn(oracle)
                frames.write({"kind": "ops", "stage": stage, "ops": _ops(prof, oracle.labels)})
            else:
                fn(oracle)
        except BaseException as err:  # a driver that cannot finish: the stage's verdict
            frames.write({"kind": "driver-error", "stage": stage, "error": _why(err)})
    frames.write({"kind": "done"})
    out.close()


def _counted(kit: Any, seed: int, stage: str, call: str) -> bool:
    """Whether a call's cost is counted: a share keyed by the secret seed."""
    return bool(kit._key(seed, stage, "cost", call) % COUNT_EVERY == 0)


def _why(err: BaseException) -> str:
    return traceback.format_exception_only(err)[-1].strip()[:500]


if __name__ == "__main__":
    main()
