"""The maintainers' oracle sweeps: what several stages' ``domain/...`` drivers share.

An oracle driver loads this file by path, from one folder up::

    where = Path(__file__).parents[1] / "_kit" / "speckit_sweeps.py"

It imports torch and nothing else at run time: the oracle worker is meant to
look like a user's process, so neither a test library nor a stage module
comes in through here (for type checking it names ``ModelConfig``, which every
stage has through ``core``). Like the acceptance tests' kit beside it, it is
evidence of every stage whose spec-side files name it, and an amendment that
edits it names each of them. This text names no other kit file on purpose:
the checker counts a kit file named from here as loaded by this file's users.

What is here:

- ``one_thread``: a long warm-up (thousands of tiny training calls) on one
  thread, the judged calls after it on the user's thread count;
- ``hessian_vector``, ``output_hvp`` and ``loss_hvp``: second derivatives as
  Hessian-vector products with directions drawn from the seed;
- ``modes``: one call in train and eval, under ``no_grad`` and ``inference_mode``;
- ``errors``: bad calls, each judged by the error it raises;
- ``config_changes`` and ``MODEL_FIELDS``: a small config with one field moved
  at a time (every ``ModelConfig`` field for a whole model);
- ``module_sweeps``: the whole domain sweep of a module that maps ``(B, T, C)``
  to ``(B, T, C)`` and may return its attention probabilities (attention and
  block): magnitude, grad2, history, modes, layout, dtype, config, errors.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from niels_gpt.config import ModelConfig
    from niels_gpt_contracts.driverkit import Oracle

SCALES = (1.0, 10.0, 30.0, 100.0, 1000.0)  # magnitude: inputs and weights scaled by each
TRAINING_CALLS = 2100  # history: a module's long training run before it is judged
MODEL_FIELDS: Mapping[str, Mapping[str, Any]] = {  # config: each field away from the default
    "V": {"V": 3},
    "T": {"T": 40},
    "C": {"C": 24, "H": 3},  # the width stays a multiple of the heads
    "L": {"L": 3},
    "H": {"H": 4},
    "d_ff": {"d_ff": 5},
    "rope_theta": {"rope_theta": 123.0},
    "dropout": {"dropout": 0.3},
}


def one_thread(steps: Callable[[], object]) -> None:
    """Run ``steps()`` on one torch thread, then give back the thread count it found.

    Warm-ups are thousands of tiny ops, for which one thread is 3 to 8 times
    faster on a busy machine; the judged calls after it run as a user's do.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        steps()
    finally:
        torch.set_num_threads(threads)


def hessian_vector(
    o: Oracle, first: Sequence[torch.Tensor], wrt: Sequence[torch.Tensor], tag: str
) -> tuple[torch.Tensor, ...]:
    """``H v`` for each of ``wrt``: the gradient of ``<first, v>``, ``v`` drawn as ``{tag}-v{i}``.

    ``first`` must be the gradients of one scalar with respect to ``wrt``,
    taken with ``create_graph=True``; an input ``H v`` does not reach is zeros.
    """
    v = [o.randn(*t.shape, tag=f"{tag}-v{i}") for i, t in enumerate(wrt)]  # one per wrt
    dot = torch.stack([(a * b).sum() for a, b in zip(first, v, strict=True)]).sum()  # ()
    return torch.autograd.grad(dot, list(wrt), materialize_grads=True)


