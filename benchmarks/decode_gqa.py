"""Decoding at 1024 tokens of context with fewer key/value heads (the gqa stage).

    python -m benchmarks.decode_gqa [--device cpu|cuda|mps] [--quick] [--threads N] [--write]

The default model (``train.CONFIGS["default"]``: V=256, T=1024, C=512, L=8,
H=8, dropout 0) at ``H_kv`` 8 (multi-head, today's model), 2 and 1, each in
float32 through ``kv_cache``'s explicit path and its fast path (SDPA with
``enable_gqa``), and with weight-only int8 linears (the quant stage) at
``H_kv`` 8 and 2. Each model is prefilled with the same 960 drawn tokens
(untimed); a timed run rewinds the caches to 960 positions and decodes 64
greedy tokens one step at a time, so every step reads 960 to 1023 cached
positions. Runs are interleaved (``benchmarks.timing.measure``, medians of 3
rounds); a different ``H_kv`` is another model (other weights), so only the
speed compares, not the tokens. Beside each row: the KV cache's bytes a token
(``niels_gpt.model.gqa.cache_bytes_per_token``), the cache and weight bytes one
step reads on average (``benchmarks.floor``), and the load average. ``--write``
writes ``decode_gqa.json`` and ``decode_gqa.txt`` into ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from benchmarks import floor, train
from benchmarks.decoders import rewind
from benchmarks.progress import note
from benchmarks.timing import measure
from benchmarks.where import load_line, machine
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.gqa import cache_bytes_per_token
from niels_gpt.model.kv_cache import use_kv_cache
from niels_gpt.model.quant import quantize_int8

CFG = train.CONFIGS["default"][0]
PROMPT, NEW = 960, 64  # the steps read 960 .. 1023 cached positions
QUICK_PROMPT, QUICK_NEW = 120, 8
RESULTS = Path(__file__).resolve().parent / "results"
#: (row, H_kv, int8 linears, fast path)
ROWS = (
    ("float32, H_kv=8 (MHA)", 8, False, False),
    ("float32, H_kv=2", 2, False, False),
    ("float32, H_kv=1 (MQA)", 1, False, False),
    ("float32 fast, H_kv=8 (MHA)", 8, False, True),
    ("float32 fast, H_kv=2", 2, False, True),
    ("float32 fast, H_kv=1 (MQA)", 1, False, True),
    ("int8, H_kv=8 (MHA)", 8, True, False),
    ("int8, H_kv=2", 2, True, False),
)


def _decoder(model: GPT, ids: torch.Tensor, prompt: int, new: int) -> Callable[[], torch.Tensor]:
    """Greedy steps after ``ids[:, :prompt]`` ``(1, prompt)``, prefilled once here."""
    caches = use_kv_cache(model, 1)
    last = model(ids[:, :prompt])[:, -1].argmax(-1, keepdim=True)  # (1, 1): the prefill's token

    def run() -> torch.Tensor:
        rewind(caches, prompt)
        token, out = last, []
        for _ in range(new):
            token = model(token)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            out.append(token)
        return torch.cat(out, 1)  # (1, new)

    return run


def bench(device: torch.device, *, quick: bool = False, threads: int = 1) -> dict[str, Any]:
    """Every row as a dict (JSON-ready); ``threads`` 0 keeps torch's."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads or old)
    prompt, new = (QUICK_PROMPT, QUICK_NEW) if quick else (PROMPT, NEW)
    ids = torch.randint(0, CFG.V, (1, prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)  # (1, prompt)
    res: dict[str, Any] = {"cfg": dataclasses.asdict(CFG), "prompt": prompt, "new": new}
    res["machine"], res["load_start"] = machine(device), os.getloadavg()[0]
    runs: dict[str, Callable[[], torch.Tensor]] = {}
    rows: dict[str, dict[str, Any]] = {}
    try:
        with torch.no_grad():
            for name, h_kv, int8, fast in ROWS:
                cfg = dataclasses.replace(CFG, H_kv=h_kv)
                torch.manual_seed(0)
                model = GPT(cfg).to(device).eval()
                if int8:
                    model = cast(GPT, quantize_int8(model))
                if fast:
                    model = cast(GPT, use_fast_attention(copy.deepcopy(model)))
                note(f"prefill of {prompt} tokens: {name}")
                runs[name] = _decoder(model, ids, prompt, new)
                rows[name] = {
                    "H_kv": h_kv, "int8": int8, "fast": fast,
                    "cache_bytes_per_token": cache_bytes_per_token(cfg),
                    "cache_read_per_step": floor.cache_bytes(cfg, 1, prompt + (new - 1) / 2, 4),
                    "weight_bytes": floor.weight_bytes(model),
                }  # fmt: skip
            note(f"{new} greedy steps after {prompt} positions, {len(runs)} rows interleaved")
            stats = measure(runs, device, rounds=1 if quick else 3, warmup=1, min_sample_s=0.0)
    finally:
        torch.set_num_threads(old)
    for name, stat in stats.items():
        rows[name]["tokens_per_s"] = new / stat.median
        rows[name]["rounds_s"] = list(stat.rounds)
    res["rows"], res["load_end"] = rows, os.getloadavg()[0]
    res["threads"] = threads or old
    return res


def table_lines(res: dict[str, Any]) -> list[str]:
    c, rows = res["cfg"], res["rows"]
    base = rows[ROWS[0][0]]["tokens_per_s"]
    lines = [
        f"Greedy decoding at {res['prompt']}..{res['prompt'] + res['new'] - 1} cached positions, "
        f"V={c['V']} T={c['T']} C={c['C']} L={c['L']} H={c['H']}, batch 1, "
        f"{res['threads']} torch thread(s); {res['machine']}",
        "  row                          tok/s   vs MHA f32   cache B/token   cache MB/step   "
        "weights MB",
    ]
    for name, r in rows.items():
        lines.append(
            f"  {name:27s}{r['tokens_per_s']:7.1f}   x{r['tokens_per_s'] / base:9.2f}"
            f"   {r['cache_bytes_per_token']:13,d}   {r['cache_read_per_step'] / 1e6:13.1f}"
            f"   {r['weight_bytes'] / 1e6:10.1f}"
        )
    lines.append("  " + load_line([res["load_start"], res["load_end"]], os.cpu_count() or 1))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--quick", action="store_true", help="a short prompt, 8 steps, 1 round")
    parser.add_argument("--write", action="store_true", help="write decode_gqa.json and .txt")
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    res = bench(torch.device(args.device), quick=args.quick, threads=args.threads)
    text = "\n".join(table_lines(res))
    print(text)
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_gqa.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out / "decode_gqa.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
