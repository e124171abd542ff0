"""A shrunk reproducer of a BROKEN oracle row, written beside the verdict (trusted side).

Of the PR stage's differing calls (``explain.smallest``), the first whose
recipe a capture run sent (``sandbox/_oracle_capture.py``: class, config,
state_dict, arguments, mode) becomes a folder ``<out>/<stage>-<call>/``:

- ``inputs.safetensors``: the weights (``state.<name>``) and tensor arguments,
  and those of every call replayed before it (``history.<i>.<key>``);
- ``expected.safetensors``: the base's (or the float64 reference's) answer;
- ``meta.json``: import paths, config fields, mode, plain arguments, dtypes,
  the dtype-derived bound of every compared output (``tolerance``), and
  ``history``: the recipes of the stage's calls that ran before it in the
  worker's process, in order;
- ``reproduce.py``: ``SCRIPT``, written here, the same text for every call:
  plain torch, safetensors and the stage packages, no checker import. Run
  with a tree's stage sources on the import path it replays the history in
  its own process (a memo, a cache or a counter fills as it did in the
  worker), runs the call, prints the largest difference from the expected
  answer and exits 1 beyond the bound, 0 within.

A failure that needs no earlier call gets an empty history; one that does
gets the shortest prefix of the history that still fails (``trim``, which the
oracle drives by running the script on the PR's code in the sandbox).

Everything the worker sent is data: import paths are accepted only when
they name a module some stage owns and a dotted identifier in it; nothing
the worker sent becomes script text.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from niels_gpt_contracts.decoding import convert, decode
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Call, Stream
from niels_gpt_contracts.verdict import tolerance
from niels_gpt_contracts.verdict.explain import Failed

QUAL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY = re.compile(r"(state|arg|kwarg)\.[A-Za-z0-9_.]+")
PLAIN = (bool, int, float, str, type(None))
SCRIPT = Path(__file__).with_name("_repro_script.py")


class Refused(ValueError):
    """A capture the reproducer will not use (the reason is shown in the verdict)."""


def _path(value: Any, modules: set[str]) -> str:
    if not isinstance(value, str) or value.count(":") != 1:
        raise Refused("an import path that is not module:name")
    module, qual = value.split(":")
    if module not in modules or not QUAL.fullmatch(qual):
        raise Refused(f"{module!r} is no stage's module" if module not in modules else "a name")
    return value


def _recipe(cap: Call, modules: set[str]) -> dict[str, Any]:
    """How to rebuild and run a captured call (no answer, no bound)."""
    v = cap.values
    kind = v.get("kind")
    if kind not in ("module", "method", "function"):
        raise Refused("an unknown kind of call")
    meta: dict[str, Any] = {"kind": kind, "target": _path(v.get("target"), modules)}
    if kind != "function":
        meta["config"] = _path(v.get("config"), modules)
        fields = {k.removeprefix("config."): x for k, x in v.items() if k.startswith("config.")}
        if not all(NAME.fullmatch(k) and isinstance(x, PLAIN) for k, x in fields.items()):
            raise Refused("a config field that is not a plain value")
        meta["config_fields"] = fields
        meta["training"] = bool(v.get("training"))
    if kind == "method":
        if not NAME.fullmatch(str(v.get("method"))):
            raise Refused("a method name that is not an identifier")
        meta["method"] = str(v["method"])
    args = v.get("args")
    if isinstance(args, bool) or not isinstance(args, int) or not 0 <= args <= 64:
        raise Refused("an argument count out of range")
    plain = {k: x for k, x in v.items() if k.startswith(("arg.", "kwarg."))}
    if not all(KEY.fullmatch(k) and isinstance(x, PLAIN) for k, x in plain.items()):
        raise Refused("an argument that is not a plain value")
    if not all(KEY.fullmatch(k) for k in cap.outputs):
        raise Refused("a tensor of no known part")
    meta.update(args=args, plain=plain, grad=bool(v.get("grad")))
    meta["inference"] = bool(v.get("inference"))
    meta["dtypes"] = {k: o.dtype for k, o in cap.outputs.items()}
    return meta


def _meta(cap: Call, want: Call, modules: set[str], *, exact: bool) -> dict[str, Any]:
    meta = _recipe(cap, modules)
    meta["error"] = want.error
    meta["expected"] = {
        key: {"dtype": out.dtype, "rtol": _rtol(want, out.dtype, exact=exact)}
        for key, out in want.outputs.items()
        if want.compare is None or key in want.compare
    }
    return meta


def _rtol(want: Call, dtype: str, *, exact: bool) -> float | None:
    """The bound ``tolerance.compare`` uses (``None``: compared exactly)."""
    if dtype in tolerance.EXACT or dtype not in tolerance.EPS:
        return None
    r = tolerance.rtol(tolerance.widest_error(dtype, want.computes_in), want.stages, want.reduction)
    if exact:
        return r + tolerance.rtol("float64", want.stages, want.reduction) + tolerance.unit(dtype)
    return 2 * r


def _save(path: Path, arrays: Mapping[str, np.ndarray[Any, Any]]) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(a) for k, a in arrays.items()}, str(path))


def write(
    out: Path,
    stage: str,
    picks: Sequence[Failed],
    captured: Stream,
    wants: Mapping[bool, Stream],
    modules: Iterable[str],
    order: Sequence[str] = (),
) -> Path:
    """The reproducer of the first of ``picks`` whose capture is usable: its script's path.

    ``wants[exact]`` holds the answers a pick was judged against (the base's,
    or the reference's for ``exact``); ``modules`` every import name a stage owns;
    ``order`` the stage's call names in the order the worker ran them: the
    captured calls before a pick become its history (a call that cannot be
    rebuilt is left out of it).

    Raises:
        Refused: no pick gave a usable capture (the message says why).
    """
    why = "no call was captured"
    allowed = set(modules)
    for pick in picks:
        cap = captured.calls.get((stage, f"{pick.name}#capture"))
        want = wants[pick.exact].calls.get((stage, pick.name))
        if cap is None or want is None:
            continue
        if cap.error is not None:
            why = f"{pick.name}: {cap.error} ({cap.message[:120]})"
            continue
        try:
            meta = _meta(cap, want, allowed, exact=pick.exact)
        except Refused as err:
            why = f"{pick.name}: {err}"
            continue
        meta.update(stage=stage, call=pick.name, desc=pick.desc)
        inputs = {k: o.data for k, o in cap.outputs.items()}
        meta["history"] = []
        before = list(order[: order.index(pick.name)]) if pick.name in order else []
        for name in before:
            step = captured.calls.get((stage, f"{name}#capture"))
            if step is None or step.error is not None:
                continue
            try:
                recipe = _recipe(step, allowed)
            except Refused:
                continue
            i = len(meta["history"])
            meta["history"].append({**recipe, "call": name})
            inputs.update({f"history.{i}.{k}": o.data for k, o in step.outputs.items()})
        folder = out / f"{stage}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', pick.name)}"
        folder.mkdir(parents=True, exist_ok=True)
        _save(folder / "inputs.safetensors", inputs)
        _save(
            folder / "expected.safetensors",
            {k: want.outputs[k].data for k in meta["expected"]},
        )
        (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        script = folder / "reproduce.py"
        script.write_text(SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
        return script
    raise Refused(why)


class _Replayed(msgspec.Struct, frozen=True):
    """What ``shrink`` reads of a ``meta.json``: the recipes replayed before the call."""

    history: list[dict[str, Any]] = []


def _read_meta(folder: Path) -> tuple[dict[str, Any], _Replayed]:
    """``meta.json`` as written (every field kept) and decoded for its history.

    Raises:
        OSError: no such file.
        Malformed: not a JSON object, or a ``history`` that is not a list of objects.
    """
    path = folder / "meta.json"
    meta = decode(path.read_bytes(), dict[str, Any], f"{path}: expected a reproducer's meta")
    return meta, convert(meta, _Replayed, f"{path}: expected a reproducer's meta")


def history_length(script: Path) -> int:
    """How many calls the reproducer beside ``script`` replays before its own."""
    return len(_read_meta(script.parent)[1].history)


def trim(script: Path, keep: int) -> None:
    """Keep only the first ``keep`` calls of the reproducer's history (and their tensors)."""
    from safetensors.numpy import load_file

    folder = script.parent
    meta, replayed = _read_meta(folder)
    meta["history"] = replayed.history[:keep]
    inputs = load_file(str(folder / "inputs.safetensors"))
    kept = {
        k: a
        for k, a in inputs.items()
        if not k.startswith("history.") or int(k.split(".")[1]) < keep
    }
    _save(folder / "inputs.safetensors", kept)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def _fails(box: Sandbox, roots: Sequence[Path], script: Path, keep: int, timeout: float) -> bool:
    """Whether the reproducer, replaying ``keep`` calls first, fails on ``roots``' code.

    It runs on a copy in the sandbox's scratch, never on the folder the verdict
    names (the PR's code may write where it runs).
    """
    with tempfile.TemporaryDirectory(prefix="repro-", dir=box.tmp) as tmp:
        copy = Path(tmp) / "repro"
        shutil.copytree(script.parent, copy)
        done = processes.run(
            [box.python, str(copy / script.name), "--history", str(keep)],
            env=box.environ(roots),
            cwd=box.home,
            timeout=timeout,
        )
    return done.code == 1


def shrink(box: Sandbox, roots: Sequence[Path], script: Path, timeout: float) -> str:
    """Trim the reproducer's history to the shortest prefix that still fails; a note.

    The failing call alone first (most bugs need no history), then the whole
    history, then a bisection between: a prefix that fails stays failing when
    calls are added after it, which is what a memo or a counter does.
    """
    calls = history_length(script)
    if calls == 0:
        return ""
    if _fails(box, roots, script, 0, timeout):
        trim(script, 0)
        return ""
    if not _fails(box, roots, script, calls, timeout):
        return f"it passes standalone even after the {calls} earlier call(s)"
    low, high = 0, calls  # low passes, high fails
    while high - low > 1:
        mid = (low + high) // 2
        if _fails(box, roots, script, mid, timeout):
            high = mid
        else:
            low = mid
    trim(script, high)
    return f"replays {high} earlier call(s) of {calls}"