def output_hvp(
    o: Oracle,
    module: torch.nn.Module,
    x: torch.Tensor,
    tag: str,
    *,
    out: str = "y",
    feed: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """``module(x)``, its input gradient along ``g`` and ``H v`` over the input and every parameter.

    ``x``: ``(B, T, C)``. Returns ``{out: y, "dx", "hvp.x", "hvp.<param>"...}``; ``g`` is
    drawn as ``{tag}-g``, the directions as ``{tag}-v{i}``. ``feed`` maps the
    leaf input to what the module is given (a non-leaf, say).
    """
    z = x.clone().requires_grad_(True)  # (B, T, C)
    names, params = zip(*module.named_parameters(), strict=True)
    wrt = [z, *params]
    y = module(feed(z) if feed else z)  # (B, T, C)
    g = o.randn(*y.shape, tag=f"{tag}-g")  # (B, T, C)
    first = torch.autograd.grad((y * g).sum(), wrt, create_graph=True)
    second = hessian_vector(o, first, wrt, tag)
    found = {out: y.detach(), "dx": first[0].detach(), "hvp.x": second[0]}
    found.update({f"hvp.{n}": h for n, h in zip(names, second[1:], strict=True)})
    return found


def loss_hvp(
    o: Oracle,
    loss: torch.Tensor,
    named: Sequence[tuple[str, torch.Tensor]],
    tag: str,
) -> dict[str, Any]:
    """A scalar loss, its gradient and ``H v`` with respect to each named tensor.

    Returns ``{"loss", "grad.<name>"..., "hvp.<name>"...}``; the directions are
    drawn as ``{tag}-v{i}`` in the order of ``named``.
    """
    names, wrt = zip(*named, strict=True)
    first = torch.autograd.grad(loss, wrt, create_graph=True)
    second = hessian_vector(o, first, wrt, tag)
    found: dict[str, Any] = {"loss": loss.detach()}
    found.update({f"grad.{n}": g.detach() for n, g in zip(names, first, strict=True)})
    found.update({f"hvp.{n}": h for n, h in zip(names, second, strict=True)})
    return found


MODES: Mapping[str, tuple[bool, Any]] = {  # modes: (train?, the context a call runs in)
    "train": (True, None),
    "eval": (False, None),
    "no_grad": (False, torch.no_grad),
    "inference_mode": (False, torch.inference_mode),
}


def modes(
    o: Oracle,
    module: torch.nn.Module,
    fn: Callable[[], Any],
    desc: str,
    stages: int,
    reduction: int,
) -> None:
    """``fn()`` as ``domain/modes/<mode>`` for each of ``MODES``: ``module`` set to train or
    eval first, the call inside the mode's context; ``desc`` is formatted with ``mode``."""
    for mode, (training, ctx) in MODES.items():
        module.train(training)

        def run(ctx: Any = ctx) -> Any:
            if ctx is None:
                return fn()
            with ctx():
                return fn()

        o.call(
            f"domain/modes/{mode}",
            run,
            desc=desc.format(mode=mode),
            stages=stages,
            reduction=reduction,
            axes=("modes",),
        )


def errors(o: Oracle, cases: Mapping[str, Callable[[], Any]], say: str = "bad input") -> None:
    """Each bad call as ``domain/errors/<what>``: the error it raises is what is judged."""
    for what, fn in cases.items():
        o.call(
            f"domain/errors/{what}",
            fn,
            desc=f"{say}: {what}",
            stages=1,
            reduction=1,
            axes=("errors",),
        )


def config_changes(
    small: ModelConfig, fields: Mapping[str, Mapping[str, Any]]
) -> Iterator[tuple[str, Mapping[str, Any], ModelConfig]]:
    """``(field, change, config)``: ``small`` with one field (and what it needs) moved."""
    for field, change in fields.items():
        yield field, change, dataclasses.replace(small, **change)


class ModuleSweep(NamedTuple):
    """A module from ``(B, T, C)`` to ``(B, T, C)`` that can return its probabilities.

    ``build(cfg)`` makes one in float32 (weights are drawn after); ``small`` is the
    swept config; ``stages`` the sequential stages of one forward (the bound's
    depth); ``about`` what the descriptions add after ``H=..`` (say
    ``" d_ff=40"``); ``history``: the configs of the long run and of the second
    module called in turn; ``fields``: each field moved away from ``small``;
    ``score_bound(module, x)``: an upper bound of the attention scores' size.
    A named tuple, not a dataclass: a dataclass needs its module in
    ``sys.modules``, and a module loaded by path is not put there.
    """

    build: Callable[[ModelConfig], torch.nn.Module]
    small: ModelConfig
    stages: int
    about: str
    history: tuple[ModelConfig, ModelConfig]
    fields: Mapping[str, Mapping[str, Any]]
    score_bound: Callable[[Any, torch.Tensor], int]


def _module(
    o: Oracle, s: ModuleSweep, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64,
    scale: float | None = None,
) -> Any:  # fmt: skip
    module = s.build(cfg).to(dtype)
    o.load_weights(module, tag, scale)
    return module


def _magnitude(o: Oracle, s: ModuleSweep) -> None:
    if not o.wants("domain/magnitude/s=1"):
        return
    c = s.small.C
    x0 = o.randn(2, 24, c, tag="mag-x")  # (2, 24, C)
    for scale in SCALES:
        module = _module(o, s, s.small, "mag-w", scale=scale / c**0.5).eval()  # weights x s
        x = scale * x0  # (2, 24, C)
        with torch.no_grad():
            o.call(
                f"domain/magnitude/s={scale:g}",
                partial(module, x, return_attn=True),
                desc=f"B=2 T=24 C={c} H={s.small.H}{s.about} f64 eval, "
                f"inputs and weights x{scale:g}",
                stages=s.stages,
                reduction=max(c, 24, s.score_bound(module, x)),
                axes=("magnitude",),
            )


def _grad2(o: Oracle, s: ModuleSweep) -> None:
    for i, (b, t) in enumerate(((1, 1), (2, 17), (2, 32))):
        name = f"domain/grad2/{i}"
        if not o.wants(name):
            continue
        module = _module(o, s, s.small, f"grad2-w{i}").train()
        x = o.randn(b, t, s.small.C, tag=f"grad2-x{i}")  # (B, T, C)
        o.call(
            name,
            partial(output_hvp, o, module, x, name),
            desc=f"B={b} T={t} C={s.small.C} H={s.small.H}{s.about} f64 train: "
            "Hessian-vector products (x, parameters)",
            stages=4 * s.stages,
            reduction=max(s.small.C, b * t),
            axes=("grad2",),
        )


def _causal_pair(
    o: Oracle, module: torch.nn.Module, x: torch.Tensor, name: str, cut: int, stages: int
) -> None:
    """``{name}/train`` and ``{name}/later`` (tokens ``cut..`` redrawn): the prefix must not move.

    ``x``: ``(B, T, C)``; the module is called in train mode.
    """
    later = x.clone()  # (B, T, C)
    later[:, cut:] = o.randn(x.shape[0], x.shape[1] - cut, x.shape[2], tag=f"{name}-later")
    module.train()
    same = o.equal(
        (f"{name}/train", "out", ((1, 0, cut),)), (f"{name}/later", "out", ((1, 0, cut),))
    )
    for what, z, rel in (("train", x, ()), ("later", later, (same,))):
        o.call(
            f"{name}/{what}",
            partial(module, z),
            desc=f"B={x.shape[0]} T={x.shape[1]} C={x.shape[2]} f64 train"
            + (f", tokens {cut}.. redrawn" if rel else ""),
            stages=stages,
            reduction=max(x.shape[1], x.shape[2]),
            relations=rel,
            axes=("history",),
        )


def _history(o: Oracle, s: ModuleSweep) -> None:
    name = "domain/history/long"
    if not o.wants(f"{name}/eval"):
        return
    cfg, cfg2 = s.history
    module = _module(o, s, cfg, "hist-w").train()
    x = o.randn(2, cfg.T, cfg.C, tag="hist-x")  # (2, T, C)

    def training_run() -> None:
        for _ in range(TRAINING_CALLS):  # one module's long training run (forward and backward)
            module(x).sum().backward()

    one_thread(training_run)
    module.eval()
    about = f"B=2 T={cfg.T} C={cfg.C} H={cfg.H} f64 eval"
    with torch.no_grad():
        o.call(
            f"{name}/eval",
            partial(module, x, return_attn=True),
            desc=f"{about} after {TRAINING_CALLS} training calls",
            stages=s.stages,
            reduction=cfg.T,
            axes=("history",),
        )
    _causal_pair(o, module, x, name, 3, s.stages)
    saved = io.BytesIO()
    torch.save(module.state_dict(), saved)
    saved.seek(0)
    fresh = s.build(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    with torch.no_grad():
        o.call(
            "domain/history/reloaded",
            partial(fresh, x, return_attn=True),
            desc=f"{about}, a fresh module loaded from a saved state_dict",
            stages=s.stages,
            reduction=cfg.T,
            axes=("history",),
        )
    other = _module(o, s, cfg2, "hist-w2").train()
    y = o.randn(1, cfg2.T, cfg2.C, tag="hist-y")  # (1, T2, C2)
    for i in range(3):  # two modules interleaved
        for who, m, z in (("a", module.train(), x), ("b", other, y)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(m, z),
                desc=f"two modules called in turn, round {i}, module {who} f64 train",
                stages=s.stages,
                reduction=cfg2.T,
                axes=("history",),
            )


def _enable_grad(module: torch.nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """``module(x)`` and ``dx`` under ``enable_grad`` nested in ``no_grad``; ``x``: (B, T, C)."""
    with torch.no_grad(), torch.enable_grad():
        x = x.clone().requires_grad_(True)  # (B, T, C)
        y = module(x)  # (B, T, C)
        y.square().sum().backward()
    return {"y": y.detach(), "dx": x.grad}


def _modes_layout(o: Oracle, s: ModuleSweep) -> None:
    if not o.wants("domain/modes/train"):
        return
    c = s.small.C
    module = _module(o, s, s.small, "modes-w")
    x = o.randn(2, 20, c, tag="modes-x")  # (2, 20, C)
    about = f"B=2 T=20 C={c} H={s.small.H}{s.about} f64"
    call = partial(module, x, return_attn=True)
    modes(o, module, call, about + " {mode}", stages=s.stages, reduction=20)
    o.call(
        "domain/modes/enable_grad",
        partial(_enable_grad, module.eval(), x),
        desc=f"{about} enable_grad inside no_grad, backward",
        stages=2 * s.stages,
        reduction=40,
        axes=("modes",),
    )
    layouts = {
        "transposed": o.randn(2, c, 20, tag="layout-t").transpose(1, 2),  # (2, 20, C)
        "strided": o.randn(2, 40, c, tag="layout-s")[:, ::2],  # (2, 20, C)
        "expanded": o.randn(1, 20, c, tag="layout-e").expand(3, 20, c),  # (3, 20, C)
        "channels-sliced": o.randn(2, 20, 2 * c, tag="layout-c")[..., 1::2],  # (2, 20, C)
    }
    with torch.no_grad():
        for what, z in layouts.items():
            o.call(
                f"domain/layout/{what}",
                partial(module, z, return_attn=True),
                desc=f"{about} eval, a {what} (non-contiguous) input",
                stages=s.stages,
                reduction=20,
                axes=("layout",),
            )


def _dtypes(o: Oracle, s: ModuleSweep) -> None:
    about = f"B=2 T=20 C={s.small.C} H={s.small.H}{s.about}"
    x = o.randn(2, 20, s.small.C, tag="dtype-x")  # (2, 20, C)
    for dtype, short in ((torch.float32, "f32"), (torch.float16, "f16")):
        module = _module(o, s, s.small, "dtype-w", dtype).eval()
        with torch.no_grad():
            o.call(
                f"domain/dtype/{short}",
                partial(module, x.to(dtype), return_attn=True),
                desc=f"{about} {short} module eval",
                stages=s.stages,
                reduction=20,
                computes_in=dtype,
                axes=("dtype",),
            )
    f32 = _module(o, s, s.small, "dtype-w", torch.float32).eval()

    def autocast() -> Any:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            return f32(x.float(), return_attn=True)

    o.call(
        "domain/dtype/autocast-f16",
        autocast,
        desc=f"{about} float16 autocast eval",
        stages=s.stages,
        reduction=20,
        computes_in=torch.float16,
        axes=("dtype",),
    )


def _configs(o: Oracle, s: ModuleSweep) -> None:
    for field, _, cfg in config_changes(s.small, s.fields):
        module = _module(o, s, cfg, f"config-w-{field}")
        z = o.randn(2, min(cfg.T, 40), cfg.C, tag=f"config-x-{field}")  # (2, T, C)
        desc = f"B=2 T={z.shape[1]} C={cfg.C} H={cfg.H} cfg.T={cfg.T} dropout={cfg.dropout} "
        for mode in ("eval", "train"):
            module.train(mode == "train")
            o.call(
                f"domain/config/{field}/{mode}",
                partial(module, z, return_attn=True),
                desc=desc + f"theta={cfg.rope_theta:g} f64 {mode}",
                stages=s.stages,
                reduction=max(cfg.C, z.shape[1]),
                compare=("1",) if mode == "train" and cfg.dropout else None,
                axes=("config",),
            )


def _errors(o: Oracle, s: ModuleSweep) -> None:
    c = s.small.C
    module = _module(o, s, s.small, "errors-w", torch.float32).eval()
    cases = {
        "device-meta": torch.zeros(1, 4, c, device="meta"),
        "int64": torch.zeros(1, 4, c, dtype=torch.int64),
        "float16": torch.zeros(1, 4, c, dtype=torch.float16),
        "rank4": torch.zeros(1, 1, 4, c),
        "rank1": torch.zeros(c),
        "length": torch.zeros(1, s.small.T + 1, c),
        "width": torch.zeros(1, 4, c + 1),
    }
    errors(o, {what: partial(module, z) for what, z in cases.items()})


def module_sweeps(o: Oracle, s: ModuleSweep) -> None:
    """Every ``domain/...`` call of a ``(B, T, C) -> (B, T, C)`` module's sweep, in order."""
    _magnitude(o, s)
    _grad2(o, s)
    _history(o, s)
    _modes_layout(o, s)
    if o.wants("domain/dtype/f32"):  # the dtype and config calls are built together
        _dtypes(o, s)
        _configs(o, s)
    _errors(o, s)
