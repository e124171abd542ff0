"""Which int8 kernel the quant stage runs: its choice against the alternative, on our shapes.

    python -m benchmarks.int8_kernels [--quick] [--threads N]

A decode step multiplies one row by every weight, so the candidates are timed
at one row on the default model's 40 linear layers (qkv, proj, w_a, w_g, w_o
of 8 blocks), then as whole greedy decodes of ``kv_cache.generate`` (a 64-token
prompt, 128 new tokens) on the same model:

- float32: ``F.linear`` on the float weights (the model as trained);
- int8, dequantize then matmul: ``F.linear(x, q.to(x.dtype)) * s`` (what
  ``Int8Linear`` ran before spec quant 3.0, and still runs off the CPU:
  gpt-fast's eager ``WeightOnlyInt8Linear``);
- int8, ``torch.ops.aten._weight_int8pack_mm(x, q, s)`` with float32 ``x``
  and ``s``, and with both in bfloat16 (torchao's CPU path);
- ``Int8Linear`` itself, as the stage runs it since 3.0 on a CPU: the fused
  kernel with bfloat16 activations, its casts and bias included.

The decodes compare float32 with the stage's int8 model and with a copy whose
layers dequantize then matmul; the tokens each shares with float32's are
counted (the bfloat16 activations are another rounding, so they may differ).
Timings are medians of interleaved rounds (``benchmarks.timing``); on a
shared machine they are noisy: the load average is printed.
"""

from __future__ import annotations

import argparse
import copy
import os
import types
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F

from benchmarks import train
from benchmarks.timing import measure
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate
from niels_gpt.model.quant import Int8Linear, quantize_int8

CFG = train.CONFIGS["default"][0]
PROMPT, NEW = 64, 128  # 448 new tokens: benchmarks.decode, float32 against int8


def _dequantize_forward(self: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """``Int8Linear.forward`` as it was before spec quant 3.0: dequantize, then ``F.linear``."""
    y = F.linear(x, self.qweight.to(x.dtype)) * self.scales  # (..., O)
    return y + self.bias if self.bias is not None else y


def _with_dequantize(model: GPT) -> GPT:
    """A copy of a quantized model whose int8 layers dequantize then matmul."""
    other = copy.deepcopy(model)
    for m in other.modules():
        if isinstance(m, Int8Linear):
            m.forward = types.MethodType(_dequantize_forward, m)  # type: ignore[method-assign]
    return other


def bench(quick: bool) -> list[str]:
    torch.manual_seed(0)
    dense = GPT(CFG).eval()
    quant = cast(GPT, quantize_int8(copy.deepcopy(dense)))
    deq = _with_dequantize(quant)
    linears: list[tuple[torch.nn.Linear, Int8Linear]] = []
    for i in range(CFG.L):
        for name in ("attn.qkv", "attn.proj", "mlp.w_a", "mlp.w_g", "mlp.w_o"):
            lin = dense.get_submodule(f"blocks.{i}.{name}")
            q = quant.get_submodule(f"blocks.{i}.{name}")
            assert isinstance(lin, torch.nn.Linear) and isinstance(q, Int8Linear)
            linears.append((lin, q))
    rows = {n: torch.randn(1, n) for n in {lin.in_features for lin, _ in linears}}  # (1, I)

    def run_f32() -> None:
        for lin, _ in linears:
            F.linear(rows[lin.in_features], lin.weight)

    def run_deq() -> None:
        for _, q in linears:
            F.linear(rows[q.in_features], q.qweight.to(torch.float32)) * q.scales

    def run_pack() -> None:
        for _, q in linears:
            torch.ops.aten._weight_int8pack_mm(rows[q.in_features], q.qweight, q.scales)

    rows16 = {n: r.to(torch.bfloat16) for n, r in rows.items()}  # (1, I) bfloat16
    scales16 = [q.scales.to(torch.bfloat16) for _, q in linears]  # (O,) bfloat16 each

    def run_pack16() -> None:
        for (_, q), s in zip(linears, scales16, strict=True):
            torch.ops.aten._weight_int8pack_mm(rows16[q.in_features], q.qweight, s)

    def run_layer() -> None:
        for _, q in linears:
            q(rows[q.in_features])

    layer_names = {
        "float32 F.linear": run_f32,
        "int8 dequantize then F.linear": run_deq,
        "int8 _weight_int8pack_mm, f32": run_pack,
        "int8 _weight_int8pack_mm, bf16": run_pack16,
        "int8 Int8Linear (3.0, CPU)": run_layer,
    }
    cpu = torch.device("cpu")
    with torch.no_grad():
        layer = measure(layer_names, cpu, rounds=5 if quick else 15)
    f32_bytes = sum(lin.weight.numel() * 4 for lin, _ in linears)
    i8_bytes = sum(q.qweight.numel() + q.scales.numel() * 4 for _, q in linears)
    out = [
        f"The default model's 40 linear layers at one row ({f32_bytes / 1e6:.1f} MB float32, "
        f"{i8_bytes / 1e6:.1f} MB int8 + scales), median of {5 if quick else 15}:"
    ]
    base = layer["float32 F.linear"].median
    for name, stat in layer.items():
        out.append(
            f"  {name:32s}{stat.median * 1e3:8.2f} ms   x{base / stat.median:5.2f} vs float32"
        )
    new = 32 if quick else NEW
    prompt = torch.randint(0, CFG.V, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    runs: dict[str, GPT] = {
        "float32 kv_cache.generate": dense,
        "int8 Int8Linear (3.0, CPU)": quant,
        "int8 (dequantize then F.linear)": deq,
    }
    ids: dict[str, torch.Tensor] = {}

    def decode(name: str) -> None:
        ids[name] = cast(torch.Tensor, generate(runs[name], prompt, new, temperature=0))

    stats = measure(
        {n: partial(decode, n) for n in runs},
        cpu,
        rounds=1 if quick else 3,
        warmup=1,
        min_sample_s=0.0,
    )
    out.append(f"Greedy decode, prompt {PROMPT}, {new} new tokens, whole runs, median:")
    base = stats["float32 kv_cache.generate"].median
    for name, stat in stats.items():
        same = int((ids[name] == ids["float32 kv_cache.generate"]).all(0)[PROMPT:].sum())
        out.append(
            f"  {name:32s}{new / stat.median:8.1f} tok/s  x{base / stat.median:5.2f} vs float32"
            f"   {same}/{new} tokens as float32's"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, 32 new tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    lines = bench(args.quick)
    load1 = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cores")
    print("\n".join(lines))
    print(f"load average (1, 5, 15 min) before {load0}, after {load1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
