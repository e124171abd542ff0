"""``nox -s bench``: every figure beside its reference, as a ratio, in one run.

    python -m benchmarks.run [--device cpu|cuda|mps] [--quick] [--no-compile]

Writes ``benchmarks/results/bench.json``, ``bench.txt`` (the table printed here)
and ``tokens_per_s.png``, and puts the table into ``README.md`` between the
``<!-- bench:start -->`` / ``<!-- bench:end -->`` markers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import decode, rope_autocast, train
from benchmarks import experiments as downstream
from benchmarks import reference as ref
from benchmarks.timing import measure, sync
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.rope import apply_rope, rope_cache

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MIB = 2**20


def machine(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    text = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({threads} threads)"
    if device.type == "cuda":
        text += f", {torch.cuda.get_device_name(device)}"
    return f"{text}, device {device}"


def matmul_peak(device: torch.device, rounds: int) -> float:
    """Measured float32 matmul FLOP/s: the best median over a few square sizes."""
    best = 0.0
    for n in (1024, 2048) if device.type == "cpu" else (4096, 8192):
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        stat = measure({"mm": lambda a=a, b=b: a @ b}, device, rounds=rounds)["mm"]
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


def bench_attention(device: torch.device, rounds: int) -> list[dict[str, Any]]:
    return [_attention_case(shape, device, rounds) for shape in ((4, 8, 256, 64), (1, 8, 1024, 64))]


def _autocast_matmul(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, *, linear: bool
) -> Callable[[], torch.Tensor]:
    """``a @ b`` (or ``linear(a, b)``, the projections' kernel) under bf16 autocast."""

    def run() -> torch.Tensor:
        with torch.autocast(device.type, dtype=train.AUTOCAST):
            return F.linear(a, b) if linear else a @ b

    return run


def bench_train(device: torch.device, rounds: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for config, (cfg, batch) in train.CONFIGS.items():
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
        stats = measure(
            {
                **steps,
                "matmul": lambda a=a, b=b: a @ b,
                "matmul bf16": _autocast_matmul(a, b, device, linear=False),
                "matmul bf16 linear": _autocast_matmul(a, b, device, linear=True),
            },
            device,
            rounds=2 if (heavy and quick) else (3 if heavy else rounds),
            warmup=1,
            min_sample_s=0.0 if heavy else 0.5,
        )
        del steps
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
        steps = {
            kind: train.make_step(train.build(kind, cfg, device), cfg, tokens // t, t, device)
            for kind in train.MODELS
        }
        stats = measure(steps, device, rounds=rounds, warmup=1, min_sample_s=0.0)
        for kind in train.MODELS:
            series[kind].append(tokens / stats[kind].median)
    return {"T": list(lengths), "tokens_per_step": tokens, "tokens_per_s": series}


# --- report -------------------------------------------------------------------


def _ms(stat: dict[str, Any]) -> str:
    return f"{stat['median_s'] * 1e3:9.2f} ms"


def _best(stat: dict[str, Any]) -> float:
    return float(min(stat["rounds_s"]))


def table(res: dict[str, Any]) -> str:
    lines = [f"niels_gpt bench - {res['date']}", f"machine: {res['machine']}"]
    lines.append(
        "ratios: medians over interleaved rounds; 'best rounds' = fastest round of each,"
        " the figure least touched by other load on the machine"
    )
    lines.append("")
    peak = res["matmul_peak_flops"]
    lines.append(f"float32 matmul peak (measured): {peak / 1e9:.1f} GFLOP/s")
    lines.append("")

    r = res["rope"]
    s = r["stats"]
    lines.append(f"RoPE forward, q and k of {tuple(r['shape'])} (B, H, T, D)")
    mine = s["apply_rope"]["median_s"]
    lines.append(f"  {'apply_rope (stage 003)':34s}{_ms(s['apply_rope'])}")
    for name, stat in s.items():
        if name != "apply_rope":
            ratio = mine / stat["median_s"]
            best = _best(s["apply_rope"]) / _best(stat)
            lines.append(
                f"  {name:34s}{_ms(stat)}   apply_rope / this = {ratio:5.2f}x"
                f" (best rounds {best:.2f}x)"
            )
    lines.append("")

    if "rope_autocast" in res:
        lines.extend(rope_autocast.lines(res["rope_autocast"]))
        lines.append("")

    lines.append("Attention core, forward + backward (explicit = stage 000 blocked core)")
    for a in res["attention"]:
        s = a["stats"]
        sd = s["SDPA is_causal"]["median_s"]
        lines.append(f"  {tuple(a['shape'])} (B, H, T, D)")
        sd_best = _best(s["SDPA is_causal"])
        for name, stat in s.items():
            lines.append(
                f"    {name:32s}{_ms(stat)}   / SDPA = {stat['median_s'] / sd:5.2f}x"
                f" (best rounds {_best(stat) / sd_best:.2f}x)"
            )
    lines.append("")

    lines.append("GPT v1 training step (AdamW, dropout 0), tokens/s and peak memory")
    for row in res["train"]:
        c = row["cfg"]
        flops = row["flops_per_step"]
        lines.append(
            f"  {row['config']}: V={c['V']} T={c['T']} C={c['C']} L={c['L']} H={c['H']} "
            f"d_ff={c['d_ff']} batch={c['batch']}  ({row['params'] / 1e6:.2f}M params)"
        )
        peak16 = row.get("matmul_bf16_peak_flops")
        lines.append(
            f"    matmul peak in these rounds: {row['matmul_peak_flops'] / 1e9:.1f} GFLOP/s"
            + (f" float32, {peak16 / 1e9:.1f} GFLOP/s bfloat16" if peak16 else "")
        )
        s = row["stats"]
        ref_t = s["reference"]["median_s"]
        ref_m = row["memory"]["reference"]["peak_bytes"]
        for name in s:
            secs = s[name]["median_s"]
            mem = row["memory"][name]["peak_bytes"]
            tps = row["tokens_per_step"] / secs
            peak = peak16 if name.endswith(" bf16") and peak16 else row["matmul_peak_flops"]
            mfu = flops / secs / peak
            lines.append(
                f"    {name:15s}{tps:9.0f} tok/s  x{ref_t / secs:5.2f} vs reference   "
                f"peak {mem / MIB:7.1f} MiB  x{mem / ref_m:5.2f}   MFU {100 * mfu:5.1f}%"
            )
    lines.append(f"  (peak memory: {res['train'][0]['memory']['explicit']['method']};")
    lines.append("   'bf16': the same step under bfloat16 autocast, float32 weights and AdamW,")
    lines.append("   on the CPU for the small config only;")
    lines.append("   MFU: nanoGPT's 6N + 12LCT FLOPs a token over a 1024^3 matmul's FLOP/s")
    lines.append("   (float32, or the faster bf16-autocast matmul or linear for the bf16 rows)")
    lines.append("   timed in the same rounds as the steps)")
    lines.append("")

    comp = res.get("compile")
    if comp is not None:
        if "error" in comp:
            lines.append(f"torch.compile: failed: {comp['error']}")
        else:
            s = comp["stats"]
            speedup = s["eager"]["median_s"] / s["compiled"]["median_s"]
            lines.append(
                f"torch.compile(fullgraph=True), explicit path, small config: "
                f"{_ms(s['eager']).strip()} eager -> {_ms(s['compiled']).strip()} compiled, "
                f"speed-up x{speedup:.2f} (compile {comp['compile_s']:.0f} s)"
            )
        lines.append("")

    sw = res["sweep"]
    lines.append(f"tokens/s against T (small config widths, {sw['tokens_per_step']} tokens a step)")
    lines.append("  " + f"{'T':>6s}" + "".join(f"{k:>12s}" for k in sw["tokens_per_s"]))
    for i, t in enumerate(sw["T"]):
        vals = "".join(f"{sw['tokens_per_s'][k][i]:12.0f}" for k in sw["tokens_per_s"])
        lines.append(f"  {t:6d}{vals}")
    lines.append("")

    if "decode" in res:
        lines.extend(decode.table_lines(res["decode"]))
        lines.append("")
    lines.extend(downstream.table_lines(res))
    lines.append("Targets")
    for name, ok, detail in targets(res):
        lines.append(f"  [{'met ' if ok else 'MISS'}] {name}: {detail}")
    return "\n".join(lines) + "\n"


def targets(res: dict[str, Any]) -> list[tuple[str, bool, str]]:
    out = []
    for a, limit in zip(res["attention"], (1.15, 2.0), strict=True):
        s = a["stats"]
        ratio = s["explicit core"]["median_s"] / s["SDPA is_causal"]["median_s"]
        T = a["shape"][2]
        best = _best(s["explicit core"]) / _best(s["SDPA is_causal"])
        out.append(
            (
                f"attention fwd+bwd T={T} <= {limit}x SDPA",
                ratio <= limit,
                f"{ratio:.2f}x (best rounds {best:.2f}x)",
            )
        )
    s = res["rope"]["stats"]
    fastest = min((n for n in s if n != "apply_rope"), key=lambda n: s[n]["median_s"])
    ratio = s["apply_rope"]["median_s"] / s[fastest]["median_s"]
    best = _best(s["apply_rope"]) / _best(s[fastest])
    out.append(
        (
            "apply_rope <= fastest formulation",
            ratio <= 1.0,
            f"{ratio:.2f}x of {fastest} (best rounds {best:.2f}x)",
        )
    )
    for row in res["train"]:
        st = row["stats"]
        ratio = st["reference"]["median_s"] / st["fastpath"]["median_s"]
        best = _best(st["reference"]) / _best(st["fastpath"])
        out.append(
            (
                f"fast path step >= reference ({row['config']})",
                ratio >= 1.0,
                f"{ratio:.2f}x the reference's tokens/s (best rounds {best:.2f}x)",
            )
        )
    if "decode" in res:
        out.extend(decode.targets(res["decode"]))
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sw = res["sweep"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    labels = {
        "explicit": "explicit path",
        "fastpath": "fast path (SDPA)",
        "reference": "nanoGPT-style reference",
    }
    for kind, values in sw["tokens_per_s"].items():
        ax.plot(sw["T"], values, marker="o", label=labels.get(kind, kind))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sw["T"], [str(t) for t in sw["T"]])
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("training tokens/s (AdamW step)")
    ax.set_title(f"GPT v1, C=256 L=4 H=4, {sw['tokens_per_step']} tokens/step", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.text(0.01, 0.01, f"{res['machine'][:110]}\n{res['date']}", fontsize=6, alpha=0.7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def update_readme(text: str, res: dict[str, Any]) -> None:
    readme = ROOT / "README.md"
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    body = (
        f"{start}\n## Benchmarks\n\n"
        f"Latest `nox -s bench` on {res['machine']}, {res['date']} "
        "(`benchmarks/results/`: JSON, this table, the tokens/s plot).\n\n"
        f"```text\n{text}```\n\n"
        "![tokens/s against T](benchmarks/results/tokens_per_s.png)\n"
        f"{end}\n"
    )
    old = readme.read_text() if readme.exists() else ""
    if start in old and end in old:
        head, rest = old.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + body + tail
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + body
    readme.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds, short sweep")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile step")
    parser.add_argument("--no-readme", action="store_true", help="leave README.md alone")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rounds = 3 if args.quick else 7
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(device),
        "device": str(device),
        "quick": args.quick,
    }

    def stage(name: str) -> None:
        print(f"[bench {time.perf_counter() - t0:6.1f} s] {name}", file=sys.stderr, flush=True)

    stage("matmul peak")
    res["matmul_peak_flops"] = matmul_peak(device, rounds)
    stage("rope")
    res["rope"] = bench_rope(device, rounds)
    stage("rope under autocast")
    res["rope_autocast"] = rope_autocast.bench(device, rounds)
    stage("attention core")
    res["attention"] = bench_attention(device, rounds)
    stage("training steps")
    res["train"] = bench_train(device, 5 if not args.quick else 3, args.quick)
    if not args.no_compile:
        stage("torch.compile")
        res["compile"] = bench_compile(device, 3)
    stage("tokens/s sweep")
    res["sweep"] = bench_sweep(device, 3 if not args.quick else 2, args.quick)
    stage("kv_cache decode: generate, recompute loop, SDPA static cache")
    res["decode"] = decode.bench(device, quick=args.quick, compile=not args.no_compile)
    stage("downstream experiment: v0/v1 steps, DDP")
    res["experiments"] = downstream.bench(device, 3, args.quick)
    res["targets"] = [{"target": n, "met": ok, "value": d} for n, ok, d in targets(res)]
    res["wall_s"] = time.perf_counter() - t0
    stage("done")

    text = table(res)
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "bench.txt").write_text(text)
    plot(res, args.out / "tokens_per_s.png")
    if not args.no_readme:
        update_readme(text, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
