"""A module's whole domain sweep: what attention's and block's drivers share.

``module_sweeps(o, ModuleSweep(...))`` runs every ``domain/...`` call of a
module that maps ``(B, T, C)`` to ``(B, T, C)`` and may return its attention
probabilities: magnitude (inputs and weights scaled up to x1000), grad2
(Hessian-vector products over the input and every parameter), history (2,100
training calls, causality after them, a reloaded ``state_dict``, two modules
called in turn), modes, layout, dtype, config and errors. A stage says only
what is its own: the module, its config, its depth in stages, the bound of
its scores and the fields it reads.

The general helpers these sweeps call (the one-thread warm-up, the
Hessian-vector products, the modes and errors loops, the config changes) are
``sweeps``'s, imported here by name, so a driver that imports this module
reaches them too. ``scaled``, one module's magnitude sweep, is this
module's; the model stages' drivers call it for a module of their model.
Like ``sweeps``, it imports torch and nothing else at run time.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from speckit.sweeps import (
    SCALES,
    TRAINING_CALLS,
    config_changes,
    errors,
    modes,
    one_thread,
)
from speckit.sweeps import output_hvp as output_hvp  # block's own grad2 call uses it too

if TYPE_CHECKING:
    from niels_gpt.config import ModelConfig
    from niels_gpt_contracts.driverkit import Oracle


@dataclass(frozen=True)
class ModuleSweep:
    """A module from ``(B, T, C)`` to ``(B, T, C)`` that can return its probabilities.

    ``build(cfg)`` makes one in float32 (weights are drawn after); ``small`` is the
    swept config; ``stages`` the sequential stages of one forward (the bound's
    depth); ``about`` what the descriptions add after ``H=..`` (say
    ``" d_ff=40"``); ``history``: the configs of the long run and of the second
    module called in turn; ``fields``: each field moved away from ``small``;
    ``score_bound(module, x)``: an upper bound of the attention scores' size.
    Built by keyword.
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


def scaled(
    o: Oracle, build: Callable[[], torch.nn.Module], x0: torch.Tensor, tag: str
) -> Iterator[tuple[float, Any, torch.Tensor]]:
    """A module's magnitude sweep on ``x0`` (B, T, C): for each scale ``s`` of ``SCALES``, a
    fresh float64 ``build()`` in eval mode, its weights drawn as ``tag`` times ``s / sqrt(C)``
    (weights x s), and ``s * x0``: inputs and weights scaled by the same factor. The
    magnitude calls here and the model stages' module scenarios run through it."""
    for s in SCALES:
        module = build().double().eval()
        o.load_weights(module, tag, scale=s / x0.shape[-1] ** 0.5)  # weights x s
        yield s, module, s * x0  # (B, T, C)


def _magnitude(o: Oracle, s: ModuleSweep) -> None:
    if not o.wants("domain/magnitude/s=1"):
        return
    c = s.small.C
    x0 = o.randn(2, 24, c, tag="mag-x")  # (2, 24, C)
    for scale, module, x in scaled(o, partial(s.build, s.small), x0, "mag-w"):
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
