"""Property tests of backbone v1 (RMSNorm, SwiGLU, block v1, GPT) on the session device.

References rebuild RMSNorm and SwiGLU from their formulas in float64; the
block reference reuses only the attention module (checked in its own stage).
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention as StageAttention
from niels_gpt.model.blocks import MLP, Block, CausalSelfAttention, RMSNorm, init_weights
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]


@st.composite
def configs(draw: st.DrawFn, dropout: float = 0.0) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, 40)),
        T=draw(st.integers(1, 10)),
        C=H * D,
        L=draw(st.integers(1, 3)),
        H=H,
        d_ff=draw(st.integers(1, 24)),
        dropout=dropout,
    )


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    ms = (x * x).sum(-1, keepdim=True) / x.shape[-1]  # (..., 1)
    return x / torch.sqrt(ms + eps) * weight  # (..., C)


def ref_swiglu(x: torch.Tensor, mlp: MLP) -> torch.Tensor:
    a = x @ mlp.w_a.weight.T + mlp.w_a.bias  # (B, T, F)
    g = x @ mlp.w_g.weight.T + mlp.w_g.bias  # (B, T, F)
    h = g / (1 + torch.exp(-g)) * a  # (B, T, F)
    return h @ mlp.w_o.weight.T + mlp.w_o.bias  # (B, T, C)


def _tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


@pytest.mark.invariant("backbone_v1.rmsnorm_matches_reference")
@given(
    dims=st.lists(st.integers(1, 5), min_size=0, max_size=3),
    C=st.integers(1, 33),
    shift=st.floats(-5, 5),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_rmsnorm_matches_formula(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    dims: list[int],
    C: int,
    shift: float,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(C)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(C, generator=gen))
    norm.to(device=device, dtype=dtype)
    # A shifted input: subtracting the mean (LayerNorm-style) would show.
    x = (torch.randn(*dims, C, generator=gen) + shift).to(device, dtype)  # (..., C)
    y = norm(x)
    assert (y.shape, y.dtype, y.device) == (x.shape, dtype, x.device)
    torch.testing.assert_close(y, ref_rms_norm(x, norm.weight), **tol(dtype))


@pytest.mark.invariant("backbone_v1.swiglu_matches_reference")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_swiglu_matches_formula(
    device: torch.device,
    randomise: Callable[[nn.Module, int], None],
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    mlp = MLP(cfg)
    randomise(mlp, seed)
    mlp.to(device=device, dtype=dtype)
    x = torch.randn(2, cfg.T, cfg.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    x = x.to(device, dtype)
    torch.testing.assert_close(mlp(x), ref_swiglu(x, mlp), **tol(dtype))


@pytest.mark.invariant("backbone_v1.prenorm_wiring")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_block_v1_matches_prenorm_reference(
    device: torch.device,
    randomise: Callable[[nn.Module, int], None],
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    block = Block(cfg)
    assert isinstance(block.ln1, RMSNorm) and isinstance(block.ln2, RMSNorm)
    assert isinstance(block.mlp, MLP) and isinstance(block.attn, StageAttention)
    randomise(block, seed)
    block.to(device=device, dtype=dtype).eval()
    x = torch.randn(2, cfg.T, cfg.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    x = x.to(device, dtype)
    y, probs = block(x, return_attn=True)
    ref = block.to("cpu", torch.float64)  # references run on the CPU (MPS has no float64)
    x64 = x.to("cpu", torch.float64)
    attn_out, ref_probs = ref.attn(ref_rms_norm(x64, ref.ln1.weight), return_attn=True)
    h = x64 + attn_out  # (B, T, C)
    expected = h + ref_swiglu(ref_rms_norm(h, ref.ln2.weight), ref.mlp)  # (B, T, C)
    torch.testing.assert_close(y.cpu(), expected.to(dtype), **tol(dtype))
    assert probs.shape == (2, cfg.H, cfg.T, cfg.T)
    torch.testing.assert_close(probs.cpu(), ref_probs.to(dtype), **tol(dtype))


@pytest.mark.invariant("backbone_v1.forward_shape_dtype")
@given(cfg=configs(), B=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_gpt_shapes_dtypes_and_trace_logits(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    cfg: ModelConfig,
    B: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    t = data.draw(st.integers(1, cfg.T))
    model = GPT(cfg).to(device=device, dtype=dtype).eval()
    x = _tokens(cfg, B, t, seed, device)
    logits = model(x)
    assert (logits.shape, logits.dtype, logits.device) == ((B, t, cfg.V), dtype, x.device)
    assert torch.isfinite(logits).all()
    traced, _ = model.forward_with_attn_trace(x, trace_layer=cfg.L - 1)
    assert torch.equal(traced, logits)


@pytest.mark.invariant("backbone_v1.trace_equals_full_last_row")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_trace_is_each_layers_own_probabilities(
    device: torch.device, cfg: ModelConfig, seed: int, data: st.DataObject
) -> None:
    t = data.draw(st.integers(1, cfg.T))
    model = GPT(cfg).to(device).eval()
    x = _tokens(cfg, 2, t, seed, device)
    # Independent capture: the input each attention module sees in a plain
    # forward, then that module's own probabilities for it.
    inputs: dict[int, torch.Tensor] = {}

    def grab(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            inputs[i] = args[0]

        return hook

    handles = [b.attn.register_forward_pre_hook(grab(i)) for i, b in enumerate(model.blocks)]
    model(x)
    for h in handles:
        h.remove()
    captured = {i: model.blocks[i].attn(h_in, return_attn=True)[1] for i, h_in in inputs.items()}
    for layer in range(cfg.L):
        _, trace = model.forward_with_attn_trace(x, layer, return_full_attn=True)
        full = trace["attn_full"]
        assert full is not None and trace["layer"] == layer
        assert torch.equal(trace["attn_row"], full[:, :, -1, :])
        torch.testing.assert_close(full, captured[layer])
        _, row_only = model.forward_with_attn_trace(x, layer)
        assert row_only["attn_full"] is None
        assert torch.equal(row_only["attn_row"], trace["attn_row"])


@pytest.mark.invariant("backbone_v1.trace_contract")
def test_trace_is_pre_dropout_in_train_mode(device: torch.device) -> None:
    cfg = ModelConfig(V=50, T=12, C=32, L=2, H=4, d_ff=40, dropout=0.5)
    model = GPT(cfg).to(device).train()
    for m in model.modules():
        if isinstance(m, nn.Dropout) and m is not model.blocks[1].attn.attn_dropout:
            m.p = 0.0  # leave only the traced layer's attention dropout live
    x = _tokens(cfg, 2, cfg.T, 0, device)
    _, trace = model.forward_with_attn_trace(x, 1, return_full_attn=True)
    full = trace["attn_full"]
    assert full is not None
    torch.testing.assert_close(full.sum(-1), torch.ones(2, cfg.H, cfg.T, device=device))
    model.eval()
    _, eval_trace = model.forward_with_attn_trace(x, 1, return_full_attn=True)
    torch.testing.assert_close(full, eval_trace["attn_full"])


@pytest.mark.invariant("backbone_v1.causality")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_future_tokens_never_change_past_logits(
    device: torch.device, cfg: ModelConfig, seed: int, data: st.DataObject
) -> None:
    if cfg.T < 2:
        return
    t = data.draw(st.integers(2, cfg.T))
    i = data.draw(st.integers(0, t - 2))
    model = GPT(cfg).to(device).eval()
    x = _tokens(cfg, 2, t, seed, device)
    changed = x.clone()
    changed[:, i + 1 :] = (x[:, i + 1 :] + 1) % cfg.V
    torch.testing.assert_close(model(changed)[:, : i + 1], model(x)[:, : i + 1])


@pytest.mark.invariant("backbone_v1.weight_tying")
def test_tied_head_survives_to_and_state_dict_round_trip(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...]
) -> None:
    cfg = ModelConfig(V=61, T=8, C=16, L=2, H=2, d_ff=24)
    model = GPT(cfg)
    assert model.lm_head.bias is None
    assert model.lm_head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "tok_emb.weight" in names
    for dtype in float_dtypes:
        model.to(device=device, dtype=dtype)
        assert model.lm_head.weight is model.tok_emb.weight
        assert model.tok_emb.weight.dtype == dtype
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location=device)
    assert not any(k.endswith(("rope_sin", "rope_cos", "mask")) for k in state)
    fresh = GPT(cfg).to(device=device, dtype=float_dtypes[-1])
    fresh.load_state_dict(state)
    assert fresh.lm_head.weight is fresh.tok_emb.weight
    assert torch.equal(fresh.tok_emb.weight, model.tok_emb.weight)
    x = _tokens(cfg, 1, cfg.T, 1, device)
    torch.testing.assert_close(fresh.eval()(x), model.eval()(x), rtol=0, atol=0)
    with torch.no_grad():
        fresh.tok_emb.weight[0].zero_()
    assert torch.all(fresh.lm_head.weight[0] == 0)


@pytest.mark.invariant("backbone_v1.init_weights")
def test_init_sets_norms_to_one_and_linears_to_gpt_init() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(V=512, T=8, C=256, L=2, H=4, d_ff=768)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(5.0)
    model.apply(init_weights)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * cfg.L + 1
    assert all(torch.equal(n.weight, torch.ones(cfg.C)) for n in norms)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            assert abs(m.weight.std().item() - 0.02) < 2e-3, m
            assert abs(m.weight.mean().item()) < 2e-3, m
        if isinstance(m, nn.Linear) and m.bias is not None:
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
    fresh = GPT(cfg)  # the constructor initialises the same way
    assert abs(fresh.blocks[0].mlp.w_a.weight.std().item() - 0.02) < 2e-3
    assert torch.equal(fresh.blocks[0].mlp.w_a.bias, torch.zeros(cfg.d_ff))
    assert torch.equal(fresh.ln_f.weight, torch.ones(cfg.C))


@pytest.mark.invariant("backbone_v1.dropout_placement")
def test_embedding_and_residual_dropout_placement(device: torch.device) -> None:
    cfg = ModelConfig(V=40, T=8, C=16, L=2, H=2, d_ff=24, dropout=0.5)
    model = GPT(cfg).to(device).train()
    calls: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"emb": [], "b0": [], "b1": []}
    model.drop.register_forward_hook(lambda m, i, o: calls["emb"].append((i[0], o)))
    for name, block in zip(("b0", "b1"), model.blocks, strict=True):
        block.dropout.register_forward_hook(lambda m, i, o, n=name: calls[n].append((i[0], o)))
    x = _tokens(cfg, 2, cfg.T, 3, device)
    model(x)
    assert [len(calls[k]) for k in ("emb", "b0", "b1")] == [1, 2, 2]
    emb_in, emb_out = calls["emb"][0]
    torch.testing.assert_close(emb_in, model.tok_emb(x))
    assert (emb_out == 0).any()
    assert isinstance(model.blocks[0].attn, CausalSelfAttention)


@pytest.mark.invariant("backbone_v1.dropout_placement")
def test_trace_path_drops_out_exactly_like_forward(device: torch.device) -> None:
    """Same RNG state, same dropout calls in the same order: identical train logits."""
    cfg = ModelConfig(V=40, T=8, C=16, L=2, H=2, d_ff=24, dropout=0.5)
    model = GPT(cfg).to(device).train()
    calls: list[torch.Tensor] = []
    model.drop.register_forward_hook(lambda m, i, o: calls.append(i[0]))
    x = _tokens(cfg, 2, cfg.T, 5, device)
    torch.manual_seed(7)
    logits = model(x)
    torch.manual_seed(7)
    traced, _ = model.forward_with_attn_trace(x, trace_layer=1)
    assert len(calls) == 2, "embedding dropout must run once in each path"
    torch.testing.assert_close(calls[1], model.tok_emb(x))
    torch.testing.assert_close(traced, logits, rtol=0, atol=0)


@pytest.mark.invariant("backbone_v1.config_requires_V")
def test_modelconfig_without_v_fails_and_gpt_uses_v() -> None:
    with pytest.raises(TypeError, match="'V'"):
        ModelConfig()  # type: ignore[call-arg]  # V is required: this must fail
    cfg = ModelConfig(V=123, T=4, C=8, L=1, H=2, d_ff=8)
    model = GPT(cfg)
    assert model.tok_emb.num_embeddings == 123 and model.lm_head.out_features == 123


def _bad_inputs(cfg: ModelConfig, device: torch.device) -> dict[str, torch.Tensor]:
    ok = torch.zeros(2, cfg.T, dtype=torch.int64, device=device)
    cases = {
        "1-D": ok[0],
        "3-D": ok[None],
        "float ids": ok.float(),
        "int32 ids": ok.int(),
        "too long": torch.zeros(2, cfg.T + 1, dtype=torch.int64, device=device),
        "empty": torch.zeros(2, 0, dtype=torch.int64, device=device),
        "id too large": ok + cfg.V,
        "negative id": ok - 1,
        "meta device": torch.zeros(2, cfg.T, dtype=torch.int64, device="meta"),
    }
    if device.type != "cpu":
        cases["wrong device"] = ok.cpu()
    return cases


@pytest.mark.invariant("backbone_v1.rejects_bad_input")
def test_bad_input_raises_with_expected_and_actual(device: torch.device) -> None:
    cfg = ModelConfig(V=30, T=6, C=8, L=2, H=2, d_ff=8)
    model = GPT(cfg).to(device)
    for case, x in _bad_inputs(cfg, device).items():
        for call in (model, lambda x: model.forward_with_attn_trace(x, 0)):
            with pytest.raises(AssertionError) as info:
                call(x)
            assert "got" in str(info.value) and "must" in str(info.value), case
    x = torch.zeros(1, 3, dtype=torch.int64, device=device)
    for layer in (-1, cfg.L, True, 1.0):
        with pytest.raises(AssertionError, match="trace_layer"):
            model.forward_with_attn_trace(x, layer)  # type: ignore[arg-type]


@pytest.mark.invariant("backbone_v1.length_assert")
def test_length_assert_is_hard_and_survives_python_O() -> None:
    cfg = ModelConfig(V=10, T=4, C=8, L=1, H=2, d_ff=8)
    model = GPT(cfg)
    with pytest.raises(AssertionError, match=r"\[1, 4\].*got 5"):
        model(torch.zeros(1, 5, dtype=torch.int64))
    script = (
        "import torch\n"
        "from niels_gpt.config import ModelConfig\n"
        "from niels_gpt.model.gpt import GPT\n"
        "m = GPT(ModelConfig(V=10, T=4, C=8, L=1, H=2, d_ff=8))\n"
        "try:\n"
        "    m.forward_with_attn_trace(torch.zeros(1, 5, dtype=torch.int64), 0)\n"
        "except AssertionError as e:\n"
        "    print('raised:', e)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "raised:" in out.stdout and "got 5" in out.stdout


@pytest.mark.invariant("backbone_v1.rejects_bad_input")
def test_block_mlp_and_rmsnorm_reject_what_they_cannot_take(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=8, C=16, H=2, d_ff=32)
    modules = (Block(cfg).to(device), MLP(cfg).to(device), RMSNorm(cfg.C).to(device))
    good = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    cases = {
        "float64": good.double() if device.type != "mps" else good.half(),
        "float16 (no silent promotion)": good.half(),
        "int64": good.long(),
        "other device": torch.empty(2, cfg.T, cfg.C, device="meta"),
        "wrong width": torch.randn(2, cfg.T, cfg.C + 1, device=device),
    }
    for case, x in cases.items():
        for module in modules:
            with pytest.raises(AssertionError) as info:
                module(x)
            assert "must" in str(info.value) and "got" in str(info.value), (case, module)
    for module in modules[:2]:
        with pytest.raises(AssertionError, match="3 dims"):
            module(good[0])
