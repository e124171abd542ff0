"""Reproduce one oracle call of a BROKEN verdict (written by ``contracts pr``).

Needs torch, safetensors and the stage packages, nothing of the checker. Put
the stage sources you want to try on the import path (``PYTHONPATH`` with
each ``packages/*/src``, or an install) and run ``python reproduce.py``. It
first replays, in this process and in order, the calls ``meta.json`` lists
as ``history`` (the calls that ran before the failing one in the checker's
worker, shrunk to the fewest that still fail: a memo, a cache or a counter
fills as it did there; their answers are not checked; ``--history N`` replays
only the first N). Then it rebuilds the call from ``meta.json`` and
``inputs.safetensors`` beside it (the module's class, config and weights,
the arguments, train/eval and grad mode), runs it, and compares every
output with ``expected.safetensors``
(the base's answer) within the dtype-derived bound in ``meta.json``:
``|got - want| <= rtol * (|want| + max |want|)``. Prints the largest
difference; exits 1 beyond the bound, 0 within.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent


def _obj(path: str) -> Any:
    module, _, qual = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qual.split("."):
        found = getattr(found, part)
    return found


def _flatten(value: Any, prefix: str, out: dict[str, torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        out[prefix or "out"] = value
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}.{i}" if prefix else str(i), out)


def _call(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    def value(key: str) -> Any:
        if key in tensors:
            return tensors[key].to(getattr(torch, meta["dtypes"][key]))
        return meta["plain"][key]

    fn: Any = _obj(meta["target"])
    if meta["kind"] != "function":
        module = fn(_obj(meta["config"])(**meta["config_fields"]))
        state = {k.removeprefix("state."): value(k) for k in tensors if k.startswith("state.")}
        floats = {t.dtype for t in state.values() if t.is_floating_point()}
        if len(floats) == 1:
            module = module.to(floats.pop())
        module.load_state_dict(state, strict=True)
        module.train(meta["training"])
        fn = getattr(module, meta["method"]) if meta["kind"] == "method" else module
    args = [value(f"arg.{i}") for i in range(meta["args"])]
    names = {k.removeprefix("kwarg.") for k in [*tensors, *meta["plain"]] if k.startswith("kwarg.")}
    kwargs = {k: value(f"kwarg.{k}") for k in sorted(names)}
    if meta["inference"]:
        with torch.inference_mode():
            return fn(*args, **kwargs)
    with torch.set_grad_enabled(meta["grad"]):
        return fn(*args, **kwargs)


def _replay(history: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> None:
    """Run each earlier call in order, as the worker did; what they return is not checked."""
    for i, step in enumerate(history):
        prefix = f"history.{i}."
        own = {k.removeprefix(prefix): t for k, t in tensors.items() if k.startswith(prefix)}
        with contextlib.suppress(Exception):  # an earlier call may raise, as in the worker
            _call(step, own)


def main() -> int:
    parser = argparse.ArgumentParser(description="Reproduce one oracle call of a verdict.")
    parser.add_argument("--history", type=int, default=None, help="replay only the first N")
    given = parser.parse_args()
    meta = json.loads((HERE / "meta.json").read_text(encoding="utf-8"))
    tensors = load_file(str(HERE / "inputs.safetensors"))
    expected = load_file(str(HERE / "expected.safetensors"))
    history = meta.get("history", [])[: given.history]
    print(f"{meta['stage']}: call {meta['call']} ({meta['desc']})")
    if history:
        print(f"replaying {len(history)} earlier call(s) first: {history[-1]['call']} last")
        _replay(history, tensors)
    tensors = {k: t for k, t in tensors.items() if not k.startswith("history.")}
    try:
        answer = _call(meta, tensors)
    except Exception as err:  # the call's answer may be an exception
        if type(err).__name__ == meta["error"]:
            print(f"raised {type(err).__name__}, as expected")
            return 0
        print(f"raised {type(err).__name__}: {err}; expected {meta['error'] or 'an answer'}")
        return 1
    if meta["error"] is not None:
        print(f"returned; expected it to raise {meta['error']}")
        return 1
    got: dict[str, torch.Tensor] = {}
    _flatten(answer, "", got)
    bad = False
    for key, bound in meta["expected"].items():
        if key not in got:
            print(f"{key}: missing from the answer")
            bad = True
            continue
        g, w = got[key].detach().double(), expected[key].double()  # the same shape
        if g.shape != w.shape:
            print(f"{key}: shape {tuple(g.shape)} where {tuple(w.shape)} was expected")
            bad = True
            continue
        diff = (g - w).abs()
        finite = torch.isfinite(w)
        terms = float(w[finite].abs().max()) if bool(finite.any()) else 0.0
        rtol = bound["rtol"] or 0.0
        allowed = rtol * (w.abs() + terms)
        same = ~finite & ((g == w) | (g.isnan() & w.isnan()))
        over = ~((diff <= allowed) | same)
        worst = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
        print(
            f"{key}: max |diff| {worst:.6g}, {int(over.sum())} of {over.numel()} beyond the bound"
        )
        bad = bad or bool(over.any())
    print("BEYOND the bound" if bad else "within the bound")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
