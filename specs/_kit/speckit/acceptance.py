"""The acceptance tests' and runtime drivers' shared helpers (``speckit.acceptance``).

What more than one stage's tests need, written once: the config and model
case strategies, the model and token builders, the fixtures a test takes
bundled in one (``Rig``, the ``rig`` fixture), the sampling knobs a test
draws, the float64 sampling filter from its definitions, the recorder of
attention calls, what "the model handed back as it was" compares, the
weight flattener, the spies a call is watched with and the check that a
refused call ran nothing; and the runtime drivers' recording that leaves
RoPE's inside out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import pytest
import torch
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]
Calls = list[list[tuple[int, Any, tuple[Any, ...]]]]
Record = Callable[[], AbstractContextManager[None]]  # a runtime driver's recorder
NEG = float("-inf")


def model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int = 0,
    fast: bool = False,
) -> GPT:
    """A GPT with drawn weights, in ``dtype`` on ``device``, in eval mode; the fast path on."""
    gpt = GPT(cfg)
    randomise(gpt, seed)
    gpt.to(device=device, dtype=dtype).eval()
    return cast(GPT, use_fast_attention(gpt)) if fast else gpt  # the same model, its kernel set


@st.composite
def configs(draw: st.DrawFn, max_V: int = 40, max_T: int = 16) -> ModelConfig:
    """A small GPT config with every knob drawn (dropout too: eval mode must make it
    irrelevant); ``max_V`` and ``max_T`` bound the vocabulary and the context."""
    H = draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, max_V)),
        T=draw(st.integers(2, max_T)),
        C=H * 2 * draw(st.integers(1, 3)),
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 16)),
        dropout=draw(st.sampled_from([0.0, 0.3])),  # eval mode: must not matter
        rope_theta=draw(st.sampled_from([10000.0, 37.0, 1e6])),
    )


class Case(NamedTuple):
    """A drawn model case: its config, the seed of its weights and inputs, the fast path."""

    cfg: ModelConfig
    seed: int
    fast: bool


@st.composite
def cases(draw: st.DrawFn, configs: st.SearchStrategy[ModelConfig], fast: bool = True) -> Case:
    """A ``Case`` from ``configs``, a seed in [0, 2**16] and the fast path on or off
    (always off where ``fast`` is False)."""
    cfg = draw(configs)
    on = draw(st.booleans()) if fast else False
    return Case(cfg, draw(st.integers(0, 2**16)), on)


def tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, t) token ids below ``cfg.V``, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(frozen=True)
class Rig:
    """The fixtures a model stage's acceptance test takes, in one argument.

    ``device``, ``float_dtypes`` (float32 first, float64 last where the device
    has it), ``tol`` (dtype -> ``assert_close`` keywords) and ``randomise``
    (module, seed -> drawn weights) as the plugin and the root conftest give
    them, with the builders bound to them. A test module binds the fixture by
    name (``rig = kit.rig``) so that pytest finds it.
    """

    device: torch.device
    float_dtypes: tuple[torch.dtype, ...]
    tol: Tol
    randomise: Randomise

    @property
    def widest(self) -> torch.dtype:
        """The last float dtype: float64 where the device has it."""
        return self.float_dtypes[-1]

    def model(self, cfg: ModelConfig, dtype: torch.dtype, seed: int = 0, fast: bool = False) -> GPT:
        """``model`` on this device with this weight drawer."""
        return model(cfg, self.device, dtype, self.randomise, seed, fast)

    def build(self, case: Case, dtype: torch.dtype) -> GPT:
        """The model of a drawn ``case`` in ``dtype``."""
        return self.model(case.cfg, dtype, case.seed, case.fast)

    def tokens(self, cfg: ModelConfig, B: int, t: int, seed: int) -> torch.Tensor:
        """(B, t) ids below ``cfg.V`` on this device (``tokens``)."""
        return tokens(cfg, B, t, seed, self.device)  # (B, t)

    def generator(self, seed: int) -> torch.Generator:
        """A generator on this device seeded with ``seed``."""
        return generator(self.device, seed)

    def close(self, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
        """``assert_close`` at the tolerance of ``dtype``; raises AssertionError."""
        bound = self.tol(dtype)  # {"rtol": ..., "atol": ...}
        torch.testing.assert_close(got, want, rtol=bound["rtol"], atol=bound["atol"])


@pytest.fixture(scope="session")  # its parts are session-wide; hypothesis tests take it
def rig(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
) -> Rig:
    """The session's fixtures bundled (``Rig``)."""
    return Rig(device, float_dtypes, tol, randomise)


