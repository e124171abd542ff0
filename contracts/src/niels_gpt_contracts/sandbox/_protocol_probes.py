"""What every ``nn.Module`` promises, measured on one tree's classes (sandbox side).

Loaded by ``_protocol_worker`` from the file beside it (the worker runs as
``python -I <file>``, so the checker is not a package it can import); it
measures, it decides nothing: the trusted side (``verdict.protocol``)
compares the PR's figures with the base's. For one module class and one
configuration, ``Probe.run`` builds an instance and records:

- ``schema``: its ``state_dict`` (key -> shape, dtype), persistent and
  non-persistent buffers;
- ``subject`` outputs: the instance with its own weights, perturbed off its
  init from the seed, in eval mode without grad; or, given weights (the
  base's, on the PR's side), ``loaded`` outputs with those, and ``load``, the
  error of a strict ``load_state_dict`` of them;
- ``trips``: the same outputs after ``pickle``, ``torch.save``/``torch.load``
  of the whole module, ``copy.deepcopy`` before and after a grad-enabled
  forward, or the error each raised;
- ``hooks``: how often forward pre-hooks and hooks on every submodule fired
  over one forward and one backward;
- ``init``: per parameter, its size, mean and std under one seed and whether
  another seed changed it; the pairs of same-shaped parameters that start
  equal;
- ``state``: the globals (``_protocol_state``) each step left changed;
- ``memory``: bytes of tensor storage alive after 1 and 20 calls and after a
  backward, beyond what was alive before the module was built (outputs
  released, the garbage collected);
- ``compile``: the graphs and graph breaks of one ``torch.compile`` of the
  forward, and the frames two more same-shaped calls recompile.

``decode_probe`` measures a decoder (a function taking ``compile_step``, e.g.
``kv_cache.generate``) the same way: greedy ids with eager steps, then twice
with its steps compiled by a counting backend registered under a name drawn
from the seed, the graphs the first call made and the frames the second
added, and the globals each step left changed.

``Probe.outputs`` collects the tensors to send, keyed ``label|size|what|out.N``.
"""

from __future__ import annotations

import copy
import gc
import inspect
import io
import itertools
import pickle
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

STEPS = 20  # calls before the second memory figure
CONFIG_NAMES = ("cfg", "config")
WIDTH_NAMES = ("dim", "in_features", "n_embd", "embed_dim", "hidden_size")


def why(err: BaseException) -> str:
    return traceback.format_exception_only(err)[-1].strip()[:300]


def tensors(value: Any, where: str = "out") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a forward's answer (tuples, lists, dicts), by path."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, f"{where}.{i}")
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from tensors(value[k], f"{where}.{k}")


def _storages() -> dict[int, int]:
    """``{data pointer: bytes}`` of the CPU storages of every live tensor, after a collection.

    ``issubclass(type(obj), ...)`` rather than ``isinstance``: the latter reads
    ``__class__``, which some of torch's deprecated stand-ins answer with a warning.
    """
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):
            try:
                storage = obj.untyped_storage()
                seen.setdefault(storage.data_ptr(), storage.nbytes())
            except (RuntimeError, NotImplementedError):  # sparse, meta or other storage-less
                continue
    return seen


def live_storages() -> set[int]:
    return set(_storages())


def held_bytes(before: set[int]) -> int:
    """Bytes of the distinct storages of live tensors not in ``before`` (data pointers)."""
    return sum(n for ptr, n in _storages().items() if ptr not in before and ptr != 0)


def noted_step(
    report: dict[str, Any],
    name: str,
    snapshot: Callable[[], dict[str, str]],
    changed: Callable[[dict[str, str], dict[str, str]], list[str]],
    fn: Callable[[], Any],
) -> Any:
    """Run ``fn``, adding the globals it left changed to ``report["state"][name]``
    (each once, over every run of that step); re-raises what ``fn`` raised."""
    before = snapshot()
    try:
        return fn()
    finally:
        moved = changed(before, snapshot())
        if moved:
            noted = report.setdefault("state", {}).setdefault(name, [])
            noted += [m for m in moved if m not in noted]


@dataclass
class Size:
    """One configuration: ``ModelConfig`` fields, the input's ``B``, ``T`` and a row count."""

    name: str
    cfg: dict[str, Any]
    B: int
    T: int
    rows: int  # out_features for a layer built from widths alone


