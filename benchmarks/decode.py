"""Greedy decoding with the kv_cache stage beside a recompute loop and a compact SDPA decoder.

    python -m benchmarks.decode [--device cpu|cuda|mps] [--quick] [--no-compile] [--threads N]
                                [--like-for-like]

Also a section of ``nox -s bench`` (``benchmarks.run``). Run alone, it prints
its table; ``--write`` also writes ``decode.json`` and ``decode.txt`` into
``benchmarks/results/``. ``--quick``: one round and 32 new tokens (targets not
judged).

The default config (``train.CONFIGS["default"]``: V=256, dropout 0), batch 1,
a 64-token prompt and 448 new tokens, so the last step writes position 511.
Whole runs, timed interleaved by ``benchmarks.timing.measure``:

- ``kv_cache.generate`` at temperature 0: a prefill, then one-token steps;
- the same steps written out here on the stage's cache, eager and through
  ``torch.compile(fullgraph=True)`` (gpt-fast's recipe: a cache allocated
  once, a one-token step captured whole), so the compile speed-up is taken on
  the same model, batch and positions as the eager figure;
- ``SdpaDecoder``: a compact decoder written here on the same weights, with
  its own static cache and ``scaled_dot_product_attention``;
- ``StaticDecoder``, the same bare decoder as gpt-fast writes it, its one-token
  step through ``torch.compile(fullgraph=True)``: the compiled rows are judged
  against it, the eager ones against the eager bare decoder (issue 49);
- a no-cache loop: every step reruns the whole prefix through ``GPT.forward``;
- ``kv_cache.generate`` on the same model with its linear layers in weight-only
  int8 (the quant stage: on a CPU, bfloat16 activations through the fused
  ``_weight_int8pack_mm``), and, compiled, on a bfloat16 copy quantized the
  same way (gpt-fast's setting).

Each cached decoder's tokens/s is also stated against the bandwidth floor
(``benchmarks.floor``): the weights and cache bytes a token reads, the read
bandwidth that implies, and that as a fraction of the machine's own read
bandwidth, measured in the same run: what one-row float32 ``F.linear``
products on the model's own shapes read over four times the last level cache
(issue 49; the old floor, a ``sum`` over as many bytes, beside it; see
``benchmarks.floor``). Each comparison line states the load average
(``os.getloadavg``) when it was measured.

Padded against plain generation (issue 21's target: at most 1.05x the time)
is also taken as ratios of back-to-back pairs (``timing.paired_ratios``, not
on ``--quick``): the two rows' medians come from different moments of a
shared machine and moved that ratio from 0.98x to 1.13x between runs.

Also the latency of one step at positions 64, 256 and 511 (the step that
writes that position, the cache holding the positions before it). On a CPU
the bench runs one torch thread by default: a one-token step is a chain of
small kernels, and a second thread on a shared two-core machine mostly
measures the neighbours (their barrier waits, not our work).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch._dynamo
import torch._dynamo.testing

from benchmarks import floor, train
from benchmarks.decode_targets import (
    FAST,
    FAST_COMPILED,
    INT8_COMPILED,
    PADDED,
    PLAIN,
    SDPA,
    SDPA_COMPILED,
    floor_fraction,
    padded_ratio,
    targets,
)
from benchmarks.decoders import (
    SdpaDecoder,
    StaticDecoder,
    Step,
    recompute_loop,
    rewind,
    step_loop,
)
from benchmarks.progress import note
from benchmarks.timing import measure, paired_ratios, sync
from benchmarks.where import load_line, machine
from niels_gpt.model import padding
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import KVCache, generate, use_kv_cache
from niels_gpt.model.quant import quantize_int8

CFG = train.CONFIGS["default"][0]
PROMPT, NEW = 64, 448
POSITIONS = (64, 256, 511)
# --quick: a short decode, so the recompute loop takes seconds rather than minutes
QUICK_NEW, QUICK_POSITIONS = 32, (64, 95)
PAIRS = 7  # padded and plain generate back to back, for the padded target (not on --quick)
RESULTS = Path(__file__).resolve().parent / "results"


def _agree(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many new tokens of ``got`` equal ``want``'s before the first difference."""
    same = (got[:, PROMPT:] == want[:, PROMPT:]).all(0)  # (NEW,)
    return int(same.int().cumprod(0).sum())


