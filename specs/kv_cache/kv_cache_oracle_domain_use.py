"""The kv_cache stage's domain sweeps, second part (spec, issue 28; maintainer-owned).

``kv_cache_oracle_domain.py`` (whose docstring says what each axis sweeps)
calls ``calls(o)`` last: the modes, grad2, history and errors axes, split
off to keep each file to one screenful of ideas. The shared helpers and
constants are that file's, loaded by path (a driver's folder is no package).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import (
    KVCache,
    drop_kv_cache,
    filter_logits,
    generate,
    generate_until_eos,
    use_kv_cache,
)

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

_SWEEPS = importlib.util.spec_from_file_location(  # the maintainers' oracle sweeps, by path
    "niels_speckit_sweeps", Path(__file__).parents[1] / "_kit" / "speckit_sweeps.py"
)
assert _SWEEPS is not None and _SWEEPS.loader is not None
sweeps = importlib.util.module_from_spec(_SWEEPS)
_SWEEPS.loader.exec_module(sweeps)


def _kit() -> Any:
    """``kv_cache_oracle_domain.py`` beside this file: the helpers these sweeps share."""
    path = Path(__file__).with_name("kv_cache_oracle_domain.py")
    spec = importlib.util.spec_from_file_location("_kv_cache_oracle_domain_kit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_KIT = _kit()
GEN = _KIT.GEN
GENERATE_CALLS = _KIT.GENERATE_CALLS
RESETS = _KIT.RESETS
SMALL = _KIT.SMALL
STAGES = _KIT.STAGES
_cached = _KIT._cached
_gpt = _KIT._gpt
_pair = _KIT._pair


def _grad_run(gpt: GPT, ids: torch.Tensor, split: int) -> dict[str, Any]:
    """A prefill of ``ids[:, :split]`` under ``no_grad``, then the rest with gradients:
    its output and the parameter gradients of its sum of squares."""
    gpt.zero_grad()
    use_kv_cache(gpt, ids.shape[0], max_len=ids.shape[1])
    with torch.no_grad():
        gpt(ids[:, :split])
    y = gpt(ids[:, split:])  # (B, t - split, V)
    y.square().sum().backward()
    drop_kv_cache(gpt)
    return {"y": y.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


def _modes(o: Oracle) -> None:
    if not o.wants("domain/modes/eval/full"):
        return
    cfg = dataclasses.replace(SMALL, dropout=0.2)
    gpt = _gpt(o, cfg, "modes-w")
    ids = o.randint(cfg.V, 2, 20, tag="modes-ids")  # (2, 20)
    for mode, ctx in (("eval", None), ("no_grad", torch.no_grad),
                      ("inference_mode", torch.inference_mode)):  # fmt: skip
        if ctx is None:
            _pair(o, f"domain/modes/{mode}", gpt, ids, axes=("modes",), reduction=24,
                  desc=f"f64 {mode}")  # fmt: skip
            continue
        with ctx():
            _pair(o, f"domain/modes/{mode}", gpt, ids, axes=("modes",), reduction=24,
                  desc=f"f64 eval under {mode}")  # fmt: skip
    gpt.train()
    with torch.no_grad():
        o.call(
            "domain/modes/train",
            partial(_cached, gpt, ids, (4, 1, 7)),
            desc="f64 train (dropout 0.2) under no_grad, cached chunks (4, 1, 7)",
            stages=STAGES,
            reduction=24,
            axes=("modes",),
        )
        o.call(
            "domain/modes/train-generate",
            partial(generate, gpt, ids[:, :4], 10, temperature=0.9, generator=o.generator("tr")),
            desc="generate t=4 new=10 on a model in training mode (dropout 0.2)",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            axes=("modes",),
        )

        def enabled() -> Any:
            with torch.enable_grad():
                return _grad_run(gpt.eval(), ids, 9)

        o.call(
            "domain/modes/enable_grad",
            enabled,
            desc="f64 eval, enable_grad inside no_grad: prefill 9, then 11 cached with backward",
            stages=2 * STAGES,
            reduction=40,
            axes=("modes",),
        )

        def generate_grad() -> Any:
            with torch.enable_grad():
                return generate(gpt, ids[:, :3], 8, temperature=0.0)

        o.call(
            "domain/modes/enable_grad-generate",
            generate_grad,
            desc="greedy generate t=3 new=8 inside enable_grad",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            axes=("modes",),
        )


def _hvp(o: Oracle, gpt: GPT, ids: torch.Tensor, split: int) -> dict[str, Any]:
    """A cached chunk's cross-entropy after a prefill of ``split``: its gradient and H v."""
    use_kv_cache(gpt, ids.shape[0], max_len=ids.shape[1])
    with torch.no_grad():
        gpt(ids[:, :split])
    logits = gpt(ids[:, split:])  # (B, t - split, V)
    drop_kv_cache(gpt)
    targets = o.randint(gpt.cfg.V, *logits.shape[:2], tag="grad2-targets")  # (B, t - split)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # ()
    return dict(sweeps.loss_hvp(o, loss, list(gpt.named_parameters()), "grad2"))


