"""What an oracle driver is handed: draws from the secret seed, and calls (sandbox side).

Imported only inside an oracle worker (``_oracle_worker.py``), never by the
checker. A driver (``specs/<stage>/<stage>_oracle.py``, maintainer-owned) is a
function ``calls(o: Oracle) -> None`` that builds the stage's objects through
its public API, draws weights and inputs with ``o`` and hands every call to
``o.call``. The kit runs the call, turns what it returned into frames (a
JSON header, then the tensors as one safetensors blob) and writes them to
the worker's pipe; it decides nothing. The trusted checker compares the
frames with the same calls on the base's code (or the spec's float64
reference).

Draws are keyed by ``(seed, stage, tag)``: the head's and the base's workers
draw the same numbers for the same tag whatever else either of them drew.
Before each call the global torch generator is seeded from the secret
seed, the stage and the call's ``rng`` tag (by default one tag for the whole
stage): a random-looking 63-bit ``torch.initial_seed()`` as in a user's fresh
process, unknown to the code under test, the same on the head's and the
base's side. Two calls that must agree under dropout (an invariant) draw the
same masks; whether a call drew from the generator is reported and compared
with the base's (``_oracle_aftermath``; dropout outputs themselves are not
compared across implementations).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import random
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import torch
from safetensors.numpy import save as save_arrays

WIDE = (torch.bfloat16, torch.float16)  # sent as float32 (exact): numpy has no bfloat16
Ref = tuple[str, str, tuple[tuple[int, int, int], ...]]  # (call, output key, slices)


def _key(seed: int, *parts: str) -> int:
    digest = hashlib.sha256("\0".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class Frames:
    """Length-prefixed frames on a binary pipe: a JSON header, then the payloads.

    A call's payload is one safetensors blob of its tensors (``encode``); the
    header says how many bytes it has and each tensor's torch dtype.
    """

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def write(self, header: Mapping[str, Any], payloads: Sequence[bytes] = ()) -> None:
        head = json.dumps(header, separators=(",", ":")).encode()
        self.out.write(struct.pack(">I", len(head)) + head)
        for blob in payloads:
            self.out.write(blob)
        self.out.flush()


def _flatten(
    value: Any, prefix: str, tensors: dict[str, torch.Tensor], plain: dict[str, Any]
) -> None:
    if isinstance(value, torch.Tensor):
        tensors[prefix or "out"] = value
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), tensors, plain)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}.{i}" if prefix else str(i), tensors, plain)
    elif value is None or isinstance(value, (bool, int, float, str)):
        plain[prefix or "out"] = value
    else:
        plain[prefix or "out"] = f"<{type(value).__name__}>"


def encode(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], bytes]:
    """``tensors`` as one safetensors blob, and the header entry that names them.

    The entry is ``{"dtypes": {key: torch dtype name}, "nbytes": len(blob)}``.
    bfloat16 and float16 travel as float32 (exact: numpy, which the checker
    reads with, has no bfloat16) and bool as uint8; every other dtype as it is.
    Arrays go through ``safetensors.numpy``, which, unlike its torch side,
    accepts outputs that share storage (a tuple holding one tensor twice).
    """
    dtypes: dict[str, str] = {}
    arrays: dict[str, Any] = {}
    for key, tensor in tensors.items():
        t = tensor.detach().cpu()
        dtypes[key] = str(t.dtype).removeprefix("torch.")
        wire = t.float() if t.dtype in WIDE else t.to(torch.uint8) if t.dtype == torch.bool else t
        arrays[key] = wire.contiguous().numpy()
    blob = save_arrays(arrays)
    return {"dtypes": dtypes, "nbytes": len(blob)}, blob


class Oracle:
    """The handle a driver gets: ``seed``-keyed draws and ``call``."""

    def __init__(
        self,
        stage: str,
        seed: int,
        frames: Frames,
        *,
        run: Callable[[str], bool],
        watch: Mapping[str, bool],
    ) -> None:
        self.stage = stage
        self.seed = seed
        self._frames = frames
        self._run = run  # whether this worker computes a call of this name
        self._watch = dict(watch)  # runtime rule id -> also record casts
        self._index = 0
        self._name = ""
        self.labels: dict[str, str] = {}  # profiler label -> call name, watched calls only
        self.profiler: Any = None  # the worker's profiler session, when calls are watched
        self.capture: Any = None  # a capture run: _oracle_capture.capture, sent before each call
        self.after: Any = None  # the worker's _oracle_aftermath.Aftermath, if any

    # --- draws ---------------------------------------------------------------
    def rng(self, tag: str) -> random.Random:
        """A ``random.Random`` for ``tag``: the same numbers on both sides."""
        return random.Random(_key(self.seed, self.stage, "rng", tag))

    def generator(self, tag: str) -> torch.Generator:
        """A CPU ``torch.Generator`` for ``tag``."""
        return torch.Generator().manual_seed(_key(self.seed, self.stage, "gen", tag))

    def randn(self, *shape: int, tag: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Standard normal draws of ``shape`` (drawn in float64, then cast)."""
        g = self.generator(tag)
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # shape

    def randint(self, high: int, *shape: int, tag: str) -> torch.Tensor:
        """int64 draws in ``[0, high)`` of ``shape``."""
        return torch.randint(0, high, shape, generator=self.generator(tag))  # shape, int64

    def load_weights(self, module: torch.nn.Module, tag: str, scale: float | None = None) -> None:
        """Every entry of ``module.state_dict()`` drawn from ``tag``, set by name (strict).

        2-D and larger weights are N(0, s^2) with ``s = scale`` or ``1/sqrt(fan_in)``;
        1-D ``*weight`` entries (norm gains) ``1 + 0.1 N(0, 1)``, other 1-D entries
        (biases) ``0.1 N(0, 1)``. Entries that share storage (tied weights) get the
        value drawn for the first of their names in sorted order, so the loading
        order of either side does not matter.
        """
        state = module.state_dict()
        drawn: dict[str, torch.Tensor] = {}
        first: dict[tuple[int, int], torch.Tensor] = {}
        for name in sorted(state):
            ref = state[name]
            if not ref.is_floating_point():
                drawn[name] = ref
                continue
            where = (ref.untyped_storage().data_ptr(), ref.storage_offset())
            if where in first:
                drawn[name] = first[where]
                continue
            z = self.randn(*ref.shape, tag=f"{tag}/{name}")  # ref.shape, float64
            if ref.dim() >= 2:
                s = scale if scale is not None else 1.0 / max(1, ref.shape[-1]) ** 0.5
                value = z * s
            elif name.endswith("weight"):
                value = 1.0 + 0.1 * z
            else:
                value = 0.1 * z
            drawn[name] = first[where] = value.to(ref.dtype)
        module.load_state_dict(drawn, strict=True)

    # --- invariants -----------------------------------------------------------
    # ``says``: what the relation means, in words a failing verdict prints first.
    @staticmethod
    def equal(lhs: Ref, rhs: Ref, says: str = "") -> dict[str, Any]:
        """Relation: two slices (of this or earlier calls) agree within the tolerance.

        A ``Ref`` is ``(call name, output key, ((dim, start, stop), ...))``.
        """
        return {"kind": "equal", "lhs": _ref(lhs), "rhs": _ref(rhs), "says": says}

    @staticmethod
    def zero(ref: Ref, says: str = "") -> dict[str, Any]:
        """Relation: every value of the slice is exactly zero (padded positions' logits)."""
        return {"kind": "zero", "lhs": _ref(ref), "says": says}

    @staticmethod
    def upper_zero(ref: Ref, says: str = "") -> dict[str, Any]:
        """Relation: above the diagonal of the last two dims the slice is exactly zero."""
        return {"kind": "upper_zero", "lhs": _ref(ref), "says": says}

    # --- calls ---------------------------------------------------------------
    def wants(self, name: str) -> bool:
        """Whether this worker computes the call ``name`` (skip building its inputs if not)."""
        return self._run(name)

    def call(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        desc: str,
        stages: int,
        reduction: int,
        rng: str = "",
        rules: Sequence[str] = (),
        relations: Sequence[Mapping[str, Any]] = (),
        compare: Sequence[str] | None = None,
        computes_in: torch.dtype | None = None,
        axes: Sequence[str] = (),
    ) -> None:
        """Run ``fn()`` and send what it returned (or the exception it raised).

        The global generator starts from a state keyed by ``rng`` (default: the
        stage's one tag, so every call draws the same dropout masks). With
        ``self.after`` set, what the call left behind goes along (``after``).

        ``name`` is unique within the stage; ``desc`` says what the inputs were
        (shown in a verdict); ``stages`` and ``reduction`` size the dtype-derived
        tolerance (rounding stages on the way to the outputs, the longest sum);
        ``rules`` are the runtime rule ids this call falls under (its ATen ops
        are recorded); ``relations`` are invariants over this and earlier calls
        (``equal``, ``upper_zero``), checked by the trusted side; ``compare``
        names the outputs compared across implementations (default: all; train
        mode with dropout compares only what dropout does not touch);
        ``computes_in`` is the dtype the arithmetic runs in when it is narrower
        than an output's (bfloat16 autocast returns float32 probabilities
        computed from bfloat16 products): the bound then uses its ``eps``;
        ``axes`` are the spec's domain axes this call sweeps (``checks/evidence/coverage``).
        """
        if not self._run(name):
            return
        self._index += 1
        self._name = name
        if self.capture is not None:
            self.capture(self._frames, encode, self.stage, name, fn)
        torch.default_generator.manual_seed(_key(self.seed, self.stage, "global", rng))
        header: dict[str, Any] = {
            "kind": "call",
            "stage": self.stage,
            "call": name,
            "desc": desc,
            "stages": stages,
            "reduction": reduction,
            "rules": sorted(set(rules)),
            "relations": [dict(r) for r in relations],
            "compare": None if compare is None else list(compare),
            "computes_in": None if computes_in is None else str(computes_in).removeprefix("torch."),
            "error": None,
            "axes": sorted(set(axes)),
        }
        casts: list[str] = []
        tensors: dict[str, torch.Tensor] = {}
        plain: dict[str, Any] = {}
        probe = self.after.begin(name, fn) if self.after is not None else None
        try:
            counting = probe.counting() if probe is not None else contextlib.nullcontext()
            with self._watched(sorted(set(rules) & set(self._watch)), casts), counting:
                value = fn()
            _flatten(value, "", tensors, plain)
        except Exception as err:  # the exception is the call's answer
            header["error"] = type(err).__name__
            header["message"] = str(err)[:300]
        if probe is not None:
            header["after"] = self.after.end(name, probe, tensors)
        header["casts"] = casts
        header["values"] = plain
        header["tensors"], blob = encode(tensors)
        self._frames.write(header, [blob])

    def held(self, name: str, *objects: Any, desc: str) -> None:
        """Report the bytes of storage ``objects`` keep alive (modules, caches) as ``name``.

        Compared with the base's figure for the same name (``oracle.memory``).
        """
        if self.after is None or not self._run(name):
            return
        size = self.after.held(*objects)
        self._frames.write({"kind": "held", "stage": self.stage, "call": name, "desc": desc,
                            "bytes": size})  # fmt: skip

    @contextlib.contextmanager
    def _watched(self, rules: list[str], casts: list[str]) -> Iterator[None]:
        if not rules:
            yield
            return
        label = f"oracle-call#{self.stage}#{self._index}"
        self.labels[label] = self._name
        spy = cast_spy(casts) if any(self._watch[r] for r in rules) else contextlib.nullcontext()
        cpu = [torch.profiler.ProfilerActivity.CPU]
        if self.profiler is not None:  # collection is on only inside watched calls
            self.profiler.toggle_collection_dynamic(True, cpu)
        try:
            with torch.profiler.record_function(label), spy:
                yield
        finally:
            if self.profiler is not None:
                self.profiler.toggle_collection_dynamic(False, cpu)