def _greedy(model: GPT, prompt: torch.Tensor, new: int, compiled: bool = False) -> torch.Tensor:
    """``kv_cache.generate`` at temperature 0: ``(B, t + new)`` ids; ``compiled``: its
    ``compile_step`` (the first run compiles: the timing's warm-up run)."""
    return cast(torch.Tensor, generate(model, prompt, new, temperature=0, compile_step=compiled))


def _latency(
    prepare: dict[str, Callable[[int], Callable[[], object]]],
    device: torch.device,
    rounds: int,
    positions: tuple[int, ...],
) -> dict[str, dict[str, float]]:
    """Median seconds of one step at each position; ``prepare[name](p)`` fills the cache."""
    out: dict[str, dict[str, float]] = {name: {} for name in prepare}
    for p in positions:
        stats = measure({name: make(p) for name, make in prepare.items()}, device, rounds=rounds)
        for name, stat in stats.items():
            out[name][str(p)] = stat.median
    return out


def _compile(
    model: GPT, caches: list[KVCache], ids: torch.Tensor, device: torch.device, new: int
) -> tuple[dict[str, Any], Step | None, Callable[[], int]]:
    """Graph breaks of the step (``torch._dynamo.explain``), then ``torch.compile`` and one run.

    Returns the facts, the compiled step (``None`` if compiling failed) and a
    count of the graphs compiled so far.
    """
    torch._dynamo.reset()
    rewind(caches, 0)
    model(ids[:, :PROMPT])  # (1, t, V): an eager prefill, then explain one step
    report = torch._dynamo.explain(model)(ids[:, PROMPT : PROMPT + 1])
    facts: dict[str, Any] = {
        "explain_graphs": report.graph_count,
        "graph_breaks": report.graph_break_count,
        "break_reasons": [str(b.reason) for b in report.break_reasons],
    }
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = cast(Step, torch.compile(model, backend=counter, fullgraph=True))
    t0 = time.perf_counter()
    try:
        step_loop(compiled, model, caches, ids[:, :PROMPT], new)()  # compiles as it goes
        sync(device)
    except Exception as exc:  # no C++ toolchain, unsupported backend, ...
        return {**facts, "error": f"{type(exc).__name__}: {exc}"[:500]}, None, lambda: 0
    facts["compile_s"] = time.perf_counter() - t0  # the first run: compiling and 448 tokens
    facts["graphs_first_run"] = counter.frame_count
    return facts, compiled, lambda: counter.frame_count


def bench(
    device: torch.device,
    *,
    quick: bool = False,
    compile: bool = True,
    threads: int = 1,
    like_for_like: bool = False,
) -> dict[str, Any]:
    """Every figure of the table as a dict (JSON-ready); ``threads`` 0 keeps torch's.

    ``like_for_like``: issue 49's rows only (generate, fast path, padded, int8,
    the SDPA decoder, each eager and compiled), 3 padded pairs; no recompute
    loop, step loops or latency, and the targets that need them not judged.
    """
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads or old_threads)
    try:
        with torch.no_grad():
            return _bench(device, quick, compile, like_for_like)
    finally:
        torch.set_num_threads(old_threads)
        torch._dynamo.reset()


