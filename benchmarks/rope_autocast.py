"""RoPE under bfloat16 autocast: the two ways the attention module could hand q and k to it.

``apply_rope`` casts nothing, so under autocast its caller picks the dtype:

- ``float32 rotation``: q and k (bfloat16 from the autocast projection) go up to
  float32, meet the float32 tables, and the result comes back to bfloat16
  (what ``niels_gpt.model.attention`` does);
- ``bfloat16 tables``: the tables go down to bfloat16 and the rotation runs
  there.

Both are timed (forward, and forward + backward) and measured against the
float64 rotation of the same bfloat16 q: the largest error in bfloat16 ulps
of the rotated pair's length, where 0.5 is what rounding the exact result once
costs at most.

    python -m benchmarks.rope_autocast [--device cpu|cuda|mps] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

import torch

from benchmarks.timing import measure
from niels_gpt.model.rope import apply_rope, rope_cache

SHAPE = (8, 8, 1024, 64)  # (B, H, T, D)
LOW = torch.bfloat16


def _ulp_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest |got - exact| in bfloat16 ulps of the rotated pair's length.

    A rotation keeps each pair's length, and a rotated channel can cancel to
    nearly zero, so the pair length (not the channel's own size) is the
    scale an error is judged against.
    """
    exact = exact.cpu()
    pairs = exact.reshape(*exact.shape[:-1], -1, 2)  # (B, H, T, D/2, 2)
    length = pairs.pow(2).sum(-1, keepdim=True).sqrt().expand_as(pairs).flatten(-2)  # (B, H, T, D)
    floor = torch.finfo(LOW).tiny
    spacing = torch.exp2(torch.floor(torch.log2(length.clamp_min(floor)))) * torch.finfo(LOW).eps
    return float(((got.cpu().double() - exact) / spacing).abs().max())  # (B, H, T, D) -> max


def bench(device: torch.device, rounds: int) -> dict[str, Any]:
    B, H, T, D = SHAPE
    C = H * D
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, C, generator=gen).to(device)  # (B, T, C)
    w = (torch.randn(2 * C, C, generator=gen) / math.sqrt(C)).to(device)  # (2C, C)
    with torch.autocast(device.type, dtype=LOW):
        qk = torch.nn.functional.linear(x, w)  # (B, T, 2C) in bfloat16
    q, k = (t.view(B, T, H, D).transpose(1, 2) for t in torch.split(qk, C, dim=-1))  # (B, H, T, D)
    sin, cos = rope_cache(T, D, device=device)  # float32
    sin16, cos16 = sin.to(LOW), cos.to(LOW)

    def float32_rotation(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ra, rb = apply_rope(a.float(), b.float(), sin, cos)
        return ra.to(LOW), rb.to(LOW)

    def low_tables(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope(a, b, sin16, cos16)

    ways = {"float32 rotation": float32_rotation, "bfloat16 tables": low_tables}
    exact_q, _ = apply_rope(
        q.double().cpu(), k.double().cpu(), *rope_cache(T, D, dtype=torch.float64)
    )
    errors = {name: _ulp_error(fn(q, k)[0], exact_q) for name, fn in ways.items()}
    with torch.no_grad():
        forward = measure(
            {n: functools.partial(fn, q, k) for n, fn in ways.items()}, device, rounds=rounds
        )
    qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
    grad = torch.randn(q.shape, generator=gen).to(device, LOW)  # (B, H, T, D)

    def fwd_bwd(fn: Any) -> Any:
        def run() -> object:
            ra, rb = fn(qg, kg)
            return torch.autograd.grad((ra, rb), (qg, kg), (grad, grad))

        return run

    both = measure({n: fwd_bwd(fn) for n, fn in ways.items()}, device, rounds=rounds)
    return {
        "shape": list(SHAPE),
        "max_error_ulp": errors,
        "forward": {n: s.as_dict() for n, s in forward.items()},
        "forward_backward": {n: s.as_dict() for n, s in both.items()},
    }


def lines(res: dict[str, Any]) -> list[str]:
    out = [f"RoPE under bfloat16 autocast, q and k of {tuple(res['shape'])} (B, H, T, D)"]
    ref = "float32 rotation"
    for name in res["forward"]:
        fwd = res["forward"][name]["median_s"]
        both = res["forward_backward"][name]["median_s"]
        ratio = fwd / res["forward"][ref]["median_s"]
        out.append(
            f"  {name:20s} fwd {fwd * 1e3:8.2f} ms (x{ratio:4.2f})   fwd+bwd {both * 1e3:8.2f} ms"
            f"   max error {res['max_error_ulp'][name]:5.2f} ulp"
        )
    out.append(
        "  (the attention module rotates in float32; ulps of the pair length, 0.5 = one rounding)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    res = bench(torch.device(args.device), rounds=3 if args.quick else 7)
    print("\n".join(lines(res)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
