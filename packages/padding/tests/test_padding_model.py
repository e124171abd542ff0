"""The padded forward as a model user sees it: causality, the unpadded path,
dropout, autocast, the fast path, and the model handed back as it was."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel, use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate, padded_forward

Tol = Callable[[torch.dtype], dict[str, float]]
Randomise = Callable[[torch.nn.Module, int], None]


def _model(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    randomise: Randomise,
    seed: int,
    fast: bool,
) -> GPT:
    model = GPT(cfg)
    randomise(model, seed)
    model.to(device=device, dtype=dtype).eval()
    return use_fast_attention(model) if fast else model  # type: ignore[return-value]


def _mask(pads: list[int], t: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)


def _ids(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, cfg.V, (B, t), generator=torch.Generator().manual_seed(seed)).to(device)


# --- causality ---------------------------------------------


@pytest.mark.invariant("padding.causal_within_row")
@settings(max_examples=12)
@given(
    B=st.integers(1, 4),
    t=st.integers(1, 9),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_changing_one_token_changes_only_its_row_from_there_on(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    randomise: Randomise,
    B: int,
    t: int,
    fast: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg = ModelConfig(V=17, T=9, C=12, L=2, H=2, d_ff=8, dropout=0.0, rope_theta=55.0)
    dtype = data.draw(st.sampled_from(float_dtypes))
    pads = data.draw(st.lists(st.integers(0, t), min_size=B, max_size=B))
    b, j = data.draw(st.integers(0, B - 1)), data.draw(st.integers(0, t - 1))
    model = _model(cfg, device, dtype, randomise, seed, fast)
    ids = _ids(cfg, B, t, seed, device)  # (B, t)
    mask = _mask(pads, t, device)
    changed = ids.clone()
    changed[b, j] = (changed[b, j] + 1 + seed % (cfg.V - 1)) % cfg.V
    with torch.no_grad():
        base = padded_forward(model, ids, mask)  # (B, t, V)
        out = padded_forward(model, changed, mask)  # (B, t, V)
    assert isinstance(base, torch.Tensor) and isinstance(out, torch.Tensor)
    others = [r for r in range(B) if r != b]
    torch.testing.assert_close(out[others], base[others], **tol(dtype))
    stop = t if j < pads[b] else j  # a pad changes nothing in its row either
    torch.testing.assert_close(out[b, :stop], base[b, :stop], **tol(dtype))
    if j >= pads[b]:
        assert not torch.allclose(out[b, j], base[b, j]), "the changed real token must count"


# --- the unpadded path ---------------------------------------------


@pytest.mark.invariant("padding.unpadded_exact")
@settings(max_examples=8)
@given(fast=st.booleans(), training=st.booleans(), layer=st.integers(0, 2), seed=st.integers(0, 99))
def test_a_mask_without_pads_is_the_model_itself(
    device: torch.device,
    randomise: Randomise,
    fast: bool,
    training: bool,
    layer: int,
    seed: int,
) -> None:
    cfg = ModelConfig(V=25, T=8, C=12, L=3, H=3, d_ff=10, dropout=0.35, rope_theta=900.0)
    model = _model(cfg, device, torch.float32, randomise, seed, fast).train(training)
    ids = _ids(cfg, 2, 7, seed, device)  # (2, 7)
    for mask in (None, torch.ones(2, 7, dtype=torch.bool, device=device)):
        torch.manual_seed(seed)
        got, got_trace = padded_forward(model, ids, mask, trace_layer=layer)
        torch.manual_seed(seed)
        want, want_trace = model.forward_with_attn_trace(ids, layer, return_full_attn=True)
        assert torch.equal(got, want) and got_trace["attn_full"] is not None
        assert want_trace["attn_full"] is not None
        assert torch.equal(got_trace["attn_full"], want_trace["attn_full"])
        assert torch.equal(got_trace["attn_row"], want_trace["attn_row"])


# --- dropout ---------------------------------------------


def _rates(model: GPT, emb: float, attn: float, resid: float, block: float) -> None:
    model.drop.p = emb
    for blk in model.blocks:
        blk.attn.attn_dropout.p = attn
        blk.attn.resid_dropout.p = resid
        blk.dropout.p = block


@pytest.mark.invariant("padding.dropout_in_training")
@pytest.mark.parametrize("fast", [False, True])
def test_dropout_rates_are_read_at_call_time_and_only_in_training(
    device: torch.device, tol: Tol, randomise: Randomise, fast: bool
) -> None:
    cfg = ModelConfig(V=23, T=8, C=12, L=2, H=3, d_ff=10, dropout=0.6)  # overridden below
    model = _model(cfg, device, torch.float32, randomise, 3, fast)
    ids = _ids(cfg, 3, 8, 1, device)  # (3, 8)
    mask = _mask([0, 5, 8], 8, device)  # row 2 all padding

    def run(rates: tuple[float, float, float, float], training: bool) -> Any:
        _rates(model, *rates)
        model.train(training)
        torch.manual_seed(3)
        with torch.no_grad():
            return padded_forward(model, ids, mask, trace_layer=1)

    plain, plain_trace = run((0.0, 0.0, 0.0, 0.0), training=False)
    assert torch.equal(run((0.9, 0.9, 0.9, 0.9), training=False)[0], plain)
    assert torch.equal(run((0.0, 0.0, 0.0, 0.0), training=True)[0], plain)
    for i in range(4):
        rates = tuple(0.25 if k == i else 0.0 for k in range(4))
        got, trace = run(rates, training=True)  # type: ignore[arg-type]
        assert not torch.allclose(got, plain), f"dropout {i} not applied"
        assert torch.isfinite(got).all() and not got[1, :5].any() and not got[2].any()
        if i == 1:  # the trace is taken before attention dropout: layer 1 sees it only via layer 0
            assert not torch.equal(trace["attn_full"], plain_trace["attn_full"])
    _rates(model, 0.0, 1.0, 0.0, 0.0)  # attention dropout 1: every attention branch is zero
    model.train()
    with torch.no_grad():
        got, trace = padded_forward(model, ids, mask, trace_layer=0)
        for b, p in enumerate([0, 5]):
            alone, ref = model.forward_with_attn_trace(ids[b : b + 1, p:], 0, True)
            torch.testing.assert_close(got[b, p:], alone[0], **tol(torch.float32))
            assert ref["attn_full"] is not None
            torch.testing.assert_close(
                trace["attn_full"][b, :, p:, p:], ref["attn_full"][0], **tol(torch.float32)
            )


# --- mixed precision ---------------------------------------------


@pytest.mark.invariant("padding.padding_invariance")
@pytest.mark.parametrize("fast", [False, True])
def test_autocast_and_half_modules_stay_within_the_derived_bound(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: Callable[..., None],
    fast: bool,
) -> None:
    # Default init and unit-scale inputs: the root conftest's error model holds.
    # Stages as the backbone counts them: under autocast six matmul stages a block
    # and the head; a half-precision module also rounds two norms and two
    # residual adds a block, and the final norm.
    cfg = ModelConfig(V=53, T=12, C=32, L=2, H=4, d_ff=40, dropout=0.0, rope_theta=250.0)
    torch.manual_seed(1)
    model = GPT(cfg).to(device).eval()
    exact = copy.deepcopy(model).to("cpu", torch.float64)
    if fast:
        use_fast_attention(model)
    pads = [0, 4, 11, 12]
    ids = _ids(cfg, 4, cfg.T, 2, device)  # (4, T)
    mask = _mask(pads, cfg.T, device)
    reduction = max(cfg.C, cfg.d_ff, cfg.V, 2 * cfg.T)
    for dtype in autocast_dtypes:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            auto, trace = padded_forward(model, ids, mask, trace_layer=0)
        half = copy.deepcopy(model).to(dtype)
        with torch.no_grad():
            halved = padded_forward(half, ids, mask)
        assert isinstance(halved, torch.Tensor) and halved.dtype == dtype
        assert trace["attn_full"] is not None and trace["attn_full"].dtype == torch.float32
        for b, p in enumerate(pads):
            assert not auto[b, :p].any() and not halved[b, :p].any()
            if p == cfg.T:
                continue
            with torch.no_grad():
                want = exact(ids[b : b + 1, p:].cpu())[0]  # (T - p, V) float64
            mixed_close(auto[b, p:], want, dtype=dtype, stages=6 * cfg.L + 1, reduction=reduction)
            mixed_close(
                halved[b, p:], want, dtype=dtype, stages=10 * cfg.L + 2, reduction=reduction
            )


# --- the fast path ---------------------------------------------


@pytest.mark.invariant("padding.masked_probabilities")
def test_a_fast_path_model_never_reaches_sdpa_when_padded(
    device: torch.device, randomise: Randomise, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(V=19, T=8, C=8, L=2, H=2, d_ff=8, dropout=0.0)
    model = _model(cfg, device, torch.float32, randomise, 2, fast=True)
    ids = _ids(cfg, 2, 6, 0, device)  # (2, 6)
    mask = _mask([4, 0], 6, device)

    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("SDPA reached on a padded batch")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    logits = padded_forward(model, ids, mask)
    assert isinstance(logits, torch.Tensor) and torch.isfinite(logits).all()
    generate(model, ids, mask, 2, temperature=0.0)
    with pytest.raises(AssertionError, match="SDPA reached"):
        padded_forward(model, ids, None)  # unpadded: the fast path's own forward


# --- the model afterwards ---------------------------------------------


def _state(model: GPT) -> tuple[Any, ...]:
    return (
        [(type(m), sorted(vars(m))) for m in model.modules()],
        [m.training for m in model.modules()],
        {k: v.clone() for k, v in model.state_dict().items()},
    )


def _same(model: GPT, before: tuple[Any, ...]) -> None:
    now = _state(model)
    assert now[0] == before[0] and now[1] == before[1]
    assert all(torch.equal(v, before[2][k]) for k, v in now[2].items())


@pytest.mark.invariant("padding.leaves_model")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("where", ["forward", "generate"])
def test_the_model_comes_back_as_it_was_after_success_and_failure(
    device: torch.device, randomise: Randomise, fast: bool, where: str
) -> None:
    cfg = ModelConfig(V=21, T=10, C=8, L=3, H=2, d_ff=8, dropout=0.1)
    model = _model(cfg, device, torch.float32, randomise, 4, fast)
    model.blocks[1].train()  # a mixed training state must survive too
    before = _state(model)
    ids = _ids(cfg, 2, 5, 1, device)  # (2, 5)
    mask = _mask([2, 0], 5, device)

    def call() -> None:
        if where == "forward":
            out, _ = padded_forward(model, ids, mask, trace_layer=2)
            out.sum().backward()
        else:
            generate(model, ids, mask, 4, top_k=3, generator=[torch.Generator(device=device)] * 2)

    call()
    _same(model, before)
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is (sdpa_kernel if fast else None) for b in model.blocks)
    fired: list[int] = []

    def fail(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        fired.append(1)
        if len(fired) == (1 if where == "forward" else 2):  # generate: in a decode step
            raise RuntimeError("boom")

    handle = model.blocks[2].attn.register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            call()
    finally:
        handle.remove()
    _same(model, before)