def _bench(device: torch.device, quick: bool, compile: bool, focus: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = GPT(CFG).to(device).eval()
    plain = copy.deepcopy(model)  # the same weights, never switched: the recompute loop's
    gen = torch.Generator().manual_seed(1)
    # (1, t + new), laid out as a run's ids: the latency steps' inputs are slices of it, and
    # another stride would cost the compiled step one more graph (a stride guard)
    new, positions = (QUICK_NEW, QUICK_POSITIONS) if quick else (NEW, POSITIONS)
    ids = torch.randint(0, CFG.V, (1, PROMPT + new), generator=gen).to(device)
    prompt = ids[:, :PROMPT]  # (1, t)
    sdpa = SdpaDecoder(model, 1)
    res: dict[str, Any] = {"cfg": {**CFG.__dict__, "batch": 1}, "prompt": PROMPT, "new": new}
    res["positions"] = list(positions)
    res["threads"], res["quick"] = torch.get_num_threads(), quick
    res["like_for_like"] = focus

    note("the first 16 greedy tokens of generate, SDPA and the recompute loop agree")
    want = recompute_loop(plain, prompt, 16)  # (1, t + 16): the first tokens must agree
    for name, got in (("kv_cache", _greedy(model, prompt, 16)), ("SDPA", sdpa.greedy(prompt, 16))):
        if not torch.equal(got, want):
            raise RuntimeError(f"{name} greedy tokens differ from the recompute loop's")

    fast = use_fast_attention(copy.deepcopy(plain))  # the same weights, SDPA as the kernel
    int8 = cast(GPT, quantize_int8(copy.deepcopy(plain)))  # the same weights, int8 linears
    # padding.generate on the same 64 columns, the first a pad: the padded path's cost
    pad_mask = torch.ones_like(prompt, dtype=torch.bool)  # (1, t)
    pad_mask[:, 0] = False
    caches = use_kv_cache(model, 1)  # generate() keeps and gives back these
    runs: dict[str, Callable[[], torch.Tensor]] = {
        PLAIN: lambda: _greedy(model, prompt, new),
        "kv_cache.generate, fast path": lambda: _greedy(cast(GPT, fast), prompt, new),
        PADDED: lambda: cast(
            torch.Tensor, padding.generate(plain, prompt, pad_mask, new, temperature=0)
        ),
        "kv_cache steps, eager": step_loop(model, model, caches, prompt, new),
        "kv_cache.generate, int8": lambda: _greedy(int8, prompt, new),
    }
    if focus:
        del runs["kv_cache steps, eager"]
    # (model, cache itemsize) a run reads: a bfloat16 model's cache holds 2-byte keys and values
    reads: dict[str, tuple[GPT, int]] = {"kv_cache.generate, int8": (int8, 4)}
    graphs: Callable[[], int] = lambda: 0  # noqa: E731
    compiled: Step | None = None
    if compile and not focus:
        note("torch._dynamo.explain and torch.compile of the one-token step")
        res["compile"], compiled, graphs = _compile(model, caches, ids, device, new)
        if compiled is not None:
            runs["kv_cache steps, compiled"] = step_loop(compiled, model, caches, prompt, new)
    if compile:
        runs[FAST_COMPILED] = lambda: _greedy(cast(GPT, fast), prompt, new, compiled=True)
        # gpt-fast's setting: int8 weights, bfloat16 activations and cache, the fast path
        bf16 = use_fast_attention(copy.deepcopy(plain).bfloat16())
        int8_bf16 = cast(GPT, quantize_int8(bf16))
        reads[INT8_COMPILED] = (int8_bf16, 2)
        runs[INT8_COMPILED] = lambda: _greedy(int8_bf16, prompt, new, compiled=True)
    runs[SDPA] = lambda: sdpa.greedy(prompt, new)
    if compile:  # gpt-fast's recipe on the bare decoder: its one-token step compiled whole
        static = StaticDecoder(copy.deepcopy(plain), 1)
        static_step = torch.compile(static.step, fullgraph=True)  # compiles in the warm-up run
        runs[SDPA_COMPILED] = lambda: static.greedy(prompt, new, step=static_step)
    if not focus:
        runs["no-cache recompute"] = lambda: recompute_loop(plain, prompt, new)

    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[], object]:
        return lambda: outputs.__setitem__(name, runs[name]())

    names = [n for n in runs if n != "no-cache recompute"]
    note(f"whole runs of {new} new tokens: {', '.join(names)}")
    stats = measure(
        {n: keep(n) for n in names}, device, rounds=1 if quick else 3, warmup=1, min_sample_s=0.0
    )
    res["load_runs"] = list(os.getloadavg())  # the machine while the whole runs were timed
    if not focus:  # minutes a run on a CPU: its first run is the warm-up, then one timed run
        note(f"the no-cache recompute loop, {new} new tokens (the slow one)")
        stats |= measure(
            {"no-cache recompute": keep("no-cache recompute")},
            device,
            rounds=1,
            warmup=0,
            min_sample_s=0.0,
        )
    if not quick:
        pairs = 3 if focus else PAIRS
        note(f"{PADDED} beside {PLAIN}, {pairs} pairs back to back")
        res["padded_pairs"] = paired_ratios(runs[PLAIN], runs[PADDED], device, pairs=pairs)
    res["runs"] = {n: s.as_dict() for n, s in stats.items()}
    res["tokens_per_s"] = {n: new / s.median for n, s in stats.items()}
    res["agree_with_generate"] = {n: _agree(o, outputs[PLAIN]) for n, o in outputs.items()}
    note("the machine's read bandwidth (sum and copy_ past the last level cache): the floor")
    bounded = [n for n in stats if n != "no-cache recompute"]  # the compute-bound one aside
    per = {}
    for n in bounded:
        read, itemsize = reads.get(n, (plain, 4))
        per[n] = floor.bytes_per_token(read, CFG, PROMPT, new, itemsize=itemsize)
    bandwidth = {**floor.read_bandwidth(), **floor.gemv_bandwidth(CFG)}
    load = list(os.getloadavg())  # the machine when the floor was read
    res["floor"] = {"bandwidth": bandwidth, "bytes_per_token": per, "load": load}

    def cached(step: Step) -> Callable[[int], Callable[[], object]]:
        def make(p: int) -> Callable[[], object]:
            rewind(caches, 0)
            model(ids[:, :p])  # (1, p, V): the prefill, untimed
            x = ids[:, p : p + 1]  # (1, 1)

            def one() -> torch.Tensor:
                rewind(caches, p)
                return step(x)  # (1, 1, V)

            return one

        return make

    def sdpa_step(p: int) -> Callable[[], object]:
        sdpa.forward(ids[:, :p], 0)  # (1, p, V): the prefill, untimed
        return lambda: sdpa.forward(ids[:, p : p + 1], p)

    if focus:
        return res
    prepare = {"kv_cache step, eager": cached(model)}
    if compiled is not None:
        prepare["kv_cache step, compiled"] = cached(compiled)
    prepare[SDPA] = sdpa_step
    prepare["no-cache recompute"] = lambda p: lambda: plain(ids[:, : p + 1])
    note(f"one-step latency at positions {', '.join(map(str, positions))}")
    res["latency_s"] = _latency(prepare, device, 3 if quick else 7, positions)
    if compile and compiled is not None:
        res["compile"]["graphs_compiled"] = graphs()  # after every timed call
    return res