@st.composite
def knobs(
    draw: st.DrawFn,
    temperatures: Sequence[float] = (0.4, 1.0, 1.9),
    top_ps: Sequence[float] = (0.3, 0.65, 0.9, 1.0),
    max_k: int = 14,
) -> dict[str, Any]:
    """Sampling keywords for ``generate``: a temperature from ``temperatures``, top-k
    None or in [1, max_k], top-p None or one of ``top_ps``."""
    return {
        "temperature": draw(st.sampled_from(temperatures)),
        "top_k": draw(st.none() | st.integers(1, max_k)),
        "top_p": draw(st.none() | st.sampled_from(top_ps)),
    }


def reference_keep(
    row: list[float], temperature: float, top_k: int | None, top_p: float | None
) -> tuple[list[bool], list[float]]:
    """Which entries of one row of logits survive kv_cache's filter, from its definitions,
    in float64 Python; and the top-p masses the decision used (before each entry, in
    the order it was taken). Temperature 0 keeps the first maximum alone."""
    V = len(row)
    if temperature == 0:
        first_max = max(range(V), key=lambda j: (row[j], -j))
        return [j == first_max for j in range(V)], []
    scaled = [x / temperature for x in row]
    keep = [True] * V
    if top_k is not None and top_k < V:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        keep = [x >= kth for x in scaled]
    masses: list[float] = []
    if top_p is not None and top_p < 1.0:
        top = max(x for x, k in zip(scaled, keep, strict=True) if k)
        weights = [math.exp(x - top) if k else 0.0 for x, k in zip(scaled, keep, strict=True)]
        total = sum(weights)
        probs = [w / total for w in weights]
        order = sorted(range(V), key=lambda j: (-probs[j], j))
        before = 0.0
        for j in order:
            masses.append(before)
            if before >= top_p:
                keep[j] = False
            before += probs[j]
    return keep, masses


def reference_filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """``filter_logits`` from the definitions, on (B, V) logits, in their dtype: the
    kept entries divided by the temperature (as they are at 0), the rest ``-inf``."""
    rows = logits.detach().to("cpu", torch.float64).tolist()
    kept = [reference_keep(r, temperature, top_k, top_p)[0] for r in rows]
    keep = torch.tensor(kept, dtype=torch.bool, device=logits.device)  # (B, V)
    values = logits if temperature == 0 else logits / temperature  # (B, V)
    return values.masked_fill(~keep, NEG)  # (B, V)


def watch_attention_calls(model: GPT) -> tuple[Calls, list[Any]]:
    """Per layer, for every attention call: the input length, the cache, its state.

    The state of a ``KVCache`` is its storages, shapes, dtype and length (empty
    for no cache). Returns the record, filled as the model runs, and the hook
    handles to remove.
    """
    seen: Calls = [[] for _ in model.blocks]
    handles = []
    for layer, block in enumerate(model.blocks):

        def hook(
            module: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            layer: int = layer,
        ) -> None:
            x = args[0] if args else kwargs["x"]
            cache = getattr(module, "kv_cache", None)
            state: tuple[Any, ...] = ()
            if isinstance(cache, KVCache):
                state = (
                    cache.keys.data_ptr(),
                    cache.values.data_ptr(),
                    tuple(cache.keys.shape),
                    tuple(cache.values.shape),
                    cache.keys.dtype,
                    len(cache),
                )
            seen[layer].append((x.shape[1], cache, state))

        attn = cast(torch.nn.Module, block.attn)
        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


def flatten(gpt: GPT, scale: float) -> GPT:
    """Scale every weight by ``scale`` in place (flatter distributions: more than one
    token in play when sampling); returns ``gpt``."""
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(scale)
    return gpt


