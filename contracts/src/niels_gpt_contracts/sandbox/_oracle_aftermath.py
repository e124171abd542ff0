"""What an oracle call leaves behind, and what it cost (sandbox side).

Loaded by the oracle worker next to ``_oracle_kit`` and handed to each
``Oracle`` as ``oracle.after``; it measures, it decides nothing. For every
call it adds to the call's frame, under ``"after"``:

- ``inputs``: ``{"checked": [...], "changed": [...]}``, the names of the
  argument tensors hashed before and after the call and those whose bytes
  changed. The arguments are those of ``fn`` (through ``functools.partial``
  layers: positional ``argN``, keyword ``kw:NAME``, one level into lists,
  tuples and dicts; a closure's cells ``cellN``) and a bound module's; a
  module contributes its parameters and buffers as ``WHERE:NAME``;
- ``clobbered``: ``"call/key"`` of the outputs of the previous
  ``KEEP`` calls whose bytes changed during this call (outputs over
  ``MAX_BYTES`` are not kept: ``skipped`` counts them);
- ``state``: the global state after the call (grad and inference mode,
  default dtype, whether the thread count changed, deterministic algorithms,
  CPU autocast, a digest of the global CPU generator's state), and on the
  calls whose cost is counted, ``globals``: the names of every torch global
  (``_protocol_state``: compiler stance and configs, backend flags, getters,
  global hooks) the call left changed;
- ``flops`` and ``ops``: FLOPs (``torch.utils.flop_counter``'s registry) and the number of ATen
  ops dispatched during the call (``None`` where the call was not counted).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

KEEP = 2  # earlier calls whose outputs are re-digested after each call
MAX_BYTES = 16 << 20  # larger tensors are neither kept nor hashed


def digest(t: torch.Tensor) -> str | None:
    """A digest of ``t``'s bytes (any shape), or None when it is too large or unreadable."""
    try:
        if t.numel() * t.element_size() > MAX_BYTES or t.is_sparse or t.is_complex():
            return None
        flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # (nbytes,)
        return hashlib.blake2b(flat.numpy().tobytes(), digest_size=16).hexdigest()
    except (RuntimeError, TypeError, ValueError):
        return None


def _module(where: str, m: torch.nn.Module, found: dict[str, torch.Tensor]) -> None:
    for name, t in (*m.named_parameters(), *m.named_buffers()):
        found.setdefault(f"{where}:{name}", t)


