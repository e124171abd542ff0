"""The bench's table, its targets, its plot and the files ``--write`` writes.

``table(res)`` is the text printed (and written to ``bench.txt``); it opens
with the machine, its load average at the start and the end of the run, and
what ``--quick`` left out, and ends with the targets and a sanity check of
the figures (``suspect_figures``: an MFU above 100% means a wrong peak or a
wrong FLOP count, never a fast step).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks import decode, decode_targets, rope_autocast
from benchmarks import experiments as downstream
from benchmarks.where import load_line

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def _ms(stat: dict[str, Any]) -> str:
    return f"{stat['median_s'] * 1e3:9.2f} ms"


def _best(stat: dict[str, Any]) -> float:
    return float(min(stat["rounds_s"]))


# The table's sections in order, each named by its key in ``res`` (run.collect fills them
# in this order and prints each with ``section_lines`` as soon as it is measured).
SECTIONS = (
    "matmul_peak_flops",
    "rope",
    "rope_autocast",
    "attention",
    "train",
    "compile",
    "sweep",
    "decode",
    "experiments",
)


def table(res: dict[str, Any]) -> str:
    """The whole table: ``header_lines``, every section present, ``closing_lines``."""
    lines = header_lines(res)
    for key in SECTIONS:
        lines.extend(section_lines(res, key))
    lines.extend(closing_lines(res))
    return "\n".join(lines) + "\n"


def header_lines(res: dict[str, Any]) -> list[str]:
    """Date, machine, the load average (once the run has ended), what --quick leaves out."""
    lines = [f"niels_gpt bench - {res['date']}", f"machine: {res['machine']}"]
    load = res.get("load_average")
    if load and len(load) == 2:
        lines.append(load_line(load, res.get("cores") or os.cpu_count() or 1))
    if res.get("quick"):
        lines.append(
            "--quick: a smoke run (small training config, one attention shape, one or two "
            "rounds, a short decode, no torch.compile): not figures to quote"
        )
    lines.append(
        "ratios: medians over interleaved rounds; 'best rounds' = fastest round of each,"
        " the figure least touched by other load on the machine"
    )
    lines.append("")
    return lines


def section_lines(res: dict[str, Any], key: str) -> list[str]:
    """One section of the table (ending with its blank line), or none if it was not run."""
    if key not in res:
        return []
    return _SECTION[key](res)


def _matmul_lines(res: dict[str, Any]) -> list[str]:
    peak = res["matmul_peak_flops"]
    return [f"float32 matmul peak (measured): {peak / 1e9:.1f} GFLOP/s", ""]


def _rope_lines(res: dict[str, Any]) -> list[str]:
    lines: list[str] = []
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
    return lines


def _rope_autocast_lines(res: dict[str, Any]) -> list[str]:
    return [*rope_autocast.lines(res["rope_autocast"]), ""]


def _attention_lines(res: dict[str, Any]) -> list[str]:
    lines = ["Attention core, forward + backward (explicit = stage 000 blocked core)"]
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
    return lines


def _train_lines(res: dict[str, Any]) -> list[str]:
    lines = ["GPT v1 training step (AdamW, dropout 0), tokens/s and peak memory"]
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
    return lines


def _compile_lines(res: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    comp = res.get("compile")
    if comp is not None:
        if "skipped" in comp:
            lines.append(f"torch.compile: not run ({comp['skipped']})")
        elif "error" in comp:
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
    return lines


def _sweep_lines(res: dict[str, Any]) -> list[str]:
    sw = res["sweep"]
    lines = [f"tokens/s against T (small config widths, {sw['tokens_per_step']} tokens a step)"]
    lines.append("  " + f"{'T':>6s}" + "".join(f"{k:>12s}" for k in sw["tokens_per_s"]))
    for i, t in enumerate(sw["T"]):
        vals = "".join(f"{sw['tokens_per_s'][k][i]:12.0f}" for k in sw["tokens_per_s"])
        lines.append(f"  {t:6d}{vals}")
    lines.append("")
    return lines


def _decode_lines(res: dict[str, Any]) -> list[str]:
    return [*decode.table_lines(res["decode"]), ""]


_SECTION = {
    "matmul_peak_flops": _matmul_lines,
    "rope": _rope_lines,
    "rope_autocast": _rope_autocast_lines,
    "attention": _attention_lines,
    "train": _train_lines,
    "compile": _compile_lines,
    "sweep": _sweep_lines,
    "decode": _decode_lines,
    "experiments": downstream.table_lines,
}


def closing_lines(res: dict[str, Any]) -> list[str]:
    """The targets and the sanity check of the figures (they need every section)."""
    lines = ["Targets"]
    for name, ok, detail in targets(res):
        lines.append(f"  [{'met ' if ok else 'MISS'}] {name}: {detail}")
    suspect = suspect_figures(res)
    lines.append("Sanity: " + ("every MFU at or below 100%" if not suspect else "SUSPECT FIGURES"))
    lines.extend(f"  [BUG?] {text}" for text in suspect)
    return lines


def mfus(res: dict[str, Any]) -> dict[str, float]:
    """Every MFU the table prints, by row name, as a fraction."""
    found: dict[str, float] = {}
    for row in res.get("train", []):
        peak16 = row.get("matmul_bf16_peak_flops")
        for name, stat in row["stats"].items():
            peak = peak16 if name.endswith(" bf16") and peak16 else row["matmul_peak_flops"]
            found[f"training step {row['config']} {name}"] = (
                row["flops_per_step"] / stat["median_s"] / peak
            )
    models = res.get("experiments", {}).get("models", {})
    for name, row in models.get("rows", {}).items():
        if "mfu" in row:
            found[f"downstream {name}"] = row["mfu"]
    return found


def suspect_figures(res: dict[str, Any]) -> list[str]:
    """Figures that cannot be right: an MFU above 100% (a peak too low or FLOPs too many)."""
    return [
        f"{name}: MFU {100 * value:.1f}% > 100%: its peak or its FLOP count is wrong"
        for name, value in mfus(res).items()
        if value > 1.0
    ]


def targets(res: dict[str, Any]) -> list[tuple[str, bool, str]]:
    out = []
    limits = {256: 1.15, 1024: 2.0}  # the attention targets, by sequence length
    for a in res["attention"]:
        limit = limits[a["shape"][2]]
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
        out.extend(decode_targets.targets(res["decode"]))
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


def update_readme(text: str, res: dict[str, Any], readme: Path) -> None:
    """Put the table between the README's bench markers (or at its end)."""
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    body = (
        f"{start}\n## Benchmarks\n\n"
        f"Latest `nox -s bench -- --write` on {res['machine']}, {res['date']} "
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


def write(res: dict[str, Any], text: str, out: Path, *, readme: bool) -> list[Path]:
    """``bench.json``, ``bench.txt`` and the plot into ``out``; with ``readme``, the
    README's bench section too. Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.txt", out / "tokens_per_s.png"]
    paths[0].write_text(json.dumps(res, indent=2) + "\n")
    paths[1].write_text(text)
    plot(res, paths[2])
    if readme:
        update_readme(text, res, ROOT / "README.md")
        paths.append(ROOT / "README.md")
    return paths