def table_lines(res: dict[str, Any]) -> list[str]:
    """The printed table: tokens/s, the compile facts, latency by position."""
    c, tps = res["cfg"], res["tokens_per_s"]
    lines = [
        f"Greedy decoding, V={c['V']} T={c['T']} C={c['C']} L={c['L']} H={c['H']} "
        f"d_ff={c['d_ff']}, batch {c['batch']}, prompt {res['prompt']}, {res['new']} new tokens, "
        f"{res['threads']} torch thread(s)",
        f"  whole runs (prefill + steps), interleaved, median of "
        f"{len(res['runs']['kv_cache.generate']['rounds_s'])} (recompute: 1)",
    ]
    against = "no-cache recompute" if "no-cache recompute" in tps else PLAIN
    base, short = tps[against], "recompute" if against != PLAIN else "generate"
    for name, value in tps.items():
        agree = res["agree_with_generate"][name]
        bounded = name in res.get("floor", {}).get("bytes_per_token", {})
        frac = f"  {floor_fraction(res, name):5.0%} of floor" if bounded else ""
        lines.append(
            f"    {name:26s}{value:8.1f} tok/s  x{value / base:6.2f} vs {short}"
            f"   {agree}/{res['new']} tokens as generate's{frac}"
        )
    lines += like_for_like(res)
    pairs = res.get("padded_pairs")
    if pairs:
        lines.append(
            f"  {PADDED} over {PLAIN}, {len(pairs)} pairs back to back: "
            f"x{padded_ratio(res)[0]:.3f} median, x{min(pairs):.3f} to x{max(pairs):.3f}"
        )
    if "floor" in res:
        per = res["floor"]["bytes_per_token"]
        lines += floor.floor_lines(per, tps, res["floor"]["bandwidth"], res["floor"].get("load"))
    comp = res.get("compile")
    if comp is not None:
        lines.append(
            f"  torch._dynamo.explain of the kv_cache one-token step: {comp['explain_graphs']} "
            f"graph(s), {comp['graph_breaks']} graph break(s)"
        )
        if "error" in comp:
            lines.append(f"  torch.compile failed: {comp['error']}")
        else:
            e, f = tps["kv_cache steps, eager"], tps["kv_cache steps, compiled"]
            lines += [
                f"  torch.compile(fullgraph=True, inductor) of that step: x{f / e:.2f} "
                f"({e:.1f} -> {f:.1f} tok/s), the same model, batch and positions as the eager",
                f"    steps above; graphs compiled: {comp['graphs_first_run']} in the first run "
                f"({comp['compile_s']:.0f} s, compiling included: inductor's disk cache may be "
                f"warm), {comp['graphs_compiled']} after all timing",
            ]
    if "latency_s" not in res:  # a --like-for-like run
        return lines
    rounds = "median of 3" if res["quick"] else "median of 7"
    positions = res.get("positions", POSITIONS)
    first, last = positions[0], positions[-1]
    lines.append(
        f"  latency of one step (ms, {rounds}) at position " + ", ".join(map(str, positions))
    )
    for name, lat in res["latency_s"].items():
        cells = "".join(f"{lat[str(p)] * 1e3:10.2f}" for p in positions)
        ratio = lat[str(last)] / lat[str(first)]
        lines.append(f"    {name:26s}{cells}   {last}/{first} = x{ratio:.2f}")
    return lines