def build(cls: type[nn.Module], size: Size, config_type: type) -> nn.Module:
    """An instance of ``cls`` from its signature: the config where it takes one,
    widths from the config, defaults elsewhere.

    Raises:
        TypeError: a required parameter this probe cannot fill.
    """
    cfg = config_type(**size.cfg)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in list(inspect.signature(cls).parameters.values()):
        annotation = str(p.annotation)
        if "ModelConfig" in annotation or p.name in CONFIG_NAMES:
            value: Any = cfg
        elif p.name in WIDTH_NAMES:
            value = cfg.C
        elif p.name == "out_features":
            value = size.rows
        elif p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        else:
            raise TypeError(f"no value for the required parameter {p.name!r}")
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def perturb(module: nn.Module, gen: torch.Generator) -> None:
    """Move every ``state_dict`` tensor off its init, from ``gen`` (shared tensors once).

    Non-persistent buffers (tables derived from the config) stay as built: a
    checkpoint does not carry them, so the other side must build the same.
    """
    seen: set[int] = set()
    with torch.no_grad():
        for t in module.state_dict(keep_vars=True).values():
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.is_floating_point():
                t.add_(0.05 * torch.randn(t.shape, generator=gen, dtype=t.dtype))  # t's shape
            elif t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
                t.copy_(torch.randint(-100, 101, t.shape, generator=gen))  # t's shape


