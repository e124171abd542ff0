"""Capture what an oracle call was built from (sandbox side; loaded by the worker).

In a capture run (the request's driver entry says ``"capture": true``) the
kit hands every call it runs to ``capture`` first, which sends one more
frame, named ``<call>#capture``: the call's recipe, never its answer.

A call the reproducer can rebuild is ``functools.partial`` of

- an ``nn.Module`` (``kind`` ``module``): its class, its ``cfg`` (a dataclass,
  the module's only constructor argument) and its ``state_dict``;
- a bound method of such a module (``kind`` ``method``, plus ``method``);
- a plain function (``kind`` ``function``);

with tensors (not on ``meta``: no data) or plain values as arguments. The
frame's ``values`` hold the import paths, config fields, mode (``training``,
``grad``, ``inference``) and plain arguments; its tensors (``state.<name>``, ``arg.<i>``,
``kwarg.<name>``) the weights and inputs as the call saw them. Anything else
is answered with ``error: "Uncapturable"`` and a reason. This process
decides nothing; the trusted side validates every name before using it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

import torch

PLAIN = (bool, int, float, str, type(None))


class Uncapturable(Exception):
    """The call is not built in a way the reproducer can rebuild."""


def _path(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _module(m: torch.nn.Module, values: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    cfg = getattr(m, "cfg", None)
    if cfg is None or not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise Uncapturable(f"{type(m).__name__} has no dataclass cfg")
    values["target"] = _path(type(m))
    values["config"] = _path(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not isinstance(value, PLAIN):
            raise Uncapturable(f"config field {f.name} is {type(value).__name__}")
        values[f"config.{f.name}"] = value
    values["training"] = m.training
    for name, t in m.state_dict().items():
        tensors[f"state.{name}"] = t.detach().clone()


def _recipe(fn: Callable[[], Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if not isinstance(fn, functools.partial):
        raise Uncapturable("the call is not a functools.partial")
    values: dict[str, Any] = {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
    }
    tensors: dict[str, torch.Tensor] = {}
    target = fn.func
    if isinstance(target, torch.nn.Module):
        values["kind"] = "module"
        _module(target, values, tensors)
    elif isinstance(target, types.MethodType) and isinstance(target.__self__, torch.nn.Module):
        values["kind"], values["method"] = "method", target.__func__.__name__
        _module(target.__self__, values, tensors)
    elif isinstance(target, types.FunctionType):
        values["kind"], values["target"] = "function", _path(target)
    else:
        raise Uncapturable(f"the call's target is a {type(target).__name__}")
    values["args"] = len(fn.args)
    named = [(f"arg.{i}", a) for i, a in enumerate(fn.args)]
    named += [(f"kwarg.{k}", a) for k, a in sorted(fn.keywords.items())]
    for key, arg in named:
        if isinstance(arg, torch.Tensor) and arg.is_meta:  # no data to send (a bad call's)
            raise Uncapturable(f"argument {key} is a meta tensor")
        if isinstance(arg, torch.Tensor):
            tensors[key] = arg.detach().clone()
        elif isinstance(arg, PLAIN):
            values[key] = arg
        else:
            raise Uncapturable(f"argument {key} is a {type(arg).__name__}")
    return values, tensors


def capture(frames: Any, encode: Callable[..., Any], stage: str, name: str, fn: Any) -> None:
    """Send ``name``'s recipe as a ``<name>#capture`` call frame (see the module docstring)."""
    header: dict[str, Any] = {
        "kind": "call",
        "stage": stage,
        "call": f"{name}#capture",
        "desc": "",
        "stages": 1,
        "reduction": 1,
        "rules": [],
        "relations": [],
        "compare": None,
        "computes_in": None,
        "error": None,
        "casts": [],
    }
    try:
        values, tensors = _recipe(fn)
    except Uncapturable as err:
        header["error"], header["message"] = "Uncapturable", str(err)[:300]
        values, tensors = {}, {}
    header["values"] = values
    header["tensors"], blob = encode(tensors)
    frames.write(header, [blob])
