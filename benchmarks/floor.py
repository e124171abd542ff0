"""The bandwidth floor of decoding: bytes a token reads over the machine's read bandwidth.

A greedy decode of one row runs one forward a token (the prefill for the
first, then one-token steps), and each forward reads every weight once and
the keys and values of every position it attends to. So a token costs at
least ``bytes_per_token / read_bandwidth`` seconds, whatever the kernels.
``benchmarks.decode`` measures that bandwidth in the same run and states each
decoder's tokens/s as the bandwidth it implies and as a fraction of the floor.

What counts as read (``weight_bytes``): every tensor of the model's
``state_dict`` once (parameters and persistent buffers; a tied weight is one
tensor, read once by the head, while the embedding lookup reads one row of
it, left out), so float32 weights, or int8 codes with their scales and
biases. Non-persistent buffers (the RoPE tables, of which a step reads one
row) are left out. Activations are a few KB a step and left out too.

Two read bandwidths are measured (issue 49). ``gemv``, the floor: one-row
``F.linear`` products over float32 weights of the model's own shapes
(``gemv_bandwidth``), as many copies of the set as it takes to pass four times
the last level cache, so what a decode's products can read from main memory;
on this project's EPYC a one-thread ``sum`` of 128 MiB read 19 GB/s where
``F.linear`` over 126 MB of weights read 8.4 GB/s, so against ``sum`` no
matrix product reaches 100%. ``sum`` (``read_bandwidth``), the old floor, is
printed beside it. Both probes are four times the last level cache the OS
reports (at least 128 MiB). This project's Xeon reports a
300 MiB L3, shared with the host's other tenants, which holds the whole
float32 model (109 MB): while neighbours leave it alone, the weights stay
cached between tokens and a decoder can pass this floor (one run printed
124% against the 128 MiB probe this replaced); when they evict it, the
decoder meets it. The printed section marks each decoder whose bytes a token
fit in that cache, so such a figure does not read as a broken law.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.decode_targets import share_of_floor
from niels_gpt.config import ModelConfig

MB = 1e6
GB = 1e9
MIN_READ_BYTES = 128 * 2**20  # the probe's least size, where no cache size is reported
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux's cache description


def last_level_cache_bytes(root: Path = CPU_CACHES) -> int | None:
    """The largest data or unified cache of CPU 0 that ``root`` describes, in bytes.

    Reads Linux's ``index*/{type,size}`` files (sizes like ``300K`` or
    ``32M``); ``None`` where there are none (another OS) or one cannot be read.
    """
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    sizes: list[int] = []
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip()
        except OSError:
            return None
        if kind == "Instruction":
            continue
        number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "")
        if not number.isdigit():
            return None
        sizes.append(int(number) * units.get(unit, 1))
    return max(sizes) if sizes else None


def probe_bytes(cache: int | None) -> int:
    """The probe's size: four times the last level cache (``cache``), at least 128 MiB."""
    return max(MIN_READ_BYTES, 4 * (cache or 0))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct tensor in ``model.state_dict()`` (tied ones once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in model.state_dict(keep_vars=True).values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def cache_rows_per_token(prompt: int, new: int) -> float:
    """Mean key/value positions a forward reads over a decode of ``new`` tokens.

    The prefill reads the prompt's ``prompt`` positions; step ``i`` (1..new-1)
    reads ``prompt + i``, its own included. Their mean over the ``new`` forwards
    is ``prompt + (new - 1) / 2``.
    """
    if prompt < 1 or new < 1:
        raise ValueError(f"prompt and new must be >= 1, got {prompt} and {new}")
    return (prompt * new + (new - 1) * new / 2) / new


def cache_bytes(cfg: ModelConfig, batch: int, rows: float, itemsize: int) -> float:
    """Bytes of keys and values read at ``rows`` positions: all layers, both tensors,
    ``cfg.kv_heads`` heads (fewer than ``H`` under grouped-query attention)."""
    head_dim = cfg.C // cfg.H
    return 2.0 * cfg.L * batch * cfg.kv_heads * head_dim * rows * itemsize


def bytes_per_token(model: nn.Module, cfg: ModelConfig, prompt: int, new: int,
                    itemsize: int = 4) -> float:  # fmt: skip
    """Weights plus the mean cache bytes one forward of a batch-1 decode reads."""
    return weight_bytes(model) + cache_bytes(cfg, 1, cache_rows_per_token(prompt, new), itemsize)


def read_bandwidth(rounds: int = 9, nbytes: int | None = None) -> dict[str, float]:
    """Bytes/s of the machine on ``nbytes`` of float32, medians of interleaved rounds.

    ``sum``: one read pass (``x.sum()``); ``copy_``: read and write, counted as
    ``2 * nbytes`` moved. ``read_bytes`` says how big the tensor was (by
    default ``probe_bytes`` of this machine's last level cache), and
    ``cache_bytes`` that cache's size (0 where the OS does not say).
    """
    cache = last_level_cache_bytes()
    nbytes = probe_bytes(cache) if nbytes is None else nbytes
    x = torch.ones(nbytes // 4)  # (n,) float32
    y = torch.empty_like(x)  # (n,)
    times: dict[str, list[float]] = {"sum": [], "copy_": []}
    x.sum(), y.copy_(x)  # first touch: page faults out of the timing
    for _ in range(rounds):
        t0 = time.perf_counter()
        x.sum()
        times["sum"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        y.copy_(x)
        times["copy_"].append(time.perf_counter() - t0)
    return {
        "sum": nbytes / statistics.median(times["sum"]),
        "copy_": 2 * nbytes / statistics.median(times["copy_"]),
        "read_bytes": float(nbytes),
        "cache_bytes": float(cache or 0),
    }


def gemv_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """``(O, I)`` of every linear weight a decode step of a v1 GPT multiplies by one row:
    per block qkv ``(3C, C)``, proj ``(C, C)``, w_a and w_g ``(d_ff, C)``, w_o ``(C, d_ff)``."""
    C, d = cfg.C, cfg.d_ff
    return [(3 * C, C), (C, C), (d, C), (d, C), (C, d)] * cfg.L


def gemv_bandwidth(
    cfg: ModelConfig, rounds: int = 9, nbytes: int | None = None
) -> dict[str, float]:
    """Bytes/s that one-row float32 ``F.linear`` products read, on the model's shapes.

    The weights of ``gemv_shapes(cfg)`` are repeated until they hold at least
    ``nbytes`` (default ``probe_bytes`` of the last level cache), then one row
    is multiplied by each, in order, so each weight comes from main memory;
    the median pass over ``rounds`` gives ``gemv``. ``gemv_bytes`` says how
    many bytes a pass read.
    """
    want = probe_bytes(last_level_cache_bytes()) if nbytes is None else nbytes
    shapes = gemv_shapes(cfg)
    weights: list[torch.Tensor] = []
    while sum(w.numel() * 4 for w in weights) < want:
        weights += [torch.randn(o, i) for o, i in shapes]  # (O, I) float32 each
    x = {i: torch.randn(1, i) for _, i in shapes}  # (1, I) a decode step's row
    total = sum(w.numel() * 4 for w in weights)

    def one_pass() -> None:
        for w in weights:
            F.linear(x[w.shape[1]], w)  # (1, O)

    one_pass()  # first touch: page faults out of the timing
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return {"gemv": total / statistics.median(times), "gemv_bytes": float(total)}


def floor_lines(
    per_token: dict[str, float],
    tps: dict[str, float],
    bandwidth: dict[str, float],
    load: list[float] | None = None,
) -> list[str]:
    """The printed section: bandwidths, then bytes, implied GB/s and fraction of each floor.

    The floor is ``gemv`` where the run measured it (issue 49), the ``sum``
    read beside it; older runs have only ``sum``. ``load``: the load average
    when the bandwidths were read.
    """
    read, cache = bandwidth["sum"], bandwidth.get("cache_bytes", 0.0)  # older runs: no cache
    gemv = bandwidth.get("gemv")
    floor = gemv or read
    lines = []
    if gemv:
        at = f" (load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f})" if load else ""
        lines.append(
            f"  bandwidth floor: one-row float32 F.linear on the model's shapes read "
            f"{gemv / GB:.2f} GB/s over {bandwidth['gemv_bytes'] / 2**20:.0f} MiB of weights; "
            f"floor = bytes a token / {gemv / GB:.2f} GB/s{at}"
        )
    lines.append(
        f"  {'old floor' if gemv else 'bandwidth floor'}: this run read {read / GB:.2f} GB/s "
        f"(sum of {bandwidth['read_bytes'] / 2**20:.0f} MiB float32), copy_ moved "
        f"{bandwidth['copy_'] / GB:.2f} GB/s; floor = bytes a token / {read / GB:.2f} GB/s"
    )
    if cache:
        lines.append(
            f"  last level cache {cache / 2**20:.0f} MiB; a row marked 'fits' reads fewer bytes "
            "a token than that: its weights can stay cached, and pass this floor"
        )
    for name, nbytes in per_token.items():
        implied = nbytes * tps[name]
        fits = "  fits" if nbytes < cache else ""
        old = f"  ({share_of_floor(nbytes, tps[name], read):6.1%} of the sum floor)" if gemv else ""
        lines.append(
            f"    {name:32s}{nbytes / MB:7.1f} MB/token  {implied / GB:6.2f} GB/s  "
            f"{share_of_floor(nbytes, tps[name], floor):6.1%} of floor  "
            f"(floor {floor / nbytes:6.1f} tok/s){old}{fits}"
        )
    return lines