def watch_draw_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """Record the dtype of the probabilities every ``torch.multinomial`` call gets."""
    seen: list[torch.dtype] = []
    real = torch.multinomial

    def spy(probs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(probs.dtype)
        return real(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    return seen


@contextmanager
def attention_calls(model: GPT) -> Iterator[Calls]:
    """``watch_attention_calls`` for the length of a ``with`` block: yields the record,
    filled as the model runs; the hooks are removed when the block ends, raised or not."""
    seen, handles = watch_attention_calls(model)
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


ModelState = tuple[list[Any], list[Any], list[bool], dict[str, torch.Tensor]]


def state(gpt: GPT) -> ModelState:
    """What a call must hand back unchanged: every module's class and attribute names,
    each attention module's ``kv_cache`` (compared by identity), the modes, the weights."""
    return (
        [(type(m), sorted(vars(m))) for m in gpt.modules()],
        [getattr(m, "kv_cache", None) for m in gpt.modules() if isinstance(m, CausalSelfAttention)],
        [m.training for m in gpt.modules()],
        {k: v.clone() for k, v in gpt.state_dict().items()},
    )


def assert_same_state(gpt: GPT, before: ModelState) -> None:
    """``gpt`` is as ``state`` found it; raises AssertionError naming what differs."""
    classes, caches, flags, weights = state(gpt)
    assert classes == before[0]
    assert all(a is b for a, b in zip(caches, before[1], strict=True)), "a kv_cache changed"
    assert flags == before[2]
    for k, v in weights.items():
        assert torch.equal(v, before[3][k]), k


def watch_hook_registrations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the class name of every module a forward pre-hook is put on from now on."""
    hooked: list[str] = []
    real = torch.nn.Module.register_forward_pre_hook

    def spy(module: torch.nn.Module, *args: Any, **kw: Any) -> Any:
        hooked.append(type(module).__name__)
        return real(module, *args, **kw)

    monkeypatch.setattr(torch.nn.Module, "register_forward_pre_hook", spy)
    return hooked


def assert_refused_unrun(
    call: Callable[[], object],
    modules: Iterable[torch.nn.Module],
    error: type[Exception],
    needles: Sequence[str] = (),
) -> None:
    """``call()`` raises ``error`` whose message holds every one of ``needles``, and no
    module of ``modules`` starts a forward first (their forward pre-hooks see nothing)."""
    forwards: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args: forwards.append(type(mod).__name__))
        for m in modules
    ]
    try:
        with pytest.raises(error) as caught:
            call()
    finally:
        for handle in handles:
            handle.remove()
    assert forwards == [], f"forwards ran before the refusal: {forwards}"
    message = str(caught.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not named in {message!r}"


@contextmanager
def failing_call(module: torch.nn.Module, nth: int) -> Iterator[None]:
    """The ``nth`` forward of ``module`` (counted from 1) raises RuntimeError("injected
    failure") before it runs; the hook is gone when the block ends."""
    calls: list[int] = []

    def fail(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        calls.append(1)
        if len(calls) == nth:
            raise RuntimeError("injected failure")

    handle = module.register_forward_pre_hook(fail)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def recording_around_rope(record: Record) -> Iterator[None]:
    """Record the enclosed code with ``record`` (a runtime driver's), except the
    inside of each ``rope.apply_rope`` call.

    While it is open, ``niels_gpt.model.rope.apply_rope`` is wrapped: the open
    block is closed for the length of the real call and a new one is opened
    after it, so that the ops RoPE dispatches itself (``aten::cat`` inside
    ``torch.stack`` wherever its complex path does not apply) are the rope
    stage's, judged by its rules. A stage reaches RoPE through that module
    attribute (its ``rope-as-module`` rule), so every call passes the wrapper.
    """
    real = rope.apply_rope
    block = [record()]

    def unrecorded(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        block[0].__exit__(None, None, None)
        try:
            return real(q, k, sin, cos)
        finally:
            block[0] = record()
            block[0].__enter__()

    block[0].__enter__()
    rope.apply_rope = unrecorded
    try:
        yield
    finally:
        rope.apply_rope = real
        block[0].__exit__(None, None, None)
