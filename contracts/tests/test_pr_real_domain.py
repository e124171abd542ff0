"""``contracts pr`` against bugs outside the oracle's old domain, on the real stages.

The specs declare domain axes (``[oracle].axes``) and the drivers sweep them
(``specs/<stage>/<stage>_oracle_domain.py``, calls ``domain/...``). Each bug
here agrees with the base at unit scale, to first order and on a fresh
module, so the earlier calls never saw it. Its harm is proved first, outside
the gate (``repo.probe``, a user's script on the PR's sources and on
``main``'s); then the verdict must be BROKEN by the call of the axis that
reaches it. The honest control (a docstring edit of attention) is
``test_pr_real_controls.py``'s.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
BLOCK = "packages/block/src/niels_gpt/model/block_v0/block.py"
SOFTMAX = "            probs = torch.softmax(scores, dim=-1)  # (B, H, R, r1)\n"
MASK = "        allowed = self.mask[:, :, p:S, :S]  # (1, 1, T, S) view of the tril buffer\n"
LENGTH = "        check_length(T, self.cfg.T)\n"

# A user's activations grown 30 times: does attention still return numbers?
SCALED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
torch.manual_seed(0)
attn = CausalSelfAttention(ModelConfig(V=2, T=64, C=64, H=4, dropout=0.0)).eval()
x = torch.randn(2, 64, 64)
with torch.no_grad():
    print(int(attn(30.0 * x).isnan().sum()), int(attn(x).isnan().sum()))
"""

# A gradient penalty's Hessian-vector product through block_v0's MLP, against the same
# weights in plain torch (Linear, F.gelu, Linear).
HVP = """
import torch
import torch.nn.functional as F
from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP
torch.manual_seed(0)
mlp = MLP(ModelConfig(V=2, T=8, C=16, H=2, d_ff=64)).double()
x = 2.0 * torch.randn(2, 8, 16, dtype=torch.float64)
v = torch.randn_like(x)
def hvp(f):
    z = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(z).square().sum(), z, create_graph=True)
    (h,) = torch.autograd.grad((g * v).sum(), z)
    return h
plain = hvp(lambda z: F.linear(F.gelu(F.linear(z, mlp.fc.weight, mlp.fc.bias)),
                               mlp.proj.weight, mlp.proj.bias))
print(float((hvp(mlp) - plain).norm() / plain.norm()))
"""

# A training run of 2100 steps on one module, then: do later tokens move earlier outputs?
LONG_RUN = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
torch.manual_seed(0)
attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0))
x = torch.randn(2, 16, 8)
for _ in range(2100):
    attn(x).square().mean().backward()
later = x.clone()
later[:, 10:] += 1.0
attn.eval()
with torch.no_grad():
    print(float((attn(x)[:, :10] - attn(later)[:, :10]).abs().max()))
"""


def _broken_by(repo: RealRepo, call: str) -> None:
    """The verdict is BROKEN by the oracle, on a ``domain/...`` call named ``call``."""
    code, out, _ = repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    differs = [v["message"] for v in out["violations"] if v["rule"] == "oracle.differs"]
    assert any(call in m for m in differs), differs


def test_softmax_without_the_row_max_is_refused_at_scale(real_repo: RealRepo) -> None:
    """exp(s) / sum(exp(s)): exact at unit scale, NaN once the scores pass float32's exp range."""
    real_repo.replace(
        ATTN,
        SOFTMAX,
        "            probs = scores.exp()  # (B, H, R, r1)\n"
        "            probs = probs / probs.sum(-1, keepdim=True)  # (B, H, R, r1)\n",
    )
    real_repo.pr("attention")
    at_scale, at_unit = map(int, real_repo.probe(SCALED).split())
    assert at_scale > 0 and at_unit == 0  # NaN at x30 on the PR's code
    assert real_repo.probe(SCALED, "main").split() == ["0", "0"]
    _broken_by(real_repo, "domain/magnitude/")


def test_an_activation_with_a_wrong_second_derivative_is_refused(real_repo: RealRepo) -> None:
    """A custom autograd GELU: exact value and gradient, a detached factor in its backward."""
    real_repo.replace(BLOCK, "import torch\n", "import math\n\nimport torch\n")
    real_repo.replace(
        BLOCK,
        "\nclass MLP(nn.Module):",
        '''
class _Gelu(torch.autograd.Function):
    """GELU with a hand-written backward (saves the erf of the autograd graph)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x.detach() ** 2) / math.sqrt(2.0 * math.pi)
        return grad * (cdf + x * pdf)


class _GeluModule(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Gelu.apply(x)
        return out

'''
        + "\nclass MLP(nn.Module):",
    )
    real_repo.replace(BLOCK, "self.act = nn.GELU()", "self.act = _GeluModule()")
    real_repo.pr("block")
    assert float(real_repo.probe(HVP)) > 0.01  # the Hessian-vector product is off by over 1%
    assert float(real_repo.probe(HVP, "main")) == 0.0
    _broken_by(real_repo, "domain/grad2/")


def test_attention_that_leaks_after_2000_training_calls_is_refused(real_repo: RealRepo) -> None:
    """Each module counts its training calls; past 2000 its mask shows the next token."""
    real_repo.replace(
        ATTN,
        LENGTH,
        LENGTH + "        if self.training:\n"
        '            self._steps = getattr(self, "_steps", 0) + 1\n',
    )
    real_repo.replace(
        ATTN,
        MASK,
        '        full = self.mask if getattr(self, "_steps", 0) < 2000 else self.mask.new_ones('
        "self.mask.shape).tril(1)\n"
        "        allowed = full[:, :, p:S, :S]  # (1, 1, T, S)\n",
    )
    real_repo.pr("attention")
    assert float(real_repo.probe(LONG_RUN)) > 1e-3  # earlier outputs see a later token
    assert float(real_repo.probe(LONG_RUN, "main")) == 0.0
    _broken_by(real_repo, "domain/history/")