def _add(where: str, value: Any, found: dict[str, torch.Tensor], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        found.setdefault(where, value)
    elif isinstance(value, torch.nn.Module):
        _module(where, value, found)
    elif depth == 0 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _add(f"{where}.{i}", item, found, 1)
    elif depth == 0 and isinstance(value, Mapping):
        for k, item in value.items():
            _add(f"{where}.{k}", item, found, 1)


def arguments(fn: Callable[[], Any]) -> dict[str, torch.Tensor]:
    """The tensors ``fn`` was handed, by name (see the module's docstring)."""
    found: dict[str, torch.Tensor] = {}
    depth = 0
    while isinstance(fn, functools.partial):
        for i, a in enumerate(fn.args):
            _add(f"arg{i}" if depth == 0 else f"p{depth}.arg{i}", a, found)
        for k, a in fn.keywords.items():
            _add(f"kw:{k}", a, found)
        fn, depth = fn.func, depth + 1
    if isinstance(fn, torch.nn.Module):
        _module("fn", fn, found)
    bound = getattr(fn, "__self__", None)
    if isinstance(bound, torch.nn.Module):
        _module("self", bound, found)
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        with contextlib.suppress(ValueError):  # an empty cell
            _add(f"cell{i}", cell.cell_contents, found)
    return found


def state() -> dict[str, Any]:
    """The global state a call may leave changed (the thread count is added by ``Probe``)."""
    rng = torch.get_rng_state()  # (5056,) uint8
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "autocast": [torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu"))],
        "rng": hashlib.blake2b(rng.numpy().tobytes(), digest_size=16).hexdigest(),
    }


def _counter() -> Any:
    """A dispatch mode counting the ATen ops dispatched inside and their FLOPs.

    The FLOPs come from ``torch.utils.flop_counter``'s own registry (what
    ``FlopCounterMode`` sums); ``FlopCounterMode`` itself is not used: its
    module tracker makes ``torch.autograd.grad`` on a module raise (torch
    2.13: "A leaf node was passed to _will_engine_execute_node"), so every
    counted Hessian-vector product would fail alike on both sides and judge
    nothing.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Count(TorchDispatchMode):  # type: ignore[no-untyped-call]
        n = 0
        flops = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            self.n += 1
            out = func(*args, **kwargs)
            counter = flop_registry.get(func._overloadpacket)
            if counter is not None:
                self.flops += int(counter(*args, **kwargs, out_val=out))
            return out

    return Count()  # type: ignore[no-untyped-call]


@functools.cache
def _globals() -> Any:
    """``_protocol_state`` (beside this file): every torch global, enumerated."""
    path = Path(__file__).with_name("_protocol_state.py")
    spec = importlib.util.spec_from_file_location("_protocol_state", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Globals the state above already names (the generator as rng_moved, the threads).
COVERED = frozenset({"torch.get_rng_state", "torch.get_num_threads"})


class Probe:
    """One call's measurements: made by ``Aftermath.begin`` before the call runs."""

    def __init__(self, fn: Callable[[], Any], count: bool) -> None:
        self.inputs = arguments(fn)
        self.before = {k: digest(t) for k, t in self.inputs.items()}
        self.threads = torch.get_num_threads()
        self.rng = state()["rng"]  # the generator's digest as the call starts
        self.count = count
        # every torch global on the counted calls (a snapshot costs about 10 ms)
        self.globals = _globals().snapshot() if count else None
        self.flops: int | None = None
        self.ops: int | None = None

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count FLOPs and dispatched ops inside (when this call is counted)."""
        if not self.count:
            yield
            return
        ops = _counter()
        try:
            with ops:
                yield
        finally:
            self.flops, self.ops = int(ops.flops), int(ops.n)


class Aftermath:
    """Per-driver memory of the last calls' outputs; ``begin``/``end`` around each call."""

    def __init__(self, count: Callable[[str], bool]) -> None:
        self._count = count  # whether a call's cost is counted
        self._kept: list[tuple[str, dict[str, tuple[torch.Tensor, str]]]] = []
        self.skipped = 0

    def held(self, *objects: Any) -> int:
        """``held_bytes`` of ``objects``."""
        return held_bytes(*objects)

    @staticmethod
    def _state_after(probe: Probe) -> dict[str, Any]:
        now = state()
        now["threads"] = torch.get_num_threads() == probe.threads
        now["rng_moved"] = now["rng"] != probe.rng  # drew from the global generator at all
        if probe.globals is not None:
            moved = _globals().changed(probe.globals, _globals().snapshot())
            now["globals"] = [k for k in moved if k not in COVERED]
        return now

    def begin(self, name: str, fn: Callable[[], Any]) -> Probe:
        """Hash ``fn``'s argument tensors; call just before ``fn()``."""
        return Probe(fn, self._count(name))

    def end(self, name: str, probe: Probe, outputs: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """What the call left behind (the frame's ``after``); call right after ``fn()``."""
        checked = sorted(k for k, d in probe.before.items() if d is not None)
        changed = [k for k in checked if digest(probe.inputs[k]) != probe.before[k]]
        clobbered: list[str] = []
        for call, outs in self._kept:
            for key, (t, d) in outs.items():
                now = digest(t)
                if now != d:
                    clobbered.append(f"{call}/{key}")
                    outs[key] = (t, now if now is not None else d)  # reported once
        mine: dict[str, tuple[torch.Tensor, str]] = {}
        for key, t in outputs.items():
            sealed = digest(t)
            if sealed is None:
                self.skipped += 1
            else:
                mine[key] = (t, sealed)
        self._kept = [*self._kept, (name, mine)][-KEEP:]
        return {
            "inputs": {"checked": checked, "changed": changed},
            "clobbered": clobbered,
            "skipped": self.skipped,
            "state": self._state_after(probe),
            "flops": probe.flops,
            "ops": probe.ops,
        }


def held_bytes(*objects: Any) -> int:
    """Bytes of the distinct storages held by ``objects``: tensors; a module's
    parameters and buffers, and the tensors among its (and its submodules')
    other attributes; an object's tensor attributes; lists, tuples and dicts of
    these, a few levels deep."""
    seen: dict[int, int] = {}

    def walk(obj: Any, depth: int) -> None:
        if depth > 3:
            return
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, depth + 1)
        elif isinstance(obj, Mapping):
            for item in obj.values():
                walk(item, depth + 1)
        elif isinstance(obj, torch.nn.Module):
            for t in (*obj.parameters(), *obj.buffers()):
                walk(t, depth)
            for m in obj.modules():
                for k, value in vars(m).items():
                    if k not in ("_parameters", "_buffers", "_modules"):
                        walk(value, depth + 1)
        elif depth <= 1:  # a plain object (a cache): its attributes
            for value in getattr(obj, "__dict__", {}).values():
                walk(value, depth + 1)

    for obj in objects:
        walk(obj, 0)
    return sum(seen.values())
