"""Property tests of block v0 on the session's device, against float64 references.

The references rebuild LayerNorm and GELU from their formulas (erf GELU,
biased variance) and reuse only the attention module, which has its own
reference in the attention stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block, init_weights

Tol = Callable[[torch.dtype], dict[str, float]]


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 3))
    return ModelConfig(
        V=32, T=draw(st.integers(1, 8)), C=H * D, H=H, d_ff=draw(st.integers(1, 24)), dropout=0.0
    )


def ref_layer_norm(x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)  # (B, T, 1)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # (B, T, 1)
    return (x - mean) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias  # (B, T, C)


def ref_mlp(x: torch.Tensor, mlp: MLP) -> torch.Tensor:
    h = x @ mlp.fc.weight.T + mlp.fc.bias  # (B, T, F)
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # (B, T, F) exact GELU
    return h @ mlp.proj.weight.T + mlp.proj.bias  # (B, T, C)


@pytest.mark.invariant("block.prenorm_wiring")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_block_matches_prenorm_reference(
    device: torch.device,
    randomise: Callable[[nn.Module, int], None],
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    T = data.draw(st.integers(1, cfg.T))
    block = Block(cfg)
    randomise(block, seed)
    block.to(device=device, dtype=dtype).eval()
    x = torch.randn(2, T, cfg.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    x = x.to(device, dtype)
    y, probs = block(x, return_attn=True)
    ref = block.to("cpu", torch.float64)  # references run on the CPU (MPS has no float64)
    x64 = x.to("cpu", torch.float64)
    attn_out, ref_probs = ref.attn(ref_layer_norm(x64, ref.ln1), return_attn=True)
    h = x64 + attn_out  # (B, T, C)
    expected = h + ref_mlp(ref_layer_norm(h, ref.ln2), ref.mlp)  # (B, T, C)
    torch.testing.assert_close(y.cpu(), expected.to(dtype), **tol(dtype))
    torch.testing.assert_close(probs.cpu(), ref_probs.to(dtype), **tol(dtype))


@pytest.mark.invariant("block.mlp_shape_grads")
@given(cfg=configs(), B=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_mlp_matches_reference_and_has_finite_grads(
    device: torch.device,
    randomise: Callable[[nn.Module, int], None],
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    cfg: ModelConfig,
    B: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    mlp = MLP(cfg)
    randomise(mlp, seed)
    mlp.to(device=device, dtype=dtype)
    assert (mlp.fc.in_features, mlp.fc.out_features) == (cfg.C, cfg.d_ff)
    assert (mlp.proj.in_features, mlp.proj.out_features) == (cfg.d_ff, cfg.C)
    assert mlp.fc.bias is not None and mlp.proj.bias is not None
    x = torch.randn(B, cfg.T, cfg.C, device=device, dtype=dtype)  # (B, T, C)
    out = mlp(x)
    assert (out.shape, out.dtype, out.device) == (x.shape, dtype, x.device)
    torch.testing.assert_close(out, ref_mlp(x, mlp), **tol(dtype))
    out.pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mlp.parameters())


@pytest.mark.invariant("block.dropout_semantics")
def test_one_dropout_before_each_residual_add(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=16, C=32, H=4, d_ff=64, dropout=0.5)
    block = Block(cfg).to(device).train()
    assert isinstance(block.dropout, nn.Dropout) and block.dropout.p == 0.5
    # Only the shared residual dropout acts here; the attention's own are off.
    block.attn.attn_dropout.p = block.attn.resid_dropout.p = 0.0
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    block.dropout.register_forward_hook(lambda m, i, o: calls.append((i[0], o)))
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    y = block(x)
    assert len(calls) == 2, f"the shared dropout must run once per branch, ran {len(calls)}"
    (attn_in, attn_dropped), (mlp_in, mlp_dropped) = calls
    torch.testing.assert_close(attn_in, block.attn(block.ln1(x)))
    h = x + attn_dropped  # (B, T, C)
    torch.testing.assert_close(mlp_in, block.mlp(block.ln2(h)))
    torch.testing.assert_close(y, h + mlp_dropped)
    for before, after in calls:
        assert (after == 0).any() and not torch.equal(before, after)


@pytest.mark.invariant("block.passes_attn_probs")
def test_block_returns_the_attention_probs_object(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=8, C=16, H=2, d_ff=32, dropout=0.3)
    block = Block(cfg).to(device).train()
    seen: list[object] = []
    block.attn.register_forward_hook(lambda m, i, o: seen.append(o))
    y, probs = block(torch.randn(3, 5, cfg.C, device=device), return_attn=True)
    assert len(seen) == 1 and isinstance(seen[0], tuple)
    assert probs is seen[0][1]
    assert probs.shape == (3, cfg.H, 5, 5) and y.shape == (3, 5, cfg.C)
    assert isinstance(block(torch.randn(3, 5, cfg.C, device=device)), torch.Tensor)


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((4,), 3.0))
        self.conv = nn.Conv1d(2, 2, 3)
        self.ln_no_affine = nn.LayerNorm(4, elementwise_affine=False)
        self.ln_no_bias = nn.LayerNorm(4, bias=False)


@pytest.mark.invariant("block.init_weights")
def test_init_weights_gpt_style_and_safe_on_any_tree() -> None:
    torch.manual_seed(0)
    tree = nn.Sequential(
        nn.Linear(512, 1024),
        nn.Embedding(1024, 512),
        nn.Linear(512, 256, bias=False),
        nn.LayerNorm(64),
        _Custom(),
    )
    with torch.no_grad():
        for p in tree.parameters():
            p.fill_(7.0)
    conv_before = tree[4].conv.weight.clone()
    tree.apply(init_weights)
    for module in (tree[0], tree[1], tree[2]):
        w = module.weight
        assert abs(w.mean().item()) < 2e-3
        assert abs(w.std().item() - 0.02) < 1e-3
    assert torch.equal(tree[0].bias, torch.zeros(1024))
    assert torch.equal(tree[3].weight, torch.ones(64))
    assert torch.equal(tree[3].bias, torch.zeros(64))
    assert torch.equal(tree[4].scale, torch.full((4,), 7.0))  # not ours to touch
    assert torch.equal(tree[4].conv.weight, conv_before)
    assert torch.equal(tree[4].ln_no_bias.weight, torch.ones(4))
    assert all(p.grad is None for p in tree.parameters())


@pytest.mark.invariant("block.rejects_bad_input")
def test_block_and_mlp_reject_wrong_dtype_device_and_shape(device: torch.device) -> None:
    cfg = ModelConfig(V=32, T=8, C=16, H=2, d_ff=32)
    block, mlp = Block(cfg).to(device), MLP(cfg).to(device)
    good = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    cases = {
        "float64": good.double() if device.type != "mps" else good.half(),
        "float16": good.half(),
        "int64": good.long(),
        "other device": torch.empty(2, cfg.T, cfg.C, device="meta"),
        "2-D": good[0],
        "wrong width": torch.randn(2, cfg.T, cfg.C + 1, device=device),
    }
    for case, x in cases.items():
        for module in (block, mlp):
            with pytest.raises(AssertionError) as info:
                module(x)
            assert "must" in str(info.value) and "got" in str(info.value), (case, module)
