"""H_kv = H against H_kv = H / 4 on the same tokens: niels-ablate's study model, twice.

    python -m benchmarks.train_gqa [--out runs/train-gqa] [--steps N] [--write]

``niels-ablate`` compares v0 with v1; this runs its study settings
(``niels_gpt_experiments.ablate.STUDY``: v1, T=128, C=128, L=4, H=4, 160
steps of 16 x 128 tokens, seed 0, the standard library as corpus) through
``niels-train`` twice, once with ``--kv-heads 4`` (multi-head) and once with
``--kv-heads 1`` (H / 4: multi-query), one process each, one after the
other. The batches depend on the seed and the step only, so both see the
same tokens. Prints and, with ``--write``, writes the validation losses, the
final train loss and tokens/s (``benchmarks/results/train_gqa.json``,
``.txt``) and the curves (``packages/gqa/train_gqa.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from niels_gpt_experiments.ablate import STUDY

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURE = ROOT / "packages" / "gqa" / "train_gqa.png"
FLAGS = {"T": "--context", "C": "--width", "L": "--layers", "H": "--heads", "steps": "--steps",
         "batch_size": "--batch-size", "lr": "--lr", "warmup": "--warmup",
         "eval_every": "--eval-every", "eval_batches": "--eval-batches",
         "sample_tokens": "--sample-tokens", "device": "--device"}  # fmt: skip


def _train(out: Path, kv_heads: int, steps: int) -> dict[str, Any]:
    """One niels-train run of the study; its validation losses and its last step line."""
    settings = {**STUDY, "steps": steps}
    args = [str(Path(sys.executable).parent / "niels-train"), "--out", str(out), "--overwrite"]
    args += [x for k, flag in FLAGS.items() for x in (flag, str(settings[k]))]
    args += ["--kv-heads", str(kv_heads), "--no-progress", "--checkpoint-minutes", "0"]
    subprocess.run(args, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    val = {int(x["step"]): float(x["val_loss"]) for x in lines if "val_loss" in x}
    last = [x for x in lines if "tokens_per_s" in x][-1]
    return {"H_kv": kv_heads, "val_loss": val, "train_loss": last["loss"],
            "tokens_per_s": last["tokens_per_s"], "tokens": last["tokens"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/train-gqa"))
    parser.add_argument("--steps", type=int, default=STUDY["steps"])
    parser.add_argument("--write", action="store_true", help="write the results and the figure")
    args = parser.parse_args(argv)
    runs = [_train(args.out / f"kv{h}", h, args.steps) for h in (STUDY["H"], STUDY["H"] // 4)]
    lines = [f"niels-ablate's study (v1 T=128 C=128 L=4 H=4, {args.steps} steps of 16 x 128 "
             "tokens, seed 0), CPU, one thread a run, one run at a time"]  # fmt: skip
    for r in runs:
        last = max(r["val_loss"])
        lines.append(
            f"  H_kv={r['H_kv']}: val loss {r['val_loss'][last]:.4f} at step {last}, "
            f"train loss {r['train_loss']:.4f}, {r['tokens_per_s']:.0f} tokens/s"
        )
    print("\n".join(lines))
    if args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "train_gqa.json").write_text(json.dumps(runs, indent=1) + "\n")
        (RESULTS / "train_gqa.txt").write_text("\n".join(lines) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        for r in runs:
            steps = sorted(r["val_loss"])
            label = f"H_kv={r['H_kv']} ({r['tokens_per_s']:.0f} tok/s)"
            ax.plot(steps, [r["val_loss"][s] for s in steps], marker="o", label=label)
        ax.set(xlabel="step (16 x 128 tokens)", ylabel="validation loss (nats/byte)",
               title="H = 4 query heads, H_kv key/value heads, same tokens")  # fmt: skip
        ax.legend()
        fig.tight_layout()
        fig.savefig(FIGURE, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
