"""The domain sweep of a whole model: what the model stages' drivers share.

``model_sweeps(o, ModelSweep(...))`` runs the ``domain/...`` calls every model
stage makes the same way, over ids drawn below the vocabulary, and then the
stage's own scenarios, axis by axis. What differs between the stages is a
field of the table: the model (plain or fast GPT), how one forward is called
and judged (one call, fast against explicit, cached chunks against the
uncached forward, a padded batch against a row alone), the longest sum of a
forward on 20 tokens, the dtypes and modes it is swept in, what runs after a
forward (a generate call), the bad calls. The table's calls:

- magnitude: the model's weights scaled by each of the oracle sweeps' scales,
  the bound's sum length covering its largest attention score;
- dtype: the model in each listed dtype, or in float32 under autocast;
- config: every ``ModelConfig`` field moved away from ``small``;
- modes: one forward in each listed mode (train, eval, ``no_grad``,
  ``inference_mode``);
- errors: each bad call, judged by the error it raises.

The helpers here (the model builder, the bounds, a cross-entropy's
Hessian-vector products, a causality pair, a reloaded model, two models in
turn, a backward under ``enable_grad``, a call that must hand its model
back, a cache fed in chunks of every size against an uncached call) are for
the stages' own scenarios and calls too; a stage enters each scenario in its
table's ``Scenarios`` where it defines it. The general helpers (scales,
config fields, warm-up, modes, errors) are ``sweeps``'s, imported here and
bound to module-level names; one module's magnitude sweep is
``module_sweeps``'s ``scaled``. Like ``sweeps``, this module imports torch
and nothing else at run time (a stage's classes come in through the table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from speckit import sweeps as kit

if TYPE_CHECKING:
    from niels_gpt.config import ModelConfig
    from niels_gpt_contracts.driverkit import Oracle

SCALES, MODEL_FIELDS = kit.SCALES, kit.MODEL_FIELDS
one_thread, loss_hvp, output_hvp = kit.one_thread, kit.loss_hvp, kit.output_hvp
hessian_vector, errors, modes = kit.hessian_vector, kit.errors, kit.modes
LENGTH = 20  # the tokens of every swept forward but config's


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a forward under a name: the name's tail, what it runs, its description
    (``says``, formatted with the sweep's) and what else ``o.call`` takes (``rules``,
    ``relations``, ``compare``). The sweep gives the bound and the axis."""

    tail: str
    fn: Callable[[], Any]
    says: str = "{}"
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# A stage's own scenario of one axis: ``scenario(o)`` makes its calls.
Scenario = Callable[["Oracle"], None]


class Scenarios(dict[str, Scenario]):
    """A stage's own scenarios by axis (``ModelSweep.scenarios``), each entered where it is
    defined: ``OWN = Scenarios()``, then ``@OWN.axis("dtype", "domain/dtype/x")`` above
    the dtype scenario."""

    def axis(self, axis: str, *wanted: str) -> Callable[[Scenario], Scenario]:
        """A decorator entering its function as the scenario of ``axis``, run only where this
        worker computes one of the calls ``wanted`` (always, when none is named): nothing
        of the scenario is built for calls another worker makes."""

        def enter(scenario: Scenario) -> Scenario:
            def guarded(o: Oracle) -> None:
                if not wanted or any(o.wants(name) for name in wanted):
                    scenario(o)

            self[axis] = guarded
            return scenario

        return enter


# The calls of one forward under ``name``: ``forward(o, name, model, ids)``, ``ids`` (B, t).
Forward = Callable[["Oracle", str, Any, torch.Tensor], Sequence[Call]]
# The call after a forward in the magnitude and config sweeps (a generate call, say):
# ``after(o, name, model, ids, key)``, ``key`` the scale or the config field.
After = Callable[["Oracle", str, Any, torch.Tensor, str], Call]


def depth(cfg: ModelConfig) -> int:
    """The rounding stages of a GPT forward: seven a block, the embedding and the head."""
    return 7 * cfg.L + 2


def plain(o: Oracle, name: str, model: Any, ids: torch.Tensor) -> list[Call]:
    """A forward as one call, ``name``: ``model(ids)``."""
    return [Call("", partial(model, ids))]


