"""torch.compile over the cached decode step: no graph break, no recompile per position.

gpt-fast's recipe: a static cache allocated once and a one-token step that
the compiler captures whole. ``torch._dynamo.explain`` counts the graph
breaks of the step (plain and with a trace, explicit and fast path). The
compiled runs use ``fullgraph=True`` (a break would raise) and the
``aot_eager`` backend (Dynamo and AOT autograd, no C++ toolchain), and a
frame counter checks that the position, read from the size of a view of the
cache, becomes a symbolic size: two compilations (the first position, then
one graph for every later one) however many steps run, and one more for the
very last position, where the filled rows are the whole cache and the view
becomes contiguous (a stride guard of the matmul decomposition).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import use_kv_cache

pytestmark = pytest.mark.slow

CFG = ModelConfig(V=41, T=40, C=32, L=2, H=4, d_ff=48, dropout=0.1, rope_theta=900.0)
PROMPT = 7


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _prefilled(device: torch.device, fast: bool) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(CFG).to(device).eval()
    if fast:
        use_fast_attention(model)
    ids = torch.randint(0, CFG.V, (2, CFG.T), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)  # (B, T)
    use_kv_cache(model, 2)
    with torch.no_grad():
        model(ids[:, :PROMPT])  # the prefill, eager
    return model, ids


@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_the_decode_step_has_no_graph_breaks(device: torch.device, fast: bool) -> None:
    model, ids = _prefilled(device, fast)
    with torch.no_grad():
        for i, step in enumerate((model, lambda x: model.forward_with_attn_trace(x, 1))):
            report = torch._dynamo.explain(step)(ids[:, PROMPT + i : PROMPT + i + 1])
            assert report.graph_count == 1
            assert not report.break_reasons, [str(b.reason) for b in report.break_reasons]
            assert report.graph_break_count == 0


@pytest.mark.invariant("kv_cache.chunk_logits_match_full")
@pytest.mark.invariant("kv_cache.cache_fixed")
@pytest.mark.parametrize("fast", [False, True])
def test_compiled_steps_match_eager_with_one_graph_for_every_position(
    device: torch.device, fast: bool
) -> None:
    model, ids = _prefilled(device, fast)
    twin, _ = _prefilled(device, fast)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    step = torch.compile(model, backend=counter, fullgraph=True)
    keys = [b.attn.kv_cache.keys.data_ptr() for b in model.blocks]  # type: ignore[union-attr]
    compilations = []
    with torch.no_grad():
        for i in range(PROMPT, CFG.T):
            got = step(ids[:, i : i + 1])  # (B, 1, V)
            want = twin(ids[:, i : i + 1])  # (B, 1, V), eager
            torch.testing.assert_close(got, want)
            compilations.append(counter.frame_count)
    assert compilations[-2] == 2, compilations  # positions 7 .. T - 2: two graphs
    assert compilations[-1] <= 3, compilations  # the full cache may take a third
    assert [len(b.attn.kv_cache) for b in model.blocks] == [CFG.T] * CFG.L  # type: ignore[arg-type, union-attr]
    assert [b.attn.kv_cache.keys.data_ptr() for b in model.blocks] == keys  # type: ignore[union-attr]
