"""The ablation's outputs: a text table, a Markdown table and a PNG of the loss curves."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "mean_std", "plot_curves", "text_table"]

MIB = 2**20
LABELS = {"v0": "v0 (LayerNorm + GELU)", "v1": "v1 (RMSNorm + SwiGLU)"}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model kind: parameter count and mean/std over seeds."""
    rows = []
    for kind in sorted({r["model"] for r in runs}):
        mine = [r for r in runs if r["model"] == kind]
        rows.append(
            {
                "model": kind,
                "params": mine[0]["params"],
                "seeds": len(mine),
                "val_loss": mean_std([r["final_val_loss"] for r in mine]),
                "tokens_per_s": mean_std([r["tokens_per_s"] for r in mine]),
                "peak_mib": mean_std([r["peak_bytes"] / MIB for r in mine]),
            }
        )
    return rows


def text_table(runs: Sequence[dict[str, Any]], memory_method: str) -> str:
    lines = [
        f"{'model':24s}{'params':>11s}{'val loss':>20s}{'tokens/s':>20s}{'peak memory':>22s}",
    ]
    for row in summarise(runs):
        v, t, m = row["val_loss"], row["tokens_per_s"], row["peak_mib"]
        lines.append(
            f"{LABELS.get(row['model'], row['model']):24s}{row['params']:>11,d}"
            f"{v[0]:>12.4f} ± {v[1]:.4f}{t[0]:>12,.0f} ± {t[1]:<6,.0f}"
            f"{m[0]:>10.1f} ± {m[1]:.1f} MiB"
        )
    lines.append(f"(mean ± sample std over seeds; peak memory: {memory_method})")
    return "\n".join(lines) + "\n"


def markdown_table(runs: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| model | params | val loss (mean ± std) | tokens/s (mean ± std) | peak memory (MiB) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in summarise(runs):
        v, t, m = row["val_loss"], row["tokens_per_s"], row["peak_mib"]
        lines.append(
            f"| {LABELS.get(row['model'], row['model'])} | {row['params']:,} | "
            f"{v[0]:.4f} ± {v[1]:.4f} | {t[0]:,.0f} ± {t[1]:,.0f} | {m[0]:.1f} ± {m[1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(runs: Sequence[dict[str, Any]], path: Path, title: str, footer: str) -> bool:
    """Validation loss against training tokens, mean ± std band per model.

    Returns ``False`` (and draws nothing) when matplotlib is not installed; it
    is the optional ``plot`` extra.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for kind in sorted({r["model"] for r in runs}):
        mine = [r for r in runs if r["model"] == kind]
        steps = sorted(set.intersection(*(set(r["val_curve"]) for r in mine)), key=int)
        tokens = [int(s) * mine[0]["tokens_per_step"] for s in steps]
        stats = [mean_std([r["val_curve"][s] for r in mine]) for s in steps]
        mean = [m for m, _ in stats]
        (line,) = ax.plot(tokens, mean, marker="o", markersize=3, label=LABELS.get(kind, kind))
        low = [m - s for m, s in stats]
        high = [m + s for m, s in stats]
        ax.fill_between(tokens, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.text(0.01, 0.01, footer, fontsize=6, alpha=0.7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
