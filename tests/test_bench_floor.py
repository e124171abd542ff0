"""``benchmarks.floor``: the bytes a decode reads a token, counted by hand on small models.

Arithmetic only (the bandwidth itself is measured by the bench, never here):
weights counted once however many modules share them, int8 layers at a byte
a weight plus their scales and biases, the cache's mean rows over a decode.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from benchmarks import floor

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.quant import quantize_int8

CFG = ModelConfig(V=50, T=32, C=16, L=2, H=4, d_ff=24)
NORMS = 2 * CFG.C + CFG.C  # per layer ln1 and ln2, plus ln_f once (below)
ATTN = 3 * CFG.C * CFG.C + CFG.C * CFG.C  # qkv and proj, no bias
MLP = 2 * (CFG.C * CFG.d_ff + CFG.d_ff) + CFG.d_ff * CFG.C + CFG.C  # w_a, w_g, w_o with biases


def test_float_weights_count_the_tied_table_once() -> None:
    model = GPT(CFG)
    per_layer = 2 * CFG.C + ATTN + MLP
    want = 4 * (CFG.V * CFG.C + CFG.L * per_layer + CFG.C)  # table, layers, ln_f; float32
    assert floor.weight_bytes(model) == want
    assert floor.weight_bytes(model) == 4 * sum(p.numel() for p in model.parameters())


def test_int8_layers_count_a_byte_a_weight_plus_scales_and_biases() -> None:
    model = quantize_int8(GPT(CFG))
    codes = ATTN + 3 * CFG.C * CFG.d_ff  # every linear weight, one byte each
    scales = 3 * CFG.C + CFG.C + 2 * CFG.d_ff + CFG.C  # one float32 per output row
    biases = 2 * CFG.d_ff + CFG.C
    rest = CFG.V * CFG.C + 2 * CFG.C * CFG.L + CFG.C  # the tied table and the norms, float32
    want = CFG.L * (codes + 4 * (scales + biases)) + 4 * rest
    assert floor.weight_bytes(model) == want
    float_bytes = floor.weight_bytes(GPT(CFG))
    assert floor.weight_bytes(model) < float_bytes / 2


def test_cache_rows_are_the_mean_over_the_prefill_and_the_steps() -> None:
    # prompt 4, 3 tokens: the prefill reads 4 rows, the steps 5 and 6: mean 5
    assert floor.cache_rows_per_token(4, 3) == 5.0
    assert floor.cache_rows_per_token(64, 448) == 64 + 447 / 2
    assert floor.cache_rows_per_token(7, 1) == 7.0
    with pytest.raises(ValueError, match=">= 1"):
        floor.cache_rows_per_token(0, 3)


def test_cache_and_token_bytes() -> None:
    D = CFG.C // CFG.H
    assert floor.cache_bytes(CFG, 1, 10.0, 4) == 2 * CFG.L * CFG.H * D * 10 * 4
    assert floor.cache_bytes(CFG, 3, 10.0, 2) == 3 * floor.cache_bytes(CFG, 1, 10.0, 2)
    model = GPT(CFG)
    got = floor.bytes_per_token(model, CFG, 4, 3)
    assert got == floor.weight_bytes(model) + 2 * CFG.L * CFG.H * D * 5 * 4


def test_the_default_model_reads_a_quarter_of_the_bytes_in_int8() -> None:
    cfg = ModelConfig(V=256, T=64, C=512, L=8, H=8, d_ff=1536)  # the bench's widths, short T
    model = GPT(cfg)
    dense = floor.weight_bytes(model)
    assert dense == 4 * sum(p.numel() for p in model.parameters())
    assert abs(dense / 1e6 - 109.7) < 0.1  # the 109 MB float32
    int8 = floor.weight_bytes(quantize_int8(copy.deepcopy(model)))
    assert 0.25 < int8 / dense < 0.26


def test_floor_lines_state_each_decoder_as_a_fraction_of_the_measured_bandwidth() -> None:
    lines = floor.floor_lines(
        {"a": 100e6, "b": 25e6}, {"a": 50.0, "b": 100.0}, {"sum": 10e9, "copy_": 8e9,
                                                            "read_bytes": 2**27},
    )  # fmt: skip
    assert "10.00 GB/s" in lines[0] and "128 MiB" in lines[0]
    assert "5.00 GB/s   50.0% of floor  (floor  100.0 tok/s)" in lines[1]
    assert "2.50 GB/s   25.0% of floor  (floor  400.0 tok/s)" in lines[2]


def test_the_gemv_floor_is_the_floor_and_the_sum_stands_beside_it() -> None:
    bandwidth = {"sum": 20e9, "copy_": 8e9, "read_bytes": 2**27, "gemv": 10e9,
                 "gemv_bytes": 2**28}  # fmt: skip
    lines = floor.floor_lines({"a": 100e6}, {"a": 50.0}, bandwidth, [3.5, 2.0, 1.0])
    assert "10.00 GB/s over 256 MiB" in lines[0] and "load average 3.50, 2.00, 1.00" in lines[0]
    assert lines[1].startswith("  old floor: this run read 20.00 GB/s")
    assert "50.0% of floor  (floor  100.0 tok/s)  ( 25.0% of the sum floor)" in lines[2]


def test_gemv_shapes_are_the_model_s_linears_and_the_probe_passes_the_bytes_asked() -> None:
    shapes = floor.gemv_shapes(CFG)
    model = GPT(CFG)
    linears = [m.weight.shape for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n != "lm_head"]  # fmt: skip
    assert sorted(shapes) == sorted(tuple(s) for s in linears)
    got = floor.gemv_bandwidth(CFG, rounds=1, nbytes=3 * 4 * sum(o * i for o, i in shapes))
    assert got["gemv_bytes"] >= 3 * 4 * sum(o * i for o, i in shapes) and got["gemv"] > 0


def _caches(root: Path, entries: dict[str, tuple[str, str]]) -> Path:
    """A fake ``/sys/devices/system/cpu/cpu0/cache``: ``index*/type`` and ``index*/size``."""
    for index, (kind, size) in entries.items():
        (root / index).mkdir(parents=True)
        (root / index / "type").write_text(kind + "\n")
        (root / index / "size").write_text(size + "\n")
    return root


def test_the_last_level_cache_is_the_largest_data_or_unified_one(tmp_path: Path) -> None:
    root = _caches(
        tmp_path / "cache",
        {
            "index0": ("Data", "48K"),
            "index1": ("Instruction", "512M"),  # an instruction cache never counts
            "index2": ("Unified", "2048K"),
            "index3": ("Unified", "307200K"),  # this project's Xeon: 300 MiB
        },
    )
    assert floor.last_level_cache_bytes(root) == 300 * 2**20
    assert floor.last_level_cache_bytes(tmp_path / "absent") is None
    bad = _caches(tmp_path / "bad", {"index0": ("Unified", "lots")})
    assert floor.last_level_cache_bytes(bad) is None


def test_the_probe_is_four_times_the_cache_and_at_least_128_mib() -> None:
    assert floor.probe_bytes(None) == 128 * 2**20
    assert floor.probe_bytes(8 * 2**20) == 128 * 2**20
    assert floor.probe_bytes(300 * 2**20) == 1200 * 2**20


def test_rows_whose_bytes_fit_in_the_cache_are_marked() -> None:
    bandwidth = {"sum": 10e9, "copy_": 8e9, "read_bytes": 2**30, "cache_bytes": 50e6}
    lines = floor.floor_lines({"a": 100e6, "b": 25e6}, {"a": 50.0, "b": 100.0}, bandwidth)
    assert "last level cache 48 MiB" in lines[1]
    assert lines[2].endswith("tok/s)") and lines[3].endswith("tok/s)  fits")
    older = {k: v for k, v in bandwidth.items() if k != "cache_bytes"}  # a run from before
    assert not any("fits" in line for line in floor.floor_lines({"b": 25e6}, {"b": 1.0}, older))
