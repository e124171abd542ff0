"""The downstream experiment in the bench: v0 and v1 training steps, and DDP scaling.

- Training tokens/s and MFU of one AdamW step for v0 (built by
  ``niels_gpt_experiments`` from the block stage) and v1 (the backbone stage),
  at equal parameter count, beside the nanoGPT-style reference; float32, and
  bf16 autocast where the stages run under it (until they do, the row says
  why not).
- The same global batch of v1 steps on 2 gloo processes (DDP, one thread
  each) against 1 process with every core, and against 1 process with one
  thread (the per-process baseline of ideal scaling).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import train
from benchmarks.progress import note
from benchmarks.reference import NanoGPT
from benchmarks.timing import matmul, measure

ROOT = Path(__file__).resolve().parent.parent
try:
    import niels_gpt_experiments  # noqa: F401
except ImportError:  # the shared dev env installs the stages, not this downstream package
    sys.path.insert(0, str(ROOT / "experiments" / "src"))
from niels_gpt_experiments.launch import run_local  # noqa: E402  (after the path fix-up)
from niels_gpt_experiments.models import build_model, matched_v0_d_ff, n_params  # noqa: E402
from niels_gpt_experiments.parallel import no_buffer_sync  # noqa: E402

KINDS = ("v0", "v1", "reference")
DDP_STEPS = 6


def _config(kind: str, cfg: Any) -> Any:
    """The bench's small v1 config; v0 gets the parameter-matched GELU width."""
    return dataclasses.replace(cfg, d_ff=matched_v0_d_ff(cfg)) if kind == "v0" else cfg


