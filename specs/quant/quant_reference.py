"""Float64 reference of the quant stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.quant`` when the base has no quant code to compare a PR with
(the stage's first PR). It is written from specs/quant.toml, not from an
implementation: the scales are ``max |w| / 127`` of each output row rounded
up to the weight's dtype (1 for a zero row), the codes ``round(w / s)`` (ties to
even) clipped to ``[-127, 127]``, and a layer's output is
``x @ (q s)^T + b`` computed wholly in float64 from the given input, codes,
scales and bias, then rounded once to the dtype the spec promises (the
input's, or autocast's for a float32 input under ``torch.autocast``). Since
3.0 a float32 or bfloat16 product on a CPU runs in bfloat16 activations: the
input and the scales are rounded to bfloat16 first and the product, exact in
float64, is rounded to bfloat16 before the bias. Buffer
names and checks are the spec's, so the oracle loads the same ``state_dict``
into both and a bad input raises the same ``InputError``.
"""

from __future__ import annotations

import torch
from torch import nn

from niels_gpt.checks import InputError

__all__ = ["Int8Linear", "quantize_int8", "quantize_linear", "quantize_weight"]

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of a 2-D float weight: ``q`` int8 ``(O, I)``, ``s`` ``(O,)`` in its dtype."""
    if not isinstance(weight, torch.Tensor):
        raise InputError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2 or weight.dtype not in _FLOATS:
        raise InputError(f"weight must be a 2-D float tensor, got {weight.dim()}-D {weight.dtype}")
    w = weight.detach().double()  # (O, I)
    if not bool(torch.isfinite(w).all()):
        raise InputError("weight must be finite")
    amax = w.abs().max(dim=1).values  # (O,)
    s = (amax / 127.0).to(weight.dtype)  # (O,) nearest
    s = torch.where(s.double() * 127.0 >= amax, s, torch.nextafter(s, s + float("inf")))  # up
    s = torch.where(s == 0, torch.ones_like(s), s)  # (O,)
    q = torch.clamp(torch.round(w / s.double().unsqueeze(1)), -127.0, 127.0)  # (O, I)
    return q.to(torch.int8), s


class Int8Linear(nn.Module):
    """The spec's int8 layer; its forward is computed in float64."""

    in_features: int
    out_features: int
    qweight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an int >= 1, got {value!r}")
        if dtype not in _FLOATS:
            raise InputError(f"dtype must be a float dtype, got {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer(
            "qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scales", torch.ones(out_features, dtype=dtype, device=device))
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )

    @property
    def weight(self) -> torch.Tensor:
        return torch.full(
            (self.out_features, self.in_features),
            float("nan"),
            dtype=self.scales.dtype,
            device=self.scales.device,
        )

    def dequantize(self) -> torch.Tensor:
        return (self.qweight.double() * self.scales.double().unsqueeze(1)).to(self.scales.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise InputError(f"x must be (..., {self.in_features})")
        s = self.scales
        kind = x.device.type
        auto = torch.is_autocast_enabled(kind) and x.dtype != torch.float64
        work = torch.get_autocast_dtype(kind) if auto else None
        if x.device != s.device or x.dtype not in (s.dtype, work):
            raise InputError(f"x must be {s.dtype} on {s.device}, got {x.dtype} on {x.device}")
        out_dtype = work if work is not None else x.dtype
        # 3.0: on a CPU a float32 or bfloat16 product runs in bfloat16 activations: the
        # input and the scales rounded to bfloat16, the sum (exact here) rounded to bfloat16
        bf16 = kind == "cpu" and out_dtype in (torch.float32, torch.bfloat16)
        x64 = x.to(torch.bfloat16).double() if bf16 else x.double()  # (..., I)
        s64 = (s.to(torch.bfloat16) if bf16 else s).double()  # (O,)
        w = self.qweight.double() * s64.unsqueeze(1)  # (O, I) exact codes times scales
        with torch.autocast(kind, enabled=False):
            y = x64 @ w.T  # (..., O) float64
            if bf16:
                y = y.to(torch.bfloat16).double()  # the product's one rounding
            if self.bias is not None:
                y = y + self.bias.double()
        return y.to(out_dtype)


def quantize_linear(linear: nn.Module) -> Int8Linear:
    """A new ``Int8Linear`` holding ``linear``'s codes, scales and bias."""
    if not isinstance(linear, nn.Linear):
        raise InputError(f"expected an nn.Linear, got {type(linear).__name__}")
    w = linear.weight
    q, s = quantize_weight(w)
    layer = Int8Linear(
        w.shape[1], w.shape[0], linear.bias is not None, dtype=w.dtype, device=w.device
    )
    with torch.no_grad():
        layer.qweight.copy_(q)
        layer.scales.copy_(s)
        if linear.bias is not None and layer.bias is not None:
            layer.bias.copy_(linear.bias)
    layer.train(linear.training)
    return layer


def quantize_int8(model: nn.Module) -> nn.Module:
    """Every Linear child whose weight no other module shares becomes an ``Int8Linear``."""
    if not isinstance(model, nn.Module) or isinstance(model, nn.Linear):
        raise InputError(f"expected a module holding Linear layers, got {type(model).__name__}")
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        raise InputError("expected a float model, got one already quantized")
    holders: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        holders[id(p)] = holders.get(id(p), 0) + 1
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and holders.get(id(child.weight)) == 1
    ]
    if not found:
        raise InputError("expected an untied nn.Linear in the model, got none")
    if any(child.weight.dtype not in _FLOATS for _, _, child in found):
        raise InputError("expected Linear weights of a float dtype")
    for parent, name, child in found:
        parent.add_module(name, quantize_linear(child))
    return model
