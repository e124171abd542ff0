"""Weight-only int8 for a model's linear layers, one scale per output channel.

Shape notation::

    O: output features (rows of a Linear's weight), I: input features,
    (...): any leading dims of an input

A decode step of one row reads every weight once, so its time is the bytes of
the weights over the memory bandwidth. Storing each ``nn.Linear`` weight as
int8 with one float scale per output row carries about a quarter of float32's
bytes. The maths is gpt-fast's and torchao's weight-only int8 (per row,
symmetric, 127 levels each side):

    s[o] = max_i |w[o, i]| / 127, rounded up to the weight's dtype (1 for a zero row)
    q[o, i] = round(w[o, i] / s[o]) in [-127, 127], computed in float64, ties to even
    y = (x @ q^T) * s + b

so ``|w - q s| <= s / 2`` elementwise and a layer's output moves by at most
``s[o] / 2 * sum_i |x[i]|`` (plus rounding) from the float layer's.

``Int8Linear.forward`` runs the product the way torchao's CPU weight-only
int8 does: on a CPU, where the product runs in float32 or bfloat16, through
ATen's fused ``torch.ops.aten._weight_int8pack_mm`` with the input and the
scales rounded to bfloat16 (each ``q * s`` formed and summed in float32, the
sum rounded once to bfloat16), so no step writes a float copy of the weight
(issue 49 measured 3.7 ms against float32's 15.0 ms for the default model's
40 weights at one row). A float32 layer on a CPU therefore computes with
bfloat16 activations. Where the kernel cannot run (``in_features`` not a
multiple of 32; a float32 layer under ``torch.compile``, whose bfloat16 scales
inductor's lowering of the kernel cannot take) or autograd must see the
product, the same roundings run through ``F.linear`` in float32
(``_bf16_product``).
float64 and float16 layers, float16 autocast and other devices keep
``F.linear(x, q.to(dtype))``, then the scales, then the bias, as gpt-fast's
eager ``WeightOnlyInt8Linear`` does.

``quantize_int8(model)`` swaps every ``nn.Linear`` of a model in place except
one whose weight is shared with another module: GPT's head is tied to the
token embedding, so quantizing it would either untie the pair (a float table
and an int8 head, more bytes than before) or quantize the embedding lookup
too; at V=256 the table is half a percent of the model's bytes, and the
logits keep float precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.checks import InputError

__all__ = ["Int8Linear", "quantize_int8", "quantize_linear", "quantize_weight"]

QMAX = 127  # symmetric: int8 levels -127 .. 127, so -q is always representable
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The product in bfloat16 activations: on a CPU, for these compute dtypes
BF16_PRODUCT = (torch.float32, torch.bfloat16)
# The fused kernel steps through I in whole vectors (8 values on AVX2, 16 on AVX-512) with
# aligned loads: a multiple of 32 and 64-byte-aligned operands suit every build
PACK_MULTIPLE, PACK_ALIGN = 32, 64


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 of a ``(O, I)`` floating weight.

    Returns:
        ``(q, s)``: ``q`` ``(O, I)`` int8 in ``[-127, 127]`` and ``s`` ``(O,)``
        in the weight's dtype and on its device, with ``|w - q s| <= s / 2``.

    Raises:
        InputError: not a 2-D float32/float64/bfloat16/float16 tensor, or a
            value that is not finite; the message names expected and actual.
    """
    if not isinstance(weight, torch.Tensor):
        raise InputError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2 or weight.dtype not in FLOATS:
        raise InputError(
            f"weight must be a 2-D tensor of dtype float32, float64, bfloat16 or float16, "
            f"got {weight.dim()}-D {weight.dtype}"
        )
    w = weight.detach().to(torch.float64)  # (O, I)
    if not bool(torch.isfinite(w).all()):
        raise InputError("weight must be finite, got inf or NaN")
    amax = w.abs().amax(dim=1)  # (O,) float64
    scales = (amax / QMAX).to(weight.dtype)  # (O,) rounded to nearest in the dtype
    up = torch.nextafter(scales, torch.full_like(scales, float("inf")))  # (O,) the next value
    scales = torch.where(scales.to(torch.float64) * QMAX < amax, up, scales)  # (O,) rounded up
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # (O,) a zero row: 1
    q = torch.round(w / scales.to(torch.float64)[:, None])  # (O, I) float64, ties to even
    return q.clamp_(-QMAX, QMAX).to(torch.int8), scales


