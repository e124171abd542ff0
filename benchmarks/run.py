"""``nox -s bench``: every figure beside its reference, as a ratio, in one run.

    python -m benchmarks.run [--device cpu|cuda|mps] [--quick] [--no-compile] [--write]

Prints the table (stdout) a section at a time, each as soon as it is measured, so a
run stopped early keeps what it measured; the load average, the wall time, the
targets and the sanity check close it. A progress line per section and step
goes to stderr.
Writes nothing unless asked: ``--write`` writes ``benchmarks/results/``
(``bench.json``, ``bench.txt``, the table, and ``tokens_per_s.png``) and puts
the table into ``README.md`` between the ``<!-- bench:start -->`` /
``<!-- bench:end -->`` markers; ``--out DIR`` writes the three files to DIR
only. ``--quick`` is a smoke run (QUICK_TAKES): the small training config
only, one attention shape, fewer rounds, a short decode, no torch.compile.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import decode, progress, report, rope_autocast, train
from benchmarks import experiments as downstream
from benchmarks import reference as ref
from benchmarks.progress import note, section
from benchmarks.timing import matmul, measure, sync
from benchmarks.where import load_line, machine
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.rope import apply_rope, rope_cache

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: How long ``--quick`` took, measured (the README says where): printed by --help.
QUICK_TAKES = "about 4 minutes: 3 min 54 s on the shared 2-core CPU at a load average of 5 to 6"

# The sections collect() has printed to stdout in this run (main prints the rest).
_PRINTED: list[str] = []


def _show(res: dict[str, Any], key: str) -> None:
    """Print section ``key`` of the table now (stdout, flushed): a killed run keeps it."""
    lines = report.header_lines(res) if key == "header" else report.section_lines(res, key)
    print("\n".join(lines) + "\n" if lines else "", end="", flush=True)
    _PRINTED.append(key)


def matmul_peak(device: torch.device, rounds: int, quick: bool = False) -> float:
    """Measured float32 matmul FLOP/s: the best median over a few square sizes."""
    best = 0.0
    sizes = (1024, 2048) if device.type == "cpu" else (4096, 8192)
    for n in sizes[:1] if quick else sizes:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        stat = measure({"mm": matmul(a, b)}, device, rounds=rounds)["mm"]
        best = max(best, 2.0 * n**3 / stat.median)
    return best


def bench_rope(device: torch.device, rounds: int) -> dict[str, Any]:
    B, H, T, D = 8, 8, 1024, 64
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen).to(device)
    k = torch.randn(B, H, T, D, generator=gen).to(device)
    sin, cos = rope_cache(T, D, device=device)
    want = apply_rope(q, k, sin, cos)
    fns = {"apply_rope": lambda: apply_rope(q, k, sin, cos)}
    if device.type != "mps":  # MPS has no complex dtype
        table = ref.complex_rope_table(sin, cos)
        got = ref.rope_complex(q, k, table)
        torch.testing.assert_close(got, want)
        fns["complex multiplication"] = lambda: ref.rope_complex(q, k, table)
    sin_h, cos_h = ref.half_split_tables(sin, cos)
    qh, kh = ref.to_half_split(q), ref.to_half_split(k)  # weights permuted once, offline
    got = ref.rope_half_split(qh, kh, sin_h, cos_h)
    torch.testing.assert_close(got, tuple(ref.to_half_split(w) for w in want))
    fns["rotate_half (permuted channels)"] = lambda: ref.rope_half_split(qh, kh, sin_h, cos_h)
    fns["textbook reshape+stack"] = lambda: ref.rope_textbook(q, k, sin, cos)
    with torch.no_grad():
        stats = measure(fns, device, rounds=rounds)
    return {"shape": [B, H, T, D], "stats": {n: s.as_dict() for n, s in stats.items()}}


def _attention_case(shape: tuple[int, int, int, int], device: torch.device, rounds: int) -> Any:
    B, H, T, D = shape
    cfg = ModelConfig(V=2, T=T, C=H * D, L=1, H=H, d_ff=1, dropout=0.0)
    core = CausalSelfAttention(cfg).to(device)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(device) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(True)
    grad = torch.randn(B, H, T, D, generator=gen).to(device)
    grad_bthd = grad.transpose(1, 2)  # the explicit core returns (B, T, H, D)

    def explicit() -> object:
        o, _ = core._attend(q, k, v, 0, None, return_attn=False)
        return torch.autograd.grad(o, (q, k, v), grad_bthd)

    def sdpa() -> object:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(o, (q, k, v), grad)

    def textbook() -> object:
        return torch.autograd.grad(ref.attention_textbook(q, k, v), (q, k, v), grad)

    with torch.no_grad():
        o_e, _ = core._attend(q, k, v, 0, None, return_attn=False)
        o_s = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(o_e.transpose(1, 2), o_s, rtol=1e-4, atol=1e-5)
    stats = measure(
        {"explicit core": explicit, "SDPA is_causal": sdpa, "textbook": textbook},
        device,
        rounds=rounds,
    )
    return {"shape": list(shape), "stats": {n: s.as_dict() for n, s in stats.items()}}


ATTENTION_SHAPES = ((4, 8, 256, 64), (1, 8, 1024, 64))


def bench_attention(device: torch.device, rounds: int, quick: bool = False) -> list[dict[str, Any]]:
    out = []
    for shape in ATTENTION_SHAPES[:1] if quick else ATTENTION_SHAPES:
        note(f"{shape} (B, H, T, D): explicit core, SDPA, textbook, forward + backward")
        out.append(_attention_case(shape, device, rounds))
    return out


def bench_train(device: torch.device, rounds: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for config, (cfg, batch) in train.CONFIGS.items():
        if quick and config != "small":
            continue  # the default config's steps take most of a full run on a CPU
        heavy = config == "default"
        # A CPU without bfloat16 arithmetic emulates it (several times slower than
        # float32 here): the default config's bf16 steps would take most of the run.
        variants = [v for v in train.VARIANTS if not (heavy and device.type == "cpu" and v[2])]
        steps = {}
        params = {}
        for name, kind, autocast in variants:
            model = train.build(kind, cfg, device)
            params[kind] = train.n_params(model)
            steps[name] = train.make_step(model, cfg, batch, cfg.T, device, autocast=autocast)
        assert len(set(params.values())) == 1, f"models differ in size: {params}"
        n = 1024 if device.type == "cpu" else 4096
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

        # The matmul peaks are timed in the same rounds as the steps, so MFU compares
        # like with like even when the machine's load drifts. The bf16 peak is the
        # faster of the two forms the steps use (projections, attention matmuls):
        # where bfloat16 is emulated they differ by an order of magnitude.
        note(f"{config} config: {', '.join(steps)} steps and the matmul peaks, interleaved")
        stats = measure(
            {
                **steps,
                "matmul": matmul(a, b),
                "matmul bf16": train.autocast_matmul(a, b, device, linear=False),
                "matmul bf16 linear": train.autocast_matmul(a, b, device, linear=True),
            },
            device,
            rounds=3 if heavy else rounds,
            warmup=1,
            min_sample_s=0.0 if (heavy or quick) else 0.5,
        )
        del steps
        note(f"{config} config: peak memory of each step (one profiled step each)")
        memory = {
            name: train.peak_memory(kind, config, device, autocast)
            for name, kind, autocast in variants
        }
        tokens = batch * cfg.T
        rows.append(
            {
                "config": config,
                "cfg": {**cfg.__dict__, "batch": batch},
                "params": params["explicit"],
                "tokens_per_step": tokens,
                "flops_per_step": tokens * train.flops_per_token(cfg, params["explicit"], cfg.T),
                "stats": {k: v.as_dict() for k, v in stats.items() if not k.startswith("matmul")},
                "matmul_peak_flops": 2.0 * n**3 / stats["matmul"].median,
                "matmul_bf16_peak_flops": 2.0
                * n**3
                / min(stats["matmul bf16"].median, stats["matmul bf16 linear"].median),
                "memory": memory,
            }
        )
    return rows


def bench_compile(device: torch.device, rounds: int) -> dict[str, Any]:
    cfg, batch = train.CONFIGS["small"]
    eager = train.make_step(train.build("explicit", cfg, device), cfg, batch, cfg.T, device)
    model = train.build("explicit", cfg, device)
    compiled_model = torch.compile(model, fullgraph=True)
    compiled = train.make_step(compiled_model, cfg, batch, cfg.T, device)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    try:
        compiled()
        compiled()
        sync(device)
    except Exception as exc:  # no C++ toolchain, unsupported backend, ...
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    compile_s = time.perf_counter() - t0
    stats = measure({"eager": eager, "compiled": compiled}, device, rounds=rounds, warmup=1)
    return {
        "config": "small",
        "compile_s": compile_s,
        "stats": {n: s.as_dict() for n, s in stats.items()},
    }


def bench_sweep(device: torch.device, rounds: int, quick: bool) -> dict[str, Any]:
    base, _ = train.CONFIGS["small"]
    lengths = (128, 512) if quick else (64, 128, 256, 512, 1024)
    cfg = ModelConfig(**{**base.__dict__, "T": max(lengths)})
    tokens = 2048
    series: dict[str, list[float]] = {kind: [] for kind in train.MODELS}
    for t in lengths:
        note(f"T={t}: {', '.join(train.MODELS)} steps of {tokens} tokens")
        steps = {
            kind: train.make_step(train.build(kind, cfg, device), cfg, tokens // t, t, device)
            for kind in train.MODELS
        }
        stats = measure(steps, device, rounds=rounds, warmup=1, min_sample_s=0.0)
        for kind in train.MODELS:
            series[kind].append(tokens / stats[kind].median)
    return {"T": list(lengths), "tokens_per_step": tokens, "tokens_per_s": series}


def collect(device: torch.device, quick: bool, compile: bool) -> dict[str, Any]:
    """Every section's figures, with a progress line per section and step (stderr)."""
    rounds = 2 if quick else 7
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(device),
        "device": str(device),
        "quick": quick,
        "load_average": [os.getloadavg()[0]],
        "cores": os.cpu_count(),
    }
    t0 = time.perf_counter()
    if quick:
        section(f"--quick takes {QUICK_TAKES}")
    _show(res, "header")
    section("matmul peak")
    res["matmul_peak_flops"] = matmul_peak(device, rounds, quick)
    _show(res, "matmul_peak_flops")
    section("rope")
    res["rope"] = bench_rope(device, rounds)
    _show(res, "rope")
    section("rope under autocast")
    res["rope_autocast"] = rope_autocast.bench(device, rounds)
    _show(res, "rope_autocast")
    section("attention core")
    res["attention"] = bench_attention(device, rounds, quick)
    _show(res, "attention")
    section("training steps" + (" (small config only: --quick)" if quick else ""))
    res["train"] = bench_train(device, 1 if quick else 5, quick)
    _show(res, "train")
    if compile and not quick:
        section("torch.compile (compiling takes a minute or two on a CPU)")
        res["compile"] = bench_compile(device, 3)
    else:
        res["compile"] = {"skipped": "--quick" if quick else "--no-compile"}
    _show(res, "compile")
    section("tokens/s sweep")
    res["sweep"] = bench_sweep(device, 1 if quick else 3, quick)
    _show(res, "sweep")
    section("kv_cache decode: generate, recompute loop, SDPA static cache")
    res["decode"] = decode.bench(device, quick=quick, compile=compile and not quick)
    _show(res, "decode")
    section("downstream experiment: v0/v1 steps, DDP")
    res["experiments"] = downstream.bench(device, 1 if quick else 3, quick)
    _show(res, "experiments")
    res["targets"] = [{"target": n, "met": ok, "value": d} for n, ok, d in report.targets(res)]
    res["wall_s"] = time.perf_counter() - t0
    res["load_average"].append(os.getloadavg()[0])
    section("done")
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run ({QUICK_TAKES}; see above)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile step")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write benchmarks/results/ (or --out) and the README's bench section",
    )
    parser.add_argument("--out", type=Path, help="write bench.json, bench.txt and the plot here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    _PRINTED.clear()
    with progress.running():
        res = collect(device, args.quick, not args.no_compile)
    text = report.table(res)
    if _PRINTED:  # the header and each section went out as they were measured
        load = res.get("load_average") or []
        closing = [load_line(load, res.get("cores") or os.cpu_count() or 1)]
        closing = closing if len(load) == 2 else []
        if "wall_s" in res:
            closing.append(f"wall time: {res['wall_s']:.0f} s")
        print("\n".join([*closing, *report.closing_lines(res)]) + "\n", end="")
    else:
        print(text, end="")
    if args.write or args.out is not None:
        written = report.write(res, text, args.out or RESULTS, readme=args.write)
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