def _model(kind: str, cfg: Any, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    if kind == "reference":
        return NanoGPT(cfg).to(device)
    return build_model(kind, _config(kind, cfg)).to(device)  # type: ignore[arg-type]


def _step(model: nn.Module, V: int, batch: int, T: int, device: torch.device, dtype: Any) -> Any:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (batch, T + 1), generator=gen).to(device)
    x, y = ids[:, :-1], ids[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        ctx = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with ctx:
            logits = model(x)  # (B, T, V)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        torch.autograd.backward(loss)
        opt.step()

    return step


def bench_models(device: torch.device, rounds: int) -> dict[str, Any]:
    """fp32 and bf16-autocast steps of v0, v1 and the reference, all in one interleaved
    measure with the float32 and the bfloat16 matmul peaks, so every ratio and MFU
    compares figures taken under the same load; a bf16 row's MFU is against the
    bfloat16 peak (against the float32 one it read 150-210% on an AVX512-BF16 CPU)."""
    cfg, batch = train.CONFIGS["small"]
    out: dict[str, Any] = {"cfg": {**cfg.__dict__, "batch": batch}, "rows": {}, "errors": {}}
    steps = {}
    for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        for kind in KINDS:
            name = f"{kind} {precision}"
            model = _model(kind, cfg, device)
            step = _step(model, cfg.V, batch, cfg.T, device, dtype)
            try:
                step()
            except Exception as exc:  # a model that does not run under autocast
                out["errors"][name] = f"{type(exc).__name__}: {exc}"[:160]
                continue
            steps[name] = step
            params = n_params(model)
            out["rows"][name] = {
                "params": params,
                "flops_per_step": batch * cfg.T * train.flops_per_token(cfg, params, cfg.T),
            }
    n = 1024 if device.type == "cpu" else 4096
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    peaks = {
        "matmul": matmul(a, b),
        "matmul bf16": train.autocast_matmul(a, b, device, linear=False),
        "matmul bf16 linear": train.autocast_matmul(a, b, device, linear=True),
    }
    note(f"{', '.join(steps)} steps and the matmul peaks, interleaved, {rounds} rounds")
    stats = measure(  # each step already ran once above: that was its warm-up
        {**steps, **peaks}, device, rounds=rounds, warmup=1, min_sample_s=0.0 if rounds < 2 else 0.2
    )
    fp32 = 2.0 * n**3 / stats["matmul"].median
    bf16 = 2.0 * n**3 / min(stats["matmul bf16"].median, stats["matmul bf16 linear"].median)
    out["matmul_peak_flops"], out["matmul_bf16_peak_flops"] = fp32, bf16
    for name in steps:
        row = out["rows"][name]
        peak = bf16 if name.endswith(" bf16") else fp32
        row["tokens_per_s"] = batch * cfg.T / stats[name].median
        row["mfu"] = row["flops_per_step"] / stats[name].median / peak
        row["matmul_peak_flops"] = peak
    return out


def _ddp_worker(batch: int, T: int, result: str) -> None:
    """One rank: DDP over v1, ``DDP_STEPS`` timed steps after 2 warm-up steps."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cfg, _ = train.CONFIGS["small"]
    world, rank = dist.get_world_size(), dist.get_rank()
    model = DistributedDataParallel(_model("v1", cfg, torch.device("cpu")), **no_buffer_sync())
    step = _step(model, cfg.V, batch // world, T, torch.device("cpu"), None)
    for _ in range(2):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(DDP_STEPS):
        step()
    dist.barrier()
    if rank == 0:
        Path(result).write_text(str(time.perf_counter() - t0))


def bench_ddp(quick: bool) -> dict[str, Any]:
    """Tokens/s of the same global batch on 1 process and on 2 DDP processes (gloo, CPU)."""
    cfg, batch = train.CONFIGS["small"]
    T = 128 if quick else cfg.T
    out: dict[str, Any] = {"batch": batch, "T": T, "steps": DDP_STEPS, "tokens_per_s": {}}
    before = torch.get_num_threads()
    note(f"DDP: 1 process, then 2 gloo processes, global batch {batch} x T={T}")
    for threads in sorted({before, 1}, reverse=True):
        torch.set_num_threads(threads)
        step = _step(
            _model("v1", cfg, torch.device("cpu")), cfg.V, batch, T, torch.device("cpu"), None
        )
        stat = measure({"one": step}, torch.device("cpu"), rounds=2, warmup=2, min_sample_s=0.0)
        out["tokens_per_s"][f"1 process, {threads} thread(s)"] = batch * T / stat["one"].median
    torch.set_num_threads(before)
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "seconds"
        run_local(2, _ddp_worker, (batch, T, str(result)), timeout_s=600, threads=1)
        seconds = float(result.read_text())
    out["tokens_per_s"]["2 processes (DDP, gloo), 1 thread each"] = DDP_STEPS * batch * T / seconds
    return out


def bench(device: torch.device, rounds: int, quick: bool) -> dict[str, Any]:
    """Everything this module measures, for ``res["experiments"]`` of the bench."""
    res: dict[str, Any] = {"models": bench_models(device, rounds)}
    if device.type == "cpu":
        res["ddp"] = bench_ddp(quick)
    return res


def table_lines(res: dict[str, Any]) -> list[str]:
    """The bench table's section for the downstream experiment."""
    exp = res.get("experiments")
    if exp is None:
        return []
    m = exp["models"]
    c = m["cfg"]
    lines = [
        "Downstream experiment (niels_gpt_experiments): v0 vs v1 training step (AdamW)",
        f"  V={c['V']} T={c['T']} C={c['C']} L={c['L']} H={c['H']} batch={c['batch']}; "
        "v0 = block stage (LayerNorm + GELU) at v1's parameter count",
    ]
    ref = m["rows"].get("reference fp32", {}).get("tokens_per_s")
    for name, row in m["rows"].items():
        if "tokens_per_s" not in row:
            continue
        ratio = f"x{row['tokens_per_s'] / ref:5.2f} vs reference fp32" if ref else ""
        lines.append(
            f"    {name:16s}{row['params'] / 1e6:6.2f}M params {row['tokens_per_s']:8.0f} tok/s  "
            f"{ratio}   MFU {100 * row['mfu']:5.1f}%"
        )
    if "matmul_bf16_peak_flops" in m:
        lines.append(
            f"    (one interleaved measure; MFU against the float32 matmul peak, "
            f"{m['matmul_peak_flops'] / 1e9:.1f} GFLOP/s, or for bf16 rows the bfloat16 one, "
            f"{m['matmul_bf16_peak_flops'] / 1e9:.1f} GFLOP/s)"
        )
    for name, error in m["errors"].items():
        lines.append(f"    {name:16s}not run: {error}")
    ddp = exp.get("ddp")
    if ddp:
        lines.append(
            f"  DDP on gloo, v1, global batch {ddp['batch']} x T={ddp['T']}, {ddp['steps']} steps "
            "(this machine's cores are shared by every process)"
        )
        tps = ddp["tokens_per_s"]
        one_all = max(v for k, v in tps.items() if k.startswith("1 process"))
        one_single = tps.get("1 process, 1 thread(s)", one_all)
        for name, value in tps.items():
            lines.append(f"    {name:42s}{value:8.0f} tok/s")
        two = tps["2 processes (DDP, gloo), 1 thread each"]
        lines.append(
            f"    scaling: 2 processes / 1 process on all cores = {two / one_all:.2f}; "
            f"per-process efficiency vs 2 x (1 thread) = {two / (2 * one_single):.2f}"
        )
    lines.append("")
    return lines