def like_for_like(res: dict[str, Any]) -> list[str]:
    """Issue 49's pairs: eager against the eager bare decoder, compiled against the bare
    decoder compiled the same way, and int8 against float32 in each mode, with the load."""
    tps = res["tokens_per_s"]
    pairs = [(FAST, SDPA), (FAST_COMPILED, SDPA_COMPILED), ("kv_cache.generate, int8", PLAIN),
             (INT8_COMPILED, FAST_COMPILED), (INT8_COMPILED, PLAIN)]  # fmt: skip
    found = [(a, b) for a, b in pairs if a in tps and b in tps]
    if not found:
        return []
    load = res.get("load_runs")
    at = f" (load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f})" if load else ""
    lines = [f"  like for like, tokens/s over tokens/s of the same whole runs{at}:"]
    for a, b in found:
        lines.append(f"    {a:26s} / {b:26s} x{tps[a] / tps[b]:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--quick", action="store_true", help="one round, 32 new tokens")
    parser.add_argument("--write", action="store_true", help="write decode.json, decode.txt")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--like-for-like",
        action="store_true",
        help="issue 49's rows only: no recompute loop, step loops or latency; 3 padded pairs",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads or torch.get_num_threads())  # as machine() reports it
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    res = bench(
        device,
        quick=args.quick,
        compile=not args.no_compile,
        threads=args.threads,
        like_for_like=args.like_for_like,
    )
    res["load_average"] = [load0, os.getloadavg()[0]]  # other work on a shared machine
    res["targets"] = [{"target": n, "met": ok, "value": d} for n, ok, d in targets(res)]
    res["wall_s"] = time.perf_counter() - t0
    res["machine"], res["cores"] = machine(device), os.cpu_count() or 1
    load = load_line(res["load_average"], res["cores"])
    lines = [f"machine: {res['machine']}; {load}", *table_lines(res)] + [
        f"  [{'met ' if t['met'] else 'MISS'}] {t['target']}: {t['value']}" for t in res["targets"]
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode.json").write_text(json.dumps(res, indent=2) + "\n")
        (args.out / "decode.txt").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
