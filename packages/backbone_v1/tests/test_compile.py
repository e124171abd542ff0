"""torch.compile over the explicit GPT v1: one graph, no breaks, same numbers.

``torch._dynamo.explain`` traces without generating kernels, so these tests
check that ``torch.compile(model, fullgraph=True)`` can capture the forward,
the attention trace and the model part of a training step (forward and loss;
AOT autograd derives the backward from that graph). ``AdamW.step`` is left out
of the fullgraph claim: torch itself puts a deliberate graph break around every
optimizer step (``_use_grad`` in ``torch/optim/optimizer.py``), so it runs
eager. The compiled runs use the ``aot_eager`` backend: dynamo and AOT
autograd as with inductor, without needing a C++ toolchain. The sequence
length spans several query blocks of the attention core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT

pytestmark = pytest.mark.slow

CFG = ModelConfig(V=64, T=300, C=32, L=2, H=4, d_ff=48, dropout=0.1)
T_LONG = 2 * CausalSelfAttention.QUERY_BLOCK + 7  # three query blocks


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _batch(device: torch.device, t: int = T_LONG) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CFG.V, (2, t + 1), generator=gen)
    return ids[:, :-1].to(device), ids[:, 1:].to(device)  # (B, t) each


def _loss(model: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)  # (B, t, V)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    return loss


def _breaks(fn: Callable[..., object], *args: object) -> int:
    report = torch._dynamo.explain(fn)(*args)
    assert report.graph_count >= 1
    assert not report.break_reasons, [str(b.reason) for b in report.break_reasons]
    count: int = report.graph_break_count
    return count


def test_forward_has_no_graph_breaks(device: torch.device) -> None:
    model = GPT(CFG).to(device).eval()
    x, _ = _batch(device)
    assert _breaks(model, x) == 0


def test_forward_with_attn_trace_has_no_graph_breaks(device: torch.device) -> None:
    model = GPT(CFG).to(device).eval()
    x, _ = _batch(device)
    assert _breaks(model.forward_with_attn_trace, x, 1, True) == 0
    assert _breaks(model.forward_with_attn_trace, x, 0) == 0


def test_training_step_has_no_graph_breaks(device: torch.device) -> None:
    model = GPT(CFG).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _batch(device)
    assert _breaks(_loss(model), x, y) == 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    _loss(compiled)(x, y).backward()  # the compiled graph's backward runs
    opt.step()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_compiled_training_step_matches_eager(device: torch.device) -> None:
    cfg_nodrop = ModelConfig(V=CFG.V, T=CFG.T, C=CFG.C, L=CFG.L, H=CFG.H, d_ff=CFG.d_ff, dropout=0)
    torch.manual_seed(0)
    eager = GPT(cfg_nodrop).to(device).train()
    torch.manual_seed(0)
    twin = GPT(cfg_nodrop).to(device).train()
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    x, y = _batch(device)

    loss_e = _loss(eager)(x, y)
    loss_c = _loss(compiled)(x, y)
    torch.testing.assert_close(loss_c, loss_e)
    loss_e.backward()
    loss_c.backward()
    for (name, p_e), p_c in zip(eager.named_parameters(), twin.parameters(), strict=True):
        assert p_e.grad is not None and p_c.grad is not None, name
        torch.testing.assert_close(p_c.grad, p_e.grad, msg=name)

    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_c = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    opt_e.step()
    opt_c.step()
    for p_e, p_c in zip(eager.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p_c, p_e)

    with torch.no_grad():
        logits, trace = compiled.forward_with_attn_trace(x, 1, return_full_attn=True)
        ref_logits, ref_trace = eager.forward_with_attn_trace(x, 1, return_full_attn=True)
    torch.testing.assert_close(logits, ref_logits)
    assert trace["attn_full"] is not None and ref_trace["attn_full"] is not None
    torch.testing.assert_close(trace["attn_full"], ref_trace["attn_full"])
