"""The spec decides, not history: a bug the base already has, judged by the float64 reference.

The base of the first scenario carries an attention bug merged earlier: a
query whose every key is masked (a left pad's row, or a row whose few
visible keys a key mask hides) gets a softmax spread over masked keys
instead of the zero row the spec promises. A PR that only edits a docstring
keeps the base's answers; the reference, not the base, must decide (issue
28, item 3). The second's base, on padding (no stage of the scenario
repository runs through it), divides the padded loss by the batch size
instead of the real tokens: the PR that fixes it changes the base's answers
and is KEPT, judged by the reference on those calls.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
ZERO_ROWS = (
    "            if key_mask is not None:  # a query that sees no key: an all-zero row\n"
    "                probs = probs.masked_fill(~visible.any(-1, keepdim=True), 0.0)"
    "  # (B, H, R, r1)\n"
)
# A user's script: the output of a query that sees no key (its only visible key masked).
HIDDEN = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).eval()
x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(1))
keys = torch.tensor([[False, True, True, True]])
with torch.no_grad():
    y, probs = attn(x, key_mask=keys, return_attn=True)
print(float(probs[0, :, 0].abs().sum()))
"""


def _base_with_the_bug(repo: RealRepo) -> None:
    """Merge the bug into main (an earlier PR), then branch ``pr`` from it."""
    repo.git("checkout", "-q", "main")
    repo.replace(ATTN, ZERO_ROWS, "")
    repo.commit("attention: an earlier merge that spreads a fully masked row's weight")
    repo.git("checkout", "-q", "-B", "pr", "main")
    assert float(repo.probe(HIDDEN, "main")) > 0.5  # the harm is on the base already


def test_a_docstring_pr_keeping_the_bases_bug_is_broken(real_repo: RealRepo) -> None:
    _base_with_the_bug(real_repo)
    real_repo.replace(ATTN, "The explicit core:", "The explicit attention core:")
    real_repo.pr("attention", "attention: docstring")
    assert float(real_repo.probe(HIDDEN)) > 0.5  # still wrong on the PR's code
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    assert "oracle.differs" in rules_of(out)
    found = [v["message"] for v in out["violations"] if v["rule"] == "oracle.differs"]
    assert any("differs from the float64 reference's" in m for m in found), found


PADDING = "packages/padding/src/niels_gpt/model/padding/padded.py"
PER_TOKEN = "    counted = attention_mask.sum().clamp(min=1)  # 0-d int64, max(N, 1)\n"
PER_ROW = "    counted = attention_mask.shape[0]  # (a bug: the batch size)\n"
# A user's script: the padded loss of one real token in a batch of two rows.
LOSS = """
import torch
import torch.nn.functional as F
from niels_gpt.model.padding import padded_cross_entropy
logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
targets = torch.tensor([[1, 2, 3], [4, 0, 1]])
mask = torch.tensor([[False, False, True], [False, False, False]])
got = padded_cross_entropy(logits, targets, mask)
print(float(got - F.cross_entropy(logits[0, 2:], targets[0, 2:])))
"""


def test_a_pr_fixing_the_bases_bug_is_kept(real_repo: RealRepo) -> None:
    real_repo.git("checkout", "-q", "main")
    real_repo.replace(PADDING, PER_TOKEN, PER_ROW)
    real_repo.commit("padding: an earlier merge that averages the loss over rows")
    real_repo.git("checkout", "-q", "-B", "pr", "main")
    assert abs(float(real_repo.probe(LOSS, "main"))) > 0.1  # the harm is on the base
    real_repo.replace(PADDING, PER_ROW, PER_TOKEN)
    real_repo.pr("padding", "padding: the loss is a mean over real tokens again")
    assert abs(float(real_repo.probe(LOSS))) < 1e-6  # fixed on the PR's code
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert rows(out)["oracle:cpu"] == "KEPT", [v["message"][:400] for v in out["violations"]]
    summary = next(o["summary"] for o in out["outcomes"] if o["check"] == "oracle:cpu")
    assert "the base differs from the float64 reference on" in summary, summary
    assert code == 0
