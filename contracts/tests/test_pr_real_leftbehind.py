"""``contracts pr`` on what a call leaves behind: aliased outputs, replayed masks, grad mode.

Three attention PRs whose answers are right call by call, each harmful to a
user in what the call leaves behind (issue 28, item 2). The harm is proved
first by a user's script on the PR's code and on the base's; then the
oracle's aftermath (``verdict/oracle_aftermath``) must name it as
``oracle.side-effect``.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
PROJECT = (
    "        y: torch.Tensor = self.resid_dropout(self.proj(out.view(B, T, C)))  # (B, T, C)\n"
)
ATTEND = (
    "        out, probs = self._core(q, k, v, p, key_mask, return_attn, plain)  # (B, T, H, D)\n"
)
DROP_PROBS = "            kept = self.attn_dropout(probs).to(v.dtype)  # (B, H, R, r1)\n"
SETUP = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
"""
# A user's script: keep one output, compute another, look at the first again.
KEPT_OUTPUT = (
    SETUP
    + """
attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).eval()
x1, x2 = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    first = attn(x1)
    saved = first.clone()
    attn(x2)
print(float((first - saved).abs().max()))
"""
)
# A user's script: two training forwards of one input draw two dropout masks.
TWO_MASKS = (
    SETUP
    + """
attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.5)).train()
x = torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(1))
print(float((attn(x) - attn(x)).abs().max()))
"""
)
# A user's script: generation under no_grad, then a tensor op of the user's own.
GRAD_AFTER = (
    SETUP
    + """
attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).eval()
x = torch.randn(1, 8, 8)
with torch.no_grad():
    attn(x)
    mine = attn.proj(x)
print(int(mine.requires_grad))
"""
)


def _side_effect(repo: RealRepo) -> None:
    code, out, _ = repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    assert "oracle.side-effect" in rules_of(out), [v["message"][:300] for v in out["violations"]]


def test_outputs_aliased_to_a_buffer_the_next_call_overwrites_are_refused(
    real_repo: RealRepo,
) -> None:
    """Without gradients every output is one reused buffer: each value right when
    returned, the previous output silently rewritten by the next call."""
    real_repo.replace(
        ATTN,
        PROJECT,
        PROJECT
        + "        if not torch.is_grad_enabled():  # one buffer, nobody differentiates\n"
        + '            buf = getattr(self, "_y_buf", None)\n'
        + "            if buf is None or buf.shape != y.shape or buf.dtype != y.dtype:\n"
        + "                buf = self._y_buf = torch.empty_like(y)  # (B, T, C)\n"
        + "            y = buf.copy_(y)  # (B, T, C)\n",
    )
    real_repo.pr("attention")
    assert float(real_repo.probe(KEPT_OUTPUT)) > 1e-3
    assert float(real_repo.probe(KEPT_OUTPUT, "main")) == 0.0
    _side_effect(real_repo)


def test_dropout_masks_replayed_from_a_fresh_generator_are_refused(real_repo: RealRepo) -> None:
    """Each call draws its dropout masks from a new generator, so from one stream
    that starts over: every training step drops the same units."""
    real_repo.replace(
        ATTN,
        "class CausalSelfAttention(",
        "def _replayed(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:\n"
        '    """Dropout from a generator made here: the same mask every call."""\n'
        "    if not training or p == 0.0:\n"
        "        return x\n"
        "    gen = torch.Generator(device=x.device)\n"
        "    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p  # x's shape\n"
        "    return x * keep / (1.0 - p)  # x's shape\n\n\n"
        "class CausalSelfAttention(",
    )
    real_repo.replace(
        ATTN,
        DROP_PROBS,
        DROP_PROBS.replace(
            "self.attn_dropout(probs)", "_replayed(probs, self.attn_dropout.p, self.training)"
        ),
    )
    real_repo.replace(
        ATTN,
        PROJECT,
        PROJECT.replace(
            "self.resid_dropout(self.proj(out.view(B, T, C)))",
            "_replayed(self.proj(out.view(B, T, C)), self.resid_dropout.p, self.training)",
        ),
    )
    real_repo.pr("attention")
    assert float(real_repo.probe(TWO_MASKS)) == 0.0
    assert float(real_repo.probe(TWO_MASKS, "main")) > 1e-3
    _side_effect(real_repo)


def test_grad_mode_switched_back_on_after_the_core_is_refused(real_repo: RealRepo) -> None:
    """Grad mode turned on after the core, where it should have been restored: a
    caller under ``no_grad`` records a graph for every op after the call."""
    real_repo.replace(
        ATTN,
        ATTEND,
        ATTEND
        + "        torch.set_grad_enabled(True)  # back on (it should restore what it was)\n",
    )
    real_repo.pr("attention")
    assert real_repo.probe(GRAD_AFTER).strip() == "1"
    assert real_repo.probe(GRAD_AFTER, "main").strip() == "0"
    _side_effect(real_repo)