def judge(
    o: Oracle, name: str, calls: Sequence[Call], desc: str, *, stages: int, reduction: int,
    axes: tuple[str, ...], computes_in: torch.dtype | None = None,
) -> None:  # fmt: skip
    """``calls`` under ``name`` with one bound and one axis (a stage's own scenario's;
    the table's calls name their axis where they are made)."""
    for c in calls:
        o.call(name + c.tail, c.fn, desc=c.says.format(desc), stages=stages,
               reduction=reduction, axes=axes, computes_in=computes_in, **c.extra)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModelSweep:
    """A model stage's table: what its sweeps call and how (see the module docstring).

    ``build(cfg)`` makes the model (weights drawn after, dtype set, eval mode);
    ``small`` is the swept config and ``batch`` the rows of its ids;
    ``forward`` makes the calls of one forward under a name, their names
    ``name + s`` for ``s`` in ``suffixes`` (``config_forward`` in the config
    sweep, where it differs); ``reduction`` the longest sum of a forward of
    ``small`` on 20 tokens; ``label`` names the model in descriptions;
    ``part``: the magnitude calls' names go under ``domain/magnitude/<part>``;
    ``dtypes``: a name per model dtype and autocast dtype (None: none);
    ``modes``: the modes (of ``sweeps``' ``MODES``) one forward runs
    in, on ``modes_config`` (default ``small``); ``after`` follows each
    magnitude and config forward; ``errors(o)`` the bad calls by name;
    ``scenarios``: the stage's own calls, per axis, run after the table's.
    Built by keyword.
    """

    build: Callable[[ModelConfig], torch.nn.Module]
    small: ModelConfig
    forward: Forward
    suffixes: tuple[str, ...] = ("",)
    config_forward: Forward | None = None
    batch: int = 2
    reduction: int = 24
    label: str = "GPT"
    part: str = ""
    dtypes: Mapping[str, tuple[torch.dtype, torch.dtype | None]] = dataclasses.field(
        default_factory=dict
    )
    modes: tuple[str, ...] = ()
    modes_config: ModelConfig | None = None
    after: After | None = None
    errors: Callable[[Oracle], Mapping[str, Callable[[], Any]]] | None = None
    scenarios: Mapping[str, Scenario] = dataclasses.field(default_factory=dict)


def model(
    o: Oracle, s: ModelSweep, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64,
    scale: float | None = None,
) -> Any:  # fmt: skip
    """``s.build(cfg)`` in ``dtype``, in eval mode, its weights drawn from ``tag`` (x ``scale``)."""
    built = s.build(cfg).to(dtype).eval()
    o.load_weights(built, tag, scale)
    return built