def _grad2(o: Oracle) -> None:
    if not o.wants("domain/grad2/cached-loss"):
        return
    gpt = _gpt(o, SMALL, "grad2-w").train()
    ids = o.randint(SMALL.V, 2, 16, tag="grad2-ids")  # (2, 16)
    o.call(
        "domain/grad2/cached-loss",
        partial(_hvp, o, gpt, ids, 10),
        desc="GPT B=2 f64 train: prefill 10, 6 cached with cross-entropy: H v (parameters)",
        stages=4 * STAGES,
        reduction=48,
        axes=("grad2",),
    )


def _history(o: Oracle) -> None:
    if not o.wants("domain/history/long/generate"):
        return
    cfg = ModelConfig(V=7, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = _gpt(o, cfg, "hist-w")
    prompt = o.randint(cfg.V, 2, 3, tag="hist-prompt")  # (2, 3)

    def warm_up() -> None:
        g = o.generator("hist-many")
        for i in range(GENERATE_CALLS):  # one model generating many times
            generate(gpt, prompt, 1 + i % 2, temperature=1.0, generator=g)
        for _ in range(RESETS):  # caches set up again and again, one step each
            use_kv_cache(gpt, 2)
            with torch.no_grad():
                gpt(prompt[:, :1])
        drop_kv_cache(gpt)

    sweeps.one_thread(warm_up)
    about = f"after {GENERATE_CALLS} generate calls and {RESETS} cache resets"
    o.call(
        "domain/history/long/generate",
        partial(generate, gpt, prompt, 9, temperature=1.0, generator=o.generator("hist-g")),
        desc=f"generate t=3 new=9 sampled, f64, {about}",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    with torch.no_grad():
        _pair(o, "domain/history/long", gpt, o.randint(cfg.V, 2, 12, tag="hist-ids"),
              axes=("history",), reduction=12, desc=f"f64 eval {about}")  # fmt: skip
    saved = io.BytesIO()
    torch.save(gpt.state_dict(), saved)
    saved.seek(0)
    fresh = GPT(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    o.call(
        "domain/history/reloaded",
        partial(generate, fresh, prompt, 9, temperature=0.0),
        desc="greedy generate on a fresh model loaded from a saved state_dict",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    other = _gpt(o, dataclasses.replace(cfg, V=11, C=12, H=3, T=16), "hist-w2")
    p2 = o.randint(11, 1, 4, tag="hist-prompt2")  # (1, 4)
    for i in range(3):  # two models generating in turn
        for who, m, z in (("a", gpt, prompt), ("b", other, p2)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(generate, m, z, 6, temperature=1.0, generator=o.generator(f"il{i}{who}")),
                desc=f"two models generating in turn, round {i}, model {who}, sampled f64",
                stages=9,
                reduction=16,
                rules=GEN,
                axes=("history",),
            )


def _errors(o: Oracle) -> None:
    gpt = _gpt(o, ModelConfig(V=10, T=8, C=16, H=2, L=2, d_ff=16), "errors-w", torch.float32)
    ok = torch.zeros(2, 3, dtype=torch.int64)  # (2, 3)
    cpu = torch.device("cpu")
    cases: dict[str, Any] = {
        "model-not-gpt": partial(generate, cast(Any, gpt.blocks[0]), ok, 1),
        "prompt-rank1": partial(generate, gpt, ok[0], 1),
        "prompt-int32": partial(generate, gpt, ok.int(), 1),
        "prompt-meta": partial(generate, gpt, ok.to("meta"), 1),
        "prompt-empty": partial(generate, gpt, ok[:, :0], 1),
        "prompt-empty-batch": partial(generate, gpt, ok[:0], 1),
        "ids-out-of-range": partial(generate, gpt, ok + 10, 1),
        "ids-negative": partial(generate, gpt, ok - 1, 1),
        "new-negative": partial(generate, gpt, ok, -1),
        "new-bool": partial(generate, gpt, ok, True),
        "new-float": partial(generate, gpt, ok, cast(Any, 2.0)),
        "temperature-nan": partial(generate, gpt, ok, 1, temperature=float("nan")),
        "temperature-bool": partial(generate, gpt, ok, 1, temperature=True),
        "top_k-zero": partial(generate, gpt, ok, 1, top_k=0),
        "top_k-bool": partial(generate, gpt, ok, 1, top_k=True),
        "top_p-over-one": partial(generate, gpt, ok, 1, top_p=1.5),
        "eos-out-of-range": partial(generate, gpt, ok, 1, eos_id=10),
        "generator-not-one": partial(generate, gpt, ok, 1, generator=cast(Any, 3)),
        "generators-short": partial(generate, gpt, ok, 1, generator=[torch.Generator()]),
        "trace-layer-past": partial(generate, gpt, ok, 1, trace_layer=2),
        "until-eos-no-eos": partial(generate_until_eos, gpt, ok, 1, eos_id=cast(Any, None)),
        "filter-int-logits": partial(filter_logits, torch.zeros(2, 5, dtype=torch.int64)),
        "filter-0d-logits": partial(filter_logits, torch.tensor(1.0)),
        "filter-top_p-zero": partial(filter_logits, torch.zeros(2, 5), top_p=0.0),
        "use-max_len-zero": partial(use_kv_cache, gpt, 1, max_len=0),
        "use-max_len-past-T": partial(use_kv_cache, gpt, 1, max_len=9),
        "use-batch-bool": partial(use_kv_cache, gpt, True),
        "use-no-attention": partial(use_kv_cache, torch.nn.Linear(2, 2), 1),
        "cache-zero-heads": partial(KVCache, 1, 0, 8, 4, dtype=torch.float32, device=cpu),
        "cache-float-len": partial(
            KVCache, 1, 2, cast(Any, 8.0), 4, dtype=torch.float32, device=cpu
        ),
    }
    for what, fn in cases.items():
        o.call(f"domain/errors/{what}", fn, desc=f"bad argument: {what}", stages=1,
               reduction=1, axes=("errors",))  # fmt: skip
    use_kv_cache(gpt, 2, max_len=4)
    with torch.no_grad():
        gpt(ok)
        for what, z in (("chunk-past-max_len", ok[:, :2]), ("chunk-int32", ok[:, :1].int())):
            o.call(f"domain/errors/{what}", partial(gpt, z), desc=f"bad cached chunk: {what}",
                   stages=1, reduction=1, axes=("errors",))  # fmt: skip
        gpt64 = _gpt(o, ModelConfig(V=10, T=8, C=16, H=2, L=2, d_ff=16), "errors-w")
        use_kv_cache(gpt64, 2)
        ours = [m for m in gpt.modules() if isinstance(getattr(m, "kv_cache", None), KVCache)]
        theirs = [m for m in gpt64.modules() if isinstance(getattr(m, "kv_cache", None), KVCache)]
        for mine, other in zip(ours, theirs, strict=True):
            other.kv_cache = mine.kv_cache  # a float32 cache on a float64 model
        o.call("domain/errors/cache-dtype-mismatch", partial(gpt64, ok[:, :1]),
               desc="a float32 cache on a float64 model", stages=1, reduction=1,
               axes=("errors",))  # fmt: skip
    drop_kv_cache(gpt)


def calls(o: Oracle) -> None:
    """The modes, grad2, history and errors sweeps (``domain/...``)."""
    _modes(o)
    _grad2(o)
    _history(o)
    _errors(o)
