"""The sizes of grouped-query attention: KV cache bytes a token, the K/V head of a query head."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.gqa import cache_bytes_per_token, kv_head_of
from niels_gpt.model.kv_cache import use_kv_cache


@pytest.mark.invariant("gqa.sizes")
@pytest.mark.parametrize("h_kv", [None, 4, 2, 1])
def test_cache_bytes_are_what_use_kv_cache_allocates(h_kv: int | None) -> None:
    cfg = ModelConfig(V=11, T=16, C=32, L=3, H=4, d_ff=8, H_kv=h_kv)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        caches = use_kv_cache(GPT(cfg).to(dtype), 1)
        held = sum(c.keys.nbytes + c.values.nbytes for c in caches)  # bytes for cfg.T tokens
        assert cache_bytes_per_token(cfg, dtype) * cfg.T == held


@pytest.mark.invariant("gqa.sizes")
def test_each_query_head_reads_the_kv_head_the_attention_uses() -> None:
    cfg = ModelConfig(V=11, T=8, C=48, H=6, H_kv=3)
    assert [kv_head_of(cfg, h) for h in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [kv_head_of(ModelConfig(V=11, H=8), h) for h in range(8)] == list(range(8))
    assert CausalSelfAttention(cfg).n_kv_head == 3


@pytest.mark.invariant("gqa.sizes")
@pytest.mark.parametrize("head", [-1, 6, True, 1.0, "0"])
def test_bad_heads_and_dtypes_are_refused_naming_both(head: object) -> None:
    cfg = ModelConfig(V=11, C=48, H=6, H_kv=3)
    with pytest.raises(InputError, match=rf"\[0, 6\), got {head!r}"):
        kv_head_of(cfg, head)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"torch\.int64"):
        cache_bytes_per_token(cfg, torch.int64)