class Int8Linear(nn.Module):
    """A ``nn.Linear`` whose weight is stored as int8 rows and float scales.

    Buffers (the ``state_dict``): ``qweight`` ``(O, I)`` int8, ``scales``
    ``(O,)`` and ``bias`` ``(O,)`` or None, both in the layer's float dtype
    (``model.to(dtype)`` moves them; int8 stays int8). ``weight`` is a
    read-only ``(O, I)`` stand-in with the dtype, device and shape of the
    float weight it replaced, for the stages that check an input against a
    layer's weight, and NaN values so no code can compute with it by mistake;
    ``dequantize()`` gives the values.
    """

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
        if dtype not in FLOATS:
            raise InputError(f"dtype must be float32, float64, bfloat16 or float16, got {dtype}")
        self.in_features, self.out_features = in_features, out_features
        shape = (out_features, in_features)
        self.register_buffer("qweight", torch.zeros(shape, dtype=torch.int8, device=device))
        self.register_buffer("scales", torch.ones(out_features, dtype=dtype, device=device))
        b = torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        self.register_buffer("bias", b)

    @property
    def weight(self) -> torch.Tensor:
        """``(O, I)`` NaN view in the scales' dtype and device (no storage of its own)."""
        nan = self.scales.new_full((), float("nan"))  # () one element
        return nan.expand(self.out_features, self.in_features)  # (O, I) stride 0

    def dequantize(self) -> torch.Tensor:
        """The float weight the layer computes with: ``q * s``, ``(O, I)`` in the scales' dtype."""
        return self.qweight.to(self.scales.dtype) * self.scales[:, None]  # (O, I)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., I)`` in the layer's dtype and device -> ``(..., O)``.

        Raises:
            InputError: ``x`` is not a tensor, its last dim is not ``I``, or its
                dtype or device differ from the layer's (nothing is cast).
        """
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise InputError(f"x must be (..., {self.in_features}), got {got}")
        s, work = self.scales, _autocast_dtype(x)
        if x.device != s.device or x.dtype not in (s.dtype, work):
            want = s.dtype if work is None else f"{s.dtype} or {work} (autocast)"
            raise InputError(
                f"x must be {want} on {s.device} (the layer's), got {x.dtype} on {x.device}"
            )
        dtype = work or x.dtype  # the dtype F.linear would run in
        if x.device.type == "cpu" and dtype in BF16_PRODUCT:
            flat = x.reshape(-1, self.in_features)  # (N, I)
            y = self._bf16_product(flat).to(dtype).view(*x.shape[:-1], self.out_features)
        else:
            # F.linear autocasts as nn.Linear does; the int8 weight goes straight to that dtype
            y = F.linear(x, self.qweight.to(work or x.dtype))  # (..., O)
            y = y * s.to(y.dtype)  # (..., O) per-output-channel scales
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)  # (..., O)
        return y

    def _bf16_product(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, I)`` float -> ``(N, O)`` bfloat16: ``x @ (q s)^T`` in bfloat16 activations.

        ``x`` and the scales rounded to bfloat16, each ``q * s`` and the sum in
        float32, the sum rounded once to bfloat16: ``aten._weight_int8pack_mm``
        where ``I`` is a multiple of ``PACK_MULTIPLE``, else the same roundings
        through ``F.linear`` in float32. The latter also where autograd tracks
        ``x`` (the kernel has no derivative; this way the roundings of ``x`` and
        of the result pass gradients straight through) and, under
        ``torch.compile``, for a layer whose scales are not bfloat16 already:
        inductor lowers the kernel itself and wants its scales in memory, which
        a conversion inside the graph is not.
        """
        packable = self.in_features % PACK_MULTIPLE == 0 and not (
            torch.is_grad_enabled() and x.requires_grad
        )
        if packable and not torch.compiler.is_compiling():
            return _pack_mm(x, self.qweight, self.scales)  # (N, O)
        if packable and x.dtype == self.scales.dtype == torch.bfloat16:  # compiled
            fused: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)
            return fused  # (N, O)
        sb = self.scales.to(torch.bfloat16).to(torch.float32)  # (O,) as the kernel reads them
        w = self.qweight.to(torch.float32) * sb[:, None]  # (O, I) each q * s in float32
        return F.linear(x.to(torch.bfloat16).to(torch.float32), w).to(torch.bfloat16)  # (N, O)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, dtype={self.scales.dtype}"
        )


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it where ``t`` is not contiguous and 64-byte aligned."""
    if t.is_contiguous() and t.data_ptr() % PACK_ALIGN == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)  # the allocator aligns to 64 bytes


def _pack_mm(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``aten._weight_int8pack_mm`` of ``x`` ``(N, I)`` and the scales in bfloat16: ``(N, O)``.

    ``q`` is ``(O, I)`` int8 and ``s`` ``(O,)``, with ``I`` a multiple of
    ``PACK_MULTIPLE``. The kernel reads ``I`` in whole vectors with aligned
    loads and checks neither (a ragged or misaligned operand reads the wrong
    bytes or faults), so the operands are made contiguous and aligned here.
    """
    xb = _aligned(x.to(torch.bfloat16))  # (N, I)
    out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(xb, _aligned(q), s.to(torch.bfloat16))
    return out  # (N, O) bfloat16


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype ``F.linear`` runs ``x`` in under ``torch.autocast`` (None: not autocast).

    Autocast casts float32 operands only; float64 stays float64.
    """
    kind = x.device.type
    if x.dtype == torch.float64 or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def quantize_linear(linear: nn.Module) -> Int8Linear:
    """A new ``Int8Linear`` from an ``nn.Linear`` (which is left as it was).

    Same device, float dtype (the scales' and bias's) and training flag.

    Raises:
        InputError: ``linear`` is not an ``nn.Linear`` (an ``Int8Linear`` is
            already quantized), or its weight is not float32, float64,
            bfloat16 or float16.
    """
    if not isinstance(linear, nn.Linear):
        raise InputError(f"expected an nn.Linear, got {type(linear).__name__}")
    w = linear.weight  # (O, I)
    q, s = quantize_weight(w)  # (O, I) int8, (O,)
    out = Int8Linear(
        w.shape[1], w.shape[0], linear.bias is not None, dtype=w.dtype, device=w.device
    )
    with torch.no_grad():
        out.qweight.copy_(q)
        out.scales.copy_(s)
        if linear.bias is not None and out.bias is not None:
            out.bias.copy_(linear.bias)
    out.train(linear.training)
    return out


def _targets(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """``(parent, name, linear)`` for every ``nn.Linear`` child whose weight no other
    module holds (a tied weight counts twice in ``named_parameters(remove_duplicate=False)``)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    out = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and seen.get(id(child.weight), 0) == 1:
                out.append((parent, name, child))
    return out


