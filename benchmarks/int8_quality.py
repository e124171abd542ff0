"""What int8 weights cost a trained model: validation loss and greedy agreement with float32.

    python -m benchmarks.int8_quality --run runs/q --data-dir DATA [--rows 64] [--new 448]

Loads a ``niels-train`` run (float32), copies it and quantizes the copy with
``quantize_int8`` (since spec quant 3.0 its layers compute in bfloat16
activations on a CPU, through the fused kernel: what ``benchmarks.decode``
times as ``kv_cache.generate, int8``), and a bfloat16 copy the same way (int8
weights, bfloat16 activations and cache: what it times compiled as ``int8
bf16, fast, compiled``), then prints for each against float32:

- the mean next-token loss over ``--rows`` fixed validation windows of the
  run's context (``niels_gpt_experiments.batches.eval_offsets``, the windows
  training evaluated on), on the default corpus split (the standard library's
  sources, 50 per mille held out; ``--data-dir`` as given to ``niels-train``);
- greedy ``kv_cache.generate`` from the first ``--prompt`` bytes of ``--rows``
  validation windows (at most 4), ``--new`` tokens each: how many tokens equal
  float32's, and how many lead before the first difference.

The model's context must hold prompt + new tokens (T >= 512 for 64 + 448).
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F

from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate
from niels_gpt.model.quant import quantize_int8
from niels_gpt_experiments.batches import eval_offsets, read_rows
from niels_gpt_experiments.corpus import CorpusSpec, open_corpus
from niels_gpt_experiments.loading import load_run


def _loss(model: GPT, x: torch.Tensor, y: torch.Tensor, micro: int = 8) -> float:
    """Mean next-token cross-entropy of ``model`` on ``x``, ``y`` ``(rows, T)``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for xs, ys in zip(torch.split(x, micro), torch.split(y, micro), strict=True):
            logits = model(xs).float()  # (b, T, V): a bfloat16 model's summed in float32
            V = logits.shape[-1]
            total += float(F.cross_entropy(logits.reshape(-1, V), ys.reshape(-1), reduction="sum"))
            count += ys.numel()
    return total / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a niels-train run folder")
    parser.add_argument("--data-dir", type=Path, default=None, help="niels-train's --data-dir")
    parser.add_argument("--rows", type=int, default=64, help="validation windows")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=448)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_run(args.run, device="cpu")
    dense = cast(GPT, loaded.model).eval()
    int8 = cast(GPT, quantize_int8(copy.deepcopy(dense)))
    int8_bf16 = cast(GPT, quantize_int8(copy.deepcopy(dense).bfloat16()))
    T = loaded.config.T
    if args.prompt + args.new > T:
        parser.error(f"prompt + new ({args.prompt + args.new}) must fit the run's T={T}")
    val = open_corpus(CorpusSpec(), args.data_dir).val
    x, y = read_rows(val, eval_offsets(args.rows, len(val), T), T, torch.device("cpu"))
    losses = {"float32": _loss(dense, x, y), "int8": _loss(int8, x, y)}
    losses["int8 bf16"] = _loss(int8_bf16, x, y)
    prompts = x[: min(4, args.rows), : args.prompt]  # (b, prompt)
    greedy = {
        name: cast(torch.Tensor, generate(m, prompts, args.new, temperature=0))[:, args.prompt :]
        for name, m in (("float32", dense), ("int8", int8), ("int8 bf16", int8_bf16))
    }  # each (b, new)
    cfg = loaded.config
    print(
        f"run {args.run} (step {loaded.step}): V={cfg.V} T={cfg.T} C={cfg.C} L={cfg.L} "
        f"H={cfg.H} d_ff={cfg.d_ff}"
    )
    print(f"validation loss over {args.rows} windows of {T} tokens:")
    f32_loss = losses["float32"]
    print(
        f"  float32 {f32_loss:.4f}   "
        + "   ".join(
            f"{n} {v:.4f} ({v / f32_loss:.4f}x)" for n, v in losses.items() if n != "float32"
        )
    )
    a = greedy["float32"]
    for name in ("int8", "int8 bf16"):
        b = greedy[name]
        same = (a == b).sum(dim=1).tolist()  # per prompt
        lead = (a == b).int().cumprod(dim=1).sum(dim=1).tolist()  # before the first difference
        print(
            f"greedy {name} against float32, {len(same)} validation prompts of "
            f"{args.prompt} bytes, {args.new} new tokens:"
        )
        for i, (s_i, lead_i) in enumerate(zip(same, lead, strict=True)):
            print(
                f"  prompt {i}: {s_i}/{args.new} tokens equal, {lead_i} before the first difference"
            )
        total = sum(same)
        print(f"  all: {total}/{args.new * len(same)} = {total / (args.new * len(same)):.1%}")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
