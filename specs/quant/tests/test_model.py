"""Acceptance tests of quantize_int8 on a model (stage quant): what is swapped,
what it holds, its state_dict, and the bad inputs."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.quant import Int8Linear, quantize_int8, quantize_linear, quantize_weight

CFG = ModelConfig(V=37, T=16, C=24, L=2, H=3, d_ff=40, dropout=0.0)
LINEARS = ("attn.qkv", "attn.proj", "mlp.w_a", "mlp.w_g", "mlp.w_o")


def _model(device: torch.device, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CFG).to(device).eval()


@pytest.mark.invariant("quant.linears_only")
def test_every_untied_linear_is_swapped_and_the_rest_is_untouched(device: torch.device) -> None:
    model = _model(device)
    model.blocks[1].train()  # a training flag to keep
    float_model = copy.deepcopy(model)
    assert quantize_int8(model) is model
    names = {n for n, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert names == {f"blocks.{i}.{leaf}" for i in range(CFG.L) for leaf in LINEARS}
    assert not any(type(m) is nn.Linear for n, m in model.named_modules() if n != "lm_head")
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.tok_emb.weight
    kept = dict(model.named_parameters())
    for name, p in float_model.named_parameters():
        if name.rsplit(".", 2)[-2] in ("qkv", "proj", "w_a", "w_g", "w_o"):
            continue
        assert torch.equal(kept[name], p) and kept[name].dtype == p.dtype
    for i in range(CFG.L):
        for leaf in LINEARS:
            old = float_model.get_submodule(f"blocks.{i}.{leaf}")
            new = model.get_submodule(f"blocks.{i}.{leaf}")
            q, s = quantize_weight(old.weight)
            assert torch.equal(new.qweight, q) and torch.equal(new.scales, s)
            assert new.training == old.training == (i == 1)
            if old.bias is not None:
                assert new.bias is not None and torch.equal(new.bias, old.bias)


@pytest.mark.invariant("quant.int8_bytes")
def test_a_layer_holds_codes_scales_and_bias_only(device: torch.device) -> None:
    linear = nn.Linear(48, 32).to(device)
    layer = quantize_linear(linear)
    assert list(layer.parameters()) == []
    held = dict(layer.state_dict())
    assert sorted(held) == ["bias", "qweight", "scales"]
    assert held["qweight"].dtype == torch.int8 and held["qweight"].shape == (32, 48)
    total = sum(t.numel() * t.element_size() for t in layer.buffers())
    assert total == 32 * 48 + 2 * 32 * 4  # codes, float32 scales and bias: no float weight
    stand_in = layer.weight
    assert stand_in.shape == (32, 48) and stand_in.dtype == torch.float32
    assert stand_in.device == linear.weight.device and bool(stand_in.isnan().all())
    assert stand_in.untyped_storage().nbytes() <= stand_in.element_size()
    model = quantize_int8(_model(device))
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    per_layer = 3 * CFG.C * CFG.C + CFG.C * CFG.C + 3 * CFG.C * CFG.d_ff
    assert sum(m.qweight.numel() for m in layers) == CFG.L * per_layer


@pytest.mark.invariant("quant.state_dict_round_trip")
def test_state_dict_round_trip(device: torch.device) -> None:
    model = quantize_int8(_model(device, seed=1))
    other = quantize_int8(_model(device, seed=2))  # other weights, the same structure
    ids = torch.randint(0, CFG.V, (2, CFG.T), device=device)  # (2, T)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["blocks.0.attn.qkv.qweight"].dtype == torch.int8
    other.load_state_dict(state, strict=True)
    assert other.lm_head.weight is other.tok_emb.weight  # still tied after loading
    with torch.no_grad():
        assert torch.equal(other(ids), model(ids))
    f64 = quantize_int8(_model(device, seed=3)).to(torch.float64)  # scales follow, codes stay
    layer = f64.blocks[0].mlp.w_a
    assert layer.qweight.dtype == torch.int8 and layer.scales.dtype == torch.float64


@pytest.mark.invariant("quant.rejects_bad_input")
def test_bad_input_is_refused_before_anything_changes(device: torch.device) -> None:
    model = quantize_int8(_model(device))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(InputError, match=r"already quantized"):
        quantize_int8(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(InputError, match=r"nn.Linear.*Embedding"):
        quantize_linear(nn.Embedding(4, 8))
    with pytest.raises(InputError, match=r"nn.Linear.*Int8Linear"):
        quantize_linear(model.blocks[0].attn.qkv)
    with pytest.raises(InputError, match=r"nn.Linear"):
        quantize_int8(nn.Linear(4, 4))
    with pytest.raises(InputError, match=r"untied nn.Linear"):
        quantize_int8(nn.Sequential(nn.Embedding(4, 8), nn.LayerNorm(8)))
    with pytest.raises(InputError, match=r"nn.Module"):
        quantize_int8(torch.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"int32"):
        quantize_weight(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(InputError, match=r"2-D"):
        quantize_weight(torch.ones(4, dtype=torch.float32))
    with pytest.raises(InputError, match=r"finite"):
        quantize_weight(torch.tensor([[1.0, float("inf")]]))
    layer = quantize_linear(nn.Linear(8, 4).to(device))
    with pytest.raises(InputError, match=r"float32.*float64"):
        layer(torch.zeros(2, 8, dtype=torch.float64, device=device))
    with pytest.raises(InputError, match=r"8.*\(2, 7\)"):
        layer(torch.zeros(2, 7, device=device))
    with pytest.raises(InputError, match=r"in_features"):
        Int8Linear(0, 4)
    with pytest.raises(InputError, match=r"dtype"):
        Int8Linear(4, 4, dtype=torch.int8)
    seq = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.float64))
    seq[1].weight.data = seq[1].weight.data.to(torch.int32).double()  # still float: accepted
    mixed = nn.Sequential(nn.Linear(4, 4), _IntLinear())
    with pytest.raises(InputError, match=r"float dtype"):
        quantize_int8(mixed)
    assert type(mixed[0]) is nn.Linear  # nothing was swapped


class _IntLinear(nn.Linear):
    """A Linear whose weight is an int tensor (a model loaded wrong)."""

    def __init__(self) -> None:
        super().__init__(4, 4, bias=False)
        self.weight = nn.Parameter(torch.ones(4, 4, dtype=torch.int32), requires_grad=False)