def quantize_int8(model: nn.Module) -> nn.Module:
    """Swap every untied ``nn.Linear`` inside ``model`` for an ``Int8Linear``, in place.

    A tied Linear (GPT's head, which shares the embedding's weight) stays
    float, as do embeddings and norms. Every weight is checked before any
    module changes. Returns ``model``.

    Raises:
        InputError: ``model`` is not an ``nn.Module``, is itself a Linear (use
            ``quantize_linear``), already holds an ``Int8Linear``, holds no
            untied ``nn.Linear``, or a weight has a dtype ``quantize_weight``
            refuses; nothing is changed then.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"expected an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Linear):
        raise InputError("expected a module holding Linear layers, got an nn.Linear itself")
    for name, module in model.named_modules():
        if isinstance(module, Int8Linear):
            raise InputError(f"expected a float model, got {name or 'model'} already quantized")
    targets = _targets(model)
    if not targets:
        raise InputError(f"expected an untied nn.Linear inside {type(model).__name__}, got none")
    for _, _, linear in targets:
        if linear.weight.dtype not in FLOATS:
            raise InputError(f"expected Linear weights of a float dtype, got {linear.weight.dtype}")
    for parent, name, linear in targets:
        parent.add_module(name, quantize_linear(linear))  # replaces the child of that name
    return model
