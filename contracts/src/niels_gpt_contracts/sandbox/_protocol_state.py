"""Everything global a torch process exposes, as one comparable snapshot (sandbox side).

The module protocol (``_protocol_probes``) takes a snapshot before and after
each step of a module's life (build, forward, backward, round trips,
compilation) and reports the names of the entries that changed; the trusted
side compares those names with the base's. Nothing here is listed by hand
beyond the places to look, so a global torch adds later is covered without
a new rule:

- every zero-argument ``torch.get_*``, ``torch.is_*`` and ``torch.are_*``
  function whose answer is a plain value (the RNG state as a digest);
- every public flag of each ``torch.backends.*`` module, and each of its
  zero-argument ``get_*``/``is_*``/``*_enabled`` functions;
- each config module's whole copy (dynamo, inductor, functorch, fx), and
  the compiler's stance (``torch.compiler.set_stance``);
- the global module hooks (``nn.modules.module._global_*``), the torch
  function and dispatch mode stacks, and the process environment.

Each entry is a short string (``repr`` or a digest), so two snapshots compare
with ``==`` and the report stays small.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import pkgutil
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

PLAIN = (bool, int, float, str, torch.dtype, torch.device, type(None))
# Answers that name a place rather than a state, or that answer differently on
# every call by design.
SKIP = frozenset({"torch.get_file_path", "torch.get_device_module"})
CONFIGS = (
    "torch._dynamo.config",
    "torch._inductor.config",
    "torch._functorch.config",
    "torch.fx.experimental._config",
)


def _value(v: Any) -> str | None:
    """A comparable text for ``v``, or None when it is not a state value."""
    if isinstance(v, torch.Tensor):
        raw = v.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # (nbytes,)
        return "tensor:" + hashlib.blake2b(raw.numpy().tobytes(), digest_size=12).hexdigest()
    if isinstance(v, PLAIN):
        return repr(v)
    return None


def _getters(prefix: str, module: Any, names: Iterator[str]) -> Iterator[tuple[str, str]]:
    for name in names:
        where = f"{prefix}.{name}"
        if where in SKIP:
            continue
        fn = getattr(module, name, None)
        if not callable(fn) or isinstance(fn, type):
            continue
        try:
            got = _value(fn())
        except Exception:  # a getter that takes arguments, or needs a device
            continue
        if got is not None:
            yield where, got


def _torch_getters() -> Iterator[tuple[str, str]]:
    names = (n for n in sorted(dir(torch)) if n.startswith(("get_", "is_", "are_")))
    yield from _getters("torch", torch, names)
    yield "torch.initial_seed", repr(torch.initial_seed())


@functools.cache
def _backend_modules() -> tuple[tuple[str, Any], ...]:
    """Each public ``torch.backends`` module, found once: ``(name, module)``."""
    import torch.backends

    found = []
    for info in pkgutil.iter_modules(torch.backends.__path__):
        if info.name.startswith("_"):
            continue
        try:
            found.append((info.name, importlib.import_module(f"torch.backends.{info.name}")))
        except Exception:
            continue
    return tuple(found)


def _backends() -> Iterator[tuple[str, str]]:
    for name, module in _backend_modules():
        prefix = f"torch.backends.{name}"
        # torch.backends.cudnn and others are module subclasses whose flags are
        # properties of their class, not attributes of the module.
        names = set(dir(module)) | set(vars(type(module)))
        public = [n for n in sorted(names) if not n.startswith("_")]
        for name in public:
            try:
                value = getattr(module, name, None)
            except Exception:  # a flag whose getter needs a device
                continue
            if isinstance(value, (bool, int, float, str)):
                yield f"{prefix}.{name}", repr(value)
        calls = (n for n in public if n.startswith(("get_", "is_")) or n.endswith("_enabled"))
        yield from _getters(prefix, module, calls)
        # torch.backends.cuda.matmul and similar flag holders
        for name in public:
            try:
                holder = getattr(module, name, None)
            except Exception:
                continue
            if type(holder).__module__ == module.__name__ and not callable(holder):
                for flag in (
                    "allow_tf32",
                    "allow_fp16_reduced_precision_reduction",
                    "allow_bf16_reduced_precision_reduction",
                    "fp32_precision",
                ):
                    try:
                        got = _value(getattr(holder, flag))
                    except Exception:
                        continue
                    if got is not None:
                        yield f"{prefix}.{name}.{flag}", got


def _configs() -> Iterator[tuple[str, str]]:
    for name in CONFIGS:
        try:
            module = importlib.import_module(name)
            copy = module.get_config_copy()
        except Exception:
            continue
        for key in sorted(copy):
            yield f"{name}.{key}", repr(copy[key])[:200]
    try:
        from torch._dynamo import eval_frame

        yield "torch.compiler.stance", repr(getattr(eval_frame, "_stance", None))
    except Exception:
        pass


def _hooks_and_modes() -> Iterator[tuple[str, str]]:
    from torch.nn.modules import module as nn_module

    for name in sorted(dir(nn_module)):
        if name.startswith("_global_"):
            value = getattr(nn_module, name)
            if isinstance(value, dict):
                yield f"torch.nn.modules.module.{name}", repr(len(value))
    c = torch._C
    for name in ("_len_torch_function_stack", "_len_torch_dispatch_stack"):
        fn: Callable[[], Any] | None = getattr(c, name, None)
        if fn is not None:
            yield f"torch._C.{name}", repr(fn())


def _environment() -> Iterator[tuple[str, str]]:
    for key in sorted(os.environ):
        yield (
            f"os.environ[{key!r}]",
            hashlib.blake2b(os.environ[key].encode("utf-8", "replace"), digest_size=8).hexdigest(),
        )


def snapshot() -> dict[str, str]:
    """The process's global state now: ``{where: value text}``."""
    out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for part in (_torch_getters, _backends, _configs, _hooks_and_modes, _environment):
            out.update(part())
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The entries that differ between two snapshots (added and removed ones too)."""
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k))