def _describe(tensor: Any) -> str:
    return f"{tensor.dtype}@{tensor.device}"


def cast_spy(casts: list[str]) -> contextlib.AbstractContextManager[Any]:
    """A dispatch mode that appends a line to ``casts`` for each copy that changes
    dtype or device (``aten::copy_``, ``aten::_to_copy``); the copy itself runs.
    Watched calls use it here; the runtime-rule probe (``_runtime_probe``) loads
    this file for it too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CastSpy(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            name = func._schema.name
            if name == "aten::copy_" and len(args) >= 2:
                dst, src = args[0], args[1]
                if (dst.dtype, dst.device) != (src.dtype, src.device):
                    casts.append(f"aten::copy_ {_describe(src)} -> {_describe(dst)}")
            elif name == "aten::_to_copy" and args:
                src = args[0]
                dtype = kwargs.get("dtype") or src.dtype
                device = kwargs.get("device") or src.device
                if (dtype, str(device)) != (src.dtype, str(src.device)):
                    casts.append(f"aten::_to_copy {_describe(src)} -> {dtype}@{device}")
            return func(*args, **kwargs)

    return CastSpy()  # type: ignore[no-untyped-call]


def _ref(ref: Ref) -> list[Any]:
    call, key, slices = ref
    return [call, key, [list(s) for s in slices]]


def matches(patterns: Sequence[str], name: str) -> bool:
    """Whether ``name`` matches one of the fnmatch ``patterns``."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
