"""The oracle sweeps: what several stages' ``domain/...`` drivers share.

It imports torch and nothing else at run time: the oracle worker is meant to
look like a user's process, so neither a test library nor a stage module
comes in through here (for type checking it names ``ModelConfig``, which every
stage has through ``core``).

What is here:

- ``one_thread``: a long warm-up (thousands of tiny training calls) on one
  thread, the judged calls after it on the user's thread count;
- ``hessian_vector``, ``output_hvp`` and ``loss_hvp``: second derivatives as
  Hessian-vector products with directions drawn from the seed;
- ``modes``: one call in train and eval, under ``no_grad`` and ``inference_mode``;
- ``errors``: bad calls, each judged by the error it raises;
- ``config_changes`` and ``MODEL_FIELDS``: a small config with one field moved
  at a time (every ``ModelConfig`` field for a whole model).

A module's whole domain sweep (attention's and block's) is ``module_sweeps``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