def inputs(size: Size, gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """The inputs a module of this project takes, in the order tried: features, then tokens."""
    cfg = size.cfg
    feats = torch.randn(size.B, size.T, cfg["C"], generator=gen)  # (B, T, C)
    ids = torch.randint(0, cfg["V"], (size.B, size.T), generator=gen)  # (B, T) int64
    return [
        (f"features (B, T, C) = {tuple(feats.shape)}", feats),
        (f"tokens (B, T) = {tuple(ids.shape)}", ids),
    ]


@dataclass
class Probe:
    """The measurements of one class at one size (see the module docstring)."""

    label: str
    cls: type[nn.Module]
    size: Size
    config_type: type
    seed: int
    snapshot: Callable[[], dict[str, str]]
    changed: Callable[[dict[str, str], dict[str, str]], list[str]]
    given: dict[str, torch.Tensor] | None = None
    full: bool = True  # False: the subject's outputs alone (real sizes)
    report: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # what the subject holds

    def _key(self, what: str, where: str) -> str:
        return f"{self.label}|{self.size.name}|{what}|{where}"

    def _gen(self, salt: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 1_000_003 + salt) % (2**63))

    def _step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``, noting the globals it changed under ``state[name]``; re-raises."""
        return noted_step(self.report, name, self.snapshot, self.changed, fn)

    def _new(self) -> nn.Module:
        torch.manual_seed(self._gen(1).initial_seed())
        return build(self.cls, self.size, self.config_type)

    def _built(self) -> nn.Module:
        """``_new`` with the globals its build changed noted (the seeding is ours)."""
        torch.manual_seed(self._gen(1).initial_seed())
        built: nn.Module = self._step("build", lambda: build(self.cls, self.size, self.config_type))
        return built

    def _forward(self, module: nn.Module, x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        module.eval()
        with torch.no_grad():
            return list(tensors(module(x)))

    def _keep(self, what: str, found: list[tuple[str, torch.Tensor]]) -> None:
        for where, t in found:
            self.outputs[self._key(what, where)] = t.detach().clone().contiguous()

    def run(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        try:
            subject = self._built()
        except Exception as err:
            self.report["build"] = why(err)
            return self.report, self.outputs
        self.report["build"] = None
        self._schema(subject)
        if self.given is not None:
            try:
                subject.load_state_dict(self.given, strict=True)
                self.report["load"] = None
            except Exception as err:
                self.report["load"] = why(err)
                return self.report, self.outputs
            self.weights = self.given
        else:
            perturb(subject, self._gen(2))
            sd = subject.state_dict()
            self.weights = {k: v.detach().clone().contiguous() for k, v in sd.items()}
        x = self._input(subject)
        if x is None:
            return self.report, self.outputs
        what = "subject" if self.given is None else "loaded"
        self._keep(what, self._step("forward", lambda: self._forward(subject, x)))
        if self.full:
            self._trips(subject, x)
            self._hooks(x)
            self._init()
            self._memory(x)
            self._compile(subject, x)
        return self.report, self.outputs

    def _schema(self, m: nn.Module) -> None:
        sd = m.state_dict()
        buffers = {n for n, _ in m.named_buffers()}
        self.report["schema"] = {k: [list(v.shape), str(v.dtype)] for k, v in sd.items()}
        self.report["persistent"] = sorted(b for b in buffers if b in sd)
        self.report["nonpersistent"] = sorted(b for b in buffers if b not in sd)

    def _input(self, m: nn.Module) -> torch.Tensor | None:
        """The first input kind the module answers; None (and the errors) when none."""
        errors = []
        for text, x in inputs(self.size, self._gen(3)):
            try:
                self._step("forward", lambda: self._forward(m, x))  # noqa: B023 (called at once)
            except Exception as err:
                errors.append(f"{text}: {why(err)}")
                continue
            self.report["input"] = text
            return x
        self.report["input"] = None
        self.report["input_errors"] = errors
        return None

    def _trips(self, m: nn.Module, x: torch.Tensor) -> None:
        def pickled() -> nn.Module:
            twin: nn.Module = pickle.loads(pickle.dumps(m))
            return twin

        def saved() -> nn.Module:
            buf = io.BytesIO()
            torch.save(m, buf)
            buf.seek(0)
            twin: nn.Module = torch.load(buf, weights_only=False)
            return twin

        def after_grad() -> nn.Module:
            m.eval()
            with torch.enable_grad():
                found = list(tensors(m(x)))
                loss = sum(t.float().sum() for _, t in found if t.requires_grad)
                if isinstance(loss, torch.Tensor):
                    torch.autograd.backward(loss)
            copied = copy.deepcopy(m)
            m.zero_grad(set_to_none=True)
            return copied

        trips: dict[str, str | None] = {}
        for name, make in (
            ("pickle", pickled),
            ("torch.save", saved),
            ("deepcopy", lambda: copy.deepcopy(m)),
            ("deepcopy after a grad forward", after_grad),
        ):
            try:
                twin = self._step(name, make)
                self._keep(f"trip:{name}", self._forward(twin, x))
                trips[name] = None
            except Exception as err:
                trips[name] = why(err)
        self.report["trips"] = trips

    def _hooks(self, x: torch.Tensor) -> None:
        m = self._new()
        counts: dict[str, list[int]] = {}
        handles = []
        for name, sub in m.named_modules():
            key = name or "<root>"
            counts[key] = [0, 0]

            def pre(_mod: nn.Module, _args: Any, key: str = key) -> None:
                counts[key][0] += 1

            def post(_mod: nn.Module, _args: Any, _out: Any, key: str = key) -> None:
                counts[key][1] += 1

            handles += [sub.register_forward_pre_hook(pre), sub.register_forward_hook(post)]
        try:
            m.eval()
            found = list(tensors(m(x)))
            loss = sum(t.float().sum() for _, t in found if t.requires_grad)
            if isinstance(loss, torch.Tensor):
                self._step("backward", lambda: torch.autograd.backward(loss))
            self.report["hooks"] = counts
        except Exception as err:
            self.report["hooks"] = why(err)
        for h in handles:
            h.remove()

    def _init(self) -> None:
        torch.manual_seed(self._gen(4).initial_seed())
        first = build(self.cls, self.size, self.config_type)
        torch.manual_seed(self._gen(5).initial_seed())
        second = dict(build(self.cls, self.size, self.config_type).named_parameters())
        params: dict[str, Any] = {}
        named = list(first.named_parameters())
        for name, p in named:
            v = p.detach().double()  # p's shape
            params[name] = {
                "n": v.numel(),
                "mean": float(v.mean()) if v.numel() else 0.0,
                "std": float(v.std(unbiased=False)) if v.numel() else 0.0,
                "seeded": not torch.equal(p.detach(), second[name].detach()),
            }
        equal = [
            [a, b]
            for i, (a, pa) in enumerate(named)
            for b, pb in named[i + 1 :]
            if pa.shape == pb.shape and pa.numel() > 1 and torch.equal(pa.detach(), pb.detach())
        ]
        self.report["init"] = {"params": params, "equal": equal}

    def _memory(self, x: torch.Tensor) -> None:
        before = live_storages()
        m = self._new()
        m.load_state_dict(self.weights, strict=True)
        figures: dict[str, int] = {}
        try:
            self._forward(m, x)
            figures["1"] = held_bytes(before)
            for _ in range(STEPS - 1):
                self._forward(m, x)
            figures[str(STEPS)] = held_bytes(before)
            m.eval()
            found = list(tensors(m(x)))
            loss = sum(t.float().sum() for _, t in found if t.requires_grad)
            del found
            if isinstance(loss, torch.Tensor):
                torch.autograd.backward(loss)
            del loss
            m.zero_grad(set_to_none=True)
            figures["backward"] = held_bytes(before)
            self.report["memory"] = figures
        except Exception as err:
            self.report["memory"] = why(err)

    def _compile(self, m: nn.Module, x: torch.Tensor) -> None:
        """One ``torch.compile`` with a frame counter, in eval mode without grad.

        The first call's frames are the graphs (a graph break makes two, and
        ``fullgraph=True`` would raise); the frames two more calls of the same
        shape add are recompiles. The break reasons come from dynamo's counters.
        """
        import torch._dynamo
        from torch._dynamo.testing import CompileCounter
        from torch._dynamo.utils import counters

        found: dict[str, Any] = {}
        m.eval()
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        compiled = torch.compile(m, backend=counter, dynamic=False)
        gen = self._gen(6)
        try:
            with torch.no_grad():
                self._step("compile", lambda: compiled(x))
                found["graphs"] = counter.frame_count
                found["breaks"] = sum(counters["graph_break"].values())
                found["reasons"] = sorted(str(r)[:200] for r in counters["graph_break"])[:3]
                for _ in range(2):
                    y = x if not x.is_floating_point() else torch.randn(x.shape, generator=gen)
                    compiled(y)
                found["frames"] = counter.frame_count
        except Exception as err:
            found["error"] = why(err)
        torch._dynamo.reset()
        self.report["compile"] = found


DECODE_NEW = 4  # tokens a decoder probe generates
_BACKENDS = itertools.count()  # backends this process registered


def _bind(fn: Callable[..., Any], model: nn.Module, ids: torch.Tensor, new: int) -> dict[str, Any]:
    """Keyword arguments for ``fn(model, ids, ...)``: the model and the prompt first,
    ``max_new_tokens``, greedy where it takes a temperature, ``None`` for a mask.

    Raises:
        TypeError: a required parameter this probe cannot fill.
    """
    found: dict[str, Any] = {}
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        if i == 0:
            found[p.name] = model
        elif i == 1:
            found[p.name] = ids
        elif p.name == "max_new_tokens":
            found[p.name] = new
        elif p.name == "temperature":
            found[p.name] = 0.0  # the argmax: no draw, the same ids on both sides
        elif "mask" in p.name and p.default is p.empty:
            found[p.name] = None
        elif p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"no value for the decoder's required parameter {p.name!r}")
    return found


def decode_probe(
    fn: Callable[..., Any],
    model_cls: type[nn.Module],
    size: Size,
    config_type: type,
    seed: int,
    snapshot: Callable[[], dict[str, str]],
    changed: Callable[[dict[str, str], dict[str, str]], list[str]],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One decoder at one size: ``(report, outputs)``, outputs keyed ``eager`` and ``compiled``.

    The report holds ``build`` (None or why the model or the call could not be
    set up), ``decode``: ``{"graphs", "frames"}`` or ``{"error"}``, and
    ``state``: per step, the globals it left changed.
    """
    import torch._dynamo
    from torch._dynamo import register_backend
    from torch._dynamo.testing import CompileCounter

    report: dict[str, Any] = {"build": None}
    outputs: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(seed % (2**63))
    try:
        torch.manual_seed(seed % (2**63))
        model = build(model_cls, size, config_type)
        perturb(model, gen)
        model.eval()
        T = int(size.cfg["T"])
        new = min(DECODE_NEW, T - 1)
        t = max(1, min(size.T, T - new))
        ids = torch.randint(0, size.cfg["V"], (size.B, t), generator=gen)  # (B, t) int64
        kwargs = _bind(fn, model, ids, new)
    except Exception as err:
        report["build"] = why(err)
        return report, outputs
    counter = CompileCounter()  # counts the frames, runs each traced graph eagerly
    name = f"protocol_{seed % (1 << 32):08x}_{next(_BACKENDS)}"  # dynamo refuses a name twice
    register_backend(counter, name=name)

    def call(step: str, compile_step: bool | str) -> Any:
        return noted_step(
            report, step, snapshot, changed, lambda: fn(**kwargs, compile_step=compile_step)
        )

    torch._dynamo.reset()
    try:
        for where, t_ in tensors(call("decode-eager", False)):
            outputs[f"eager|{where}"] = t_.detach().clone().contiguous()
        got = call("decode-compiled", name)
        graphs = counter.frame_count
        call("decode-compiled", name)
        report["decode"] = {"graphs": graphs, "frames": counter.frame_count}
        for where, t_ in tensors(got):
            outputs[f"compiled|{where}"] = t_.detach().clone().contiguous()
    except Exception as err:
        report["decode"] = {"error": why(err)}
    torch._dynamo.reset()
    return report, outputs