def score_bound(attn: Any, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair of an attention
    module on its input ``x`` (B, T, C): RoPE keeps the norms of q and k."""
    with torch.no_grad():
        q, k, _ = attn.qkv(x).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def gpt_bound(gpt: Any, ids: torch.Tensor) -> int:
    """The largest ``score_bound`` over a GPT's blocks on ``ids`` (B, t), each block on its
    own input (uncached: call it before any cache is set up)."""
    top = 0
    with torch.no_grad():
        h = gpt.tok_emb(ids)  # (B, t, C): the first block's input
        for block in gpt.blocks:
            top = max(top, score_bound(block.attn, block.ln1(h)))
            h = block(h)  # (B, t, C)
    return top


def enable_grad(
    o: Oracle, run: Callable[[], Any], desc: str, *, stages: int, reduction: int
) -> None:
    """``run()`` (a backward) under ``enable_grad`` inside ``no_grad``, as
    ``domain/modes/enable_grad``: gradients switched back on where a caller had them off."""

    def enabled() -> Any:
        with torch.no_grad(), torch.enable_grad():
            return run()

    o.call("domain/modes/enable_grad", enabled, desc=desc, stages=stages, reduction=reduction,
           axes=("modes",))  # fmt: skip


def wants(o: Oracle, s: ModelSweep, name: str) -> bool:
    """Whether this worker computes one of the calls the table makes under ``name``."""
    tails = (*s.suffixes, "/generate") if s.after else s.suffixes
    return any(o.wants(name + tail) for tail in tails)


def cross_entropy_hvp(
    o: Oracle, gpt: Any, logits_of: Callable[[], torch.Tensor], tag: str
) -> dict[str, Any]:
    """The cross-entropy of ``logits_of()`` (B, t, V) against targets drawn as
    ``{tag}-targets``: the loss, its gradient and ``H v`` over every parameter of ``gpt``
    (``loss_hvp``, directions drawn as ``{tag}-v<i>``)."""
    logits = logits_of()  # (B, t, V)
    targets = o.randint(gpt.cfg.V, *logits.shape[:2], tag=f"{tag}-targets")  # (B, t)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # ()
    return dict(loss_hvp(o, loss, list(gpt.named_parameters()), tag))


def causal_pair(
    o: Oracle,
    names: tuple[str, str],
    calls: tuple[Callable[[], Any], Callable[[], Any]],
    cut: int,
    *,
    desc: tuple[str, str],
    stages: int,
    reduction: int,
    axes: tuple[str, ...],
    compare: Sequence[str] | None = None,
) -> None:
    """Two calls on inputs that differ from position ``cut`` on: the outputs' first ``cut``
    positions (dim 1) must agree (an invariant), in training mode as everywhere."""
    same = o.equal((names[0], "out", ((1, 0, cut),)), (names[1], "out", ((1, 0, cut),)))
    for i, rel in ((0, ()), (1, (same,))):
        o.call(names[i], calls[i], desc=desc[i], stages=stages, reduction=reduction,
               relations=rel, compare=compare, axes=axes)  # fmt: skip


def handed_back(
    o: Oracle, name: str, run: Callable[[], Any], gpt: Any, ids: torch.Tensor, *, desc: str,
    stages: int, reduction: int, rules: Sequence[str] = (),
) -> None:  # fmt: skip
    """``run()`` under ``name`` (a ``generate`` call, say), then ``gpt``'s own forward on
    ``ids`` (B, t) under ``name/after``, compared with the base's: the call must hand the
    model back as it found it."""
    o.call(name, run, desc=desc, stages=stages, reduction=reduction, rules=rules)
    with torch.no_grad():
        o.call(f"{name}/after", partial(gpt, ids), desc=f"the model's own forward after {name}",
               stages=stages, reduction=reduction)  # fmt: skip


def chunk_sweep(
    o: Oracle, full: str, chunked: Callable[..., Any], span: tuple[int, int], most: int,
    about: str, *, stages: int, reduction: int, axes: tuple[str, ...],
) -> None:  # fmt: skip
    """A cache fed in chunks of every size, against the stage's uncached call ``full``.

    ``full`` ran columns ``0 .. stop`` uncached (the stage makes it, with the axis
    literal ``oracle.coverage`` reads); for each ``n`` in ``1 .. most``,
    ``chunked(n, start)`` under ``full/n=<n>`` runs them through a cache, from each
    first column ``start + j`` (``j < n``) in chunks of ``n``, and answers ``o<j>``:
    its outputs of columns ``start .. stop``, each equal to ``full``'s (invariants).
    ``(start, stop)`` is ``span``; ``about`` heads the descriptions.
    """
    start, stop = span
    for n in range(1, most + 1):
        name = f"{full}/n={n}"
        same = [o.equal((name, f"o{j}", ()), (full, "out", ((1, start, stop),))) for j in range(n)]
        o.call(name, partial(chunked, n, start), desc=f"{about} cached chunks of {n} from column "
               f"{start}..", stages=stages, reduction=reduction, relations=same,
               axes=axes)  # fmt: skip


def reloaded(s: ModelSweep, built: torch.nn.Module, cfg: ModelConfig) -> Any:
    """A fresh float64 ``s.build(cfg)`` in eval mode, loaded from ``built``'s saved state_dict."""
    saved = io.BytesIO()
    torch.save(built.state_dict(), saved)
    saved.seek(0)
    fresh = s.build(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    return fresh


def in_turn(
    o: Oracle,
    a: tuple[Any, Any],
    b: tuple[Any, Any],
    run: Callable[[Any, Any, str], Callable[[], Any]],
    *,
    desc: str,
    stages: int,
    reduction: int,
    rules: Sequence[str] = (),
) -> None:
    """Two models called in turn, three rounds: ``domain/history/interleaved/<round><who>``.

    ``a`` and ``b`` are ``(model, input)``; ``run(model, input, key)`` makes the call
    (``key``: ``<round><who>``); ``desc`` is formatted with ``round`` and ``who``.
    """
    for i in range(3):
        for who, (m, z) in (("a", a), ("b", b)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                run(m, z, f"{i}{who}"),
                desc=desc.format(round=i, who=who),
                stages=stages,
                reduction=reduction,
                rules=rules,
                axes=("history",),
            )


def _magnitude(o: Oracle, s: ModelSweep) -> None:
    first = f"domain/magnitude/{s.part}s="
    if not wants(o, s, f"{first}1"):
        return
    c, B = s.small.C, s.batch
    ids = o.randint(s.small.V, B, LENGTH, tag="mag-ids")  # (B, 20)
    n = depth(s.small)
    for scale in SCALES:
        gpt = model(o, s, s.small, "mag-gpt", scale=scale / c**0.5)  # weights x scale
        top = max(s.small.d_ff, s.small.V, LENGTH, gpt_bound(gpt, ids))
        desc = f"{s.label} B={B} T={LENGTH} C={c} L={s.small.L} f64 eval, weights x{scale:g}"
        name = f"{first}{scale:g}"
        with torch.no_grad():
            for call in s.forward(o, name, gpt, ids):
                o.call(name + call.tail, call.fn, desc=call.says.format(desc), stages=n,
                       reduction=top, axes=("magnitude",), **call.extra)  # fmt: skip
        for call in [s.after(o, name, gpt, ids, f"{scale:g}")] if s.after else []:
            o.call(name + call.tail, call.fn, desc=call.says.format(desc), stages=n,
                   reduction=top, axes=("magnitude",), **call.extra)  # fmt: skip


def _dtypes(o: Oracle, s: ModelSweep) -> None:
    if not s.dtypes:
        return
    B = s.batch
    ids = o.randint(s.small.V, B, LENGTH, tag="dtype-ids")  # (B, 20)
    for short, (dtype, autocast) in s.dtypes.items():
        name = f"domain/dtype/{short}"
        if not wants(o, s, name):
            continue
        gpt = model(o, s, s.small, "dtype-w", dtype)
        how = f"{short} model" if autocast is None else f"f32 model under {autocast} autocast"
        context = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
        with torch.no_grad(), context:
            for call in s.forward(o, name, gpt, ids):
                o.call(name + call.tail, call.fn, desc=call.says.format(f"{s.label} B={B} "
                       f"T={LENGTH} {how} eval"), stages=depth(s.small), reduction=s.reduction,
                       computes_in=autocast or dtype, axes=("dtype",), **call.extra)  # fmt: skip


def _configs(o: Oracle, s: ModelSweep) -> None:
    for field, change, cfg in kit.config_changes(s.small, MODEL_FIELDS):
        name = f"domain/config/{field}"
        if not wants(o, s, name):
            continue
        gpt = model(o, s, cfg, f"config-w-{field}")
        t = min(cfg.T, 30)
        z = o.randint(cfg.V, s.batch, t, tag=f"config-ids-{field}")  # (B, t)
        desc = f"{s.label} B={s.batch} T={t} {field} = {change[field]} f64 eval"
        n, top = depth(cfg), max(cfg.d_ff, cfg.C, cfg.V, t)
        with torch.no_grad():
            for call in (s.config_forward or s.forward)(o, name, gpt, z):
                o.call(name + call.tail, call.fn, desc=call.says.format(desc), stages=n,
                       reduction=top, axes=("config",), **call.extra)  # fmt: skip
        for call in [s.after(o, name, gpt, z, field)] if s.after else []:
            o.call(name + call.tail, call.fn, desc=call.says.format(desc), stages=n,
                   reduction=top, axes=("config",), **call.extra)  # fmt: skip


def _modes(o: Oracle, s: ModelSweep) -> None:
    if not any(wants(o, s, f"domain/modes/{mode}") for mode in s.modes):
        return
    cfg = s.modes_config or s.small
    gpt = model(o, s, cfg, "modes-w")
    ids = o.randint(cfg.V, s.batch, LENGTH, tag="modes-ids")  # (B, 20)
    for mode in s.modes:
        training, context = kit.MODES[mode]
        gpt.train(training)
        name, desc = f"domain/modes/{mode}", f"{s.label} B={s.batch} T={LENGTH} f64 {mode}"
        with context() if context else contextlib.nullcontext():
            for call in s.forward(o, name, gpt, ids):
                o.call(name + call.tail, call.fn, desc=call.says.format(desc), stages=depth(cfg),
                       reduction=s.reduction, axes=("modes",), **call.extra)  # fmt: skip


def model_sweeps(o: Oracle, s: ModelSweep) -> None:
    """Every ``domain/...`` call of a model stage: each axis the table's calls, then the
    stage's own scenario for it, in the order magnitude, dtype, layout, config, modes,
    grad2, history, errors."""
    table: Mapping[str, Callable[[Oracle, ModelSweep], None]] = {
        "magnitude": _magnitude,
        "dtype": _dtypes,
        "config": _configs,
        "modes": _modes,
    }
    for axis in ("magnitude", "dtype", "layout", "config", "modes", "grad2", "history"):
        if axis in table:
            table[axis](o, s)
        if axis in s.scenarios:
            s.scenarios[axis](o)
    if s.errors is not None:
        errors(o, s.errors(o), "bad argument")
    if "errors" in s.scenarios:
        s.scenarios["errors"](o)
