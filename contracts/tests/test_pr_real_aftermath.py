"""``contracts pr`` on what a call costs and leaves behind, not only what it returns.

The oracle's worker also counts the ATen ops and FLOPs a call dispatches
(on calls drawn from the secret seed) and reports the global state after it;
the trusted side compares both with the base's (``verdict/oracle_aftermath``).
Harm is proved first outside the gate, by a user's script that counts the ops
a forward dispatches (a count, not a timing: the same on any machine).
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
BLOCKS = (
    "        QB = self.QUERY_BLOCK  # one block: no range over p, which compiles as a symbolic"
    " size\n"
)
FILL = (
    "            scores = scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)"
    "  # (B, H, R, r1)\n"
)
# A user's generation-like forward (gradients off, T=1024): how many ops does it dispatch?
OPS = """
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

class Count(TorchDispatchMode):
    n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {}))

attn = CausalSelfAttention(ModelConfig(V=2, T=1024, C=64, H=4, dropout=0.0)).eval()
x = torch.randn(1, 1024, 64)
with torch.no_grad(), Count():
    attn(x)
print(Count.n)
"""


def test_attention_that_scores_one_row_at_a_time_without_gradients_costs_too_much(
    real_repo: RealRepo,
) -> None:
    """Same numbers, one query row a block whenever gradients are off (how generation
    runs): over a hundred times the ops at T=1024. No wall clock decides it. Not in the
    smoke subset: the PR's worker profiles every op of its watched calls (no-sdpa-runtime),
    about 13 GB and 7 minutes for this attack."""
    real_repo.replace(
        ATTN,
        BLOCKS,
        BLOCKS.replace(
            "QB = self.QUERY_BLOCK", "QB = self.QUERY_BLOCK if torch.is_grad_enabled() else 1"
        ),
    )
    real_repo.pr("attention")
    assert int(real_repo.probe(OPS)) > 10 * int(real_repo.probe(OPS, "main"))
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # the numbers are right
    assert "oracle.cost" in rules_of(out)


def test_skipping_the_mask_fill_where_every_key_is_seen_is_kept(real_repo: RealRepo) -> None:
    """Control: an honest speed-up (a one-token step with no key mask sees every key,
    so the fill changes nothing) dispatches fewer ops and stays KEPT."""
    real_repo.replace(
        ATTN,
        FILL,
        "            if not (key_mask is None and T == 1):\n    " + FILL,
    )
    real_repo.pr("attention")
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 0, [v["message"][:300] for v in out["violations"]]
    assert rows(out)["oracle:cpu"] == "KEPT"


CALL = "packages/attention/src/niels_gpt/model/attention/_call.py"
KEYS = "        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)\n"
# A user's script: the bytes a GPT's KV caches keep alive once set up.
CACHE_BYTES = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import use_kv_cache
gpt = GPT(ModelConfig(V=50, T=128, C=16, H=2, L=2, d_ff=32, dropout=0.0)).eval()
use_kv_cache(gpt, 2)
seen = {}
for m in gpt.modules():
    cache = getattr(m, "kv_cache", None)
    if cache is not None:
        for t in (cache.keys, cache.values):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
print(sum(seen.values()))
"""


def test_a_kv_cache_that_allocates_eight_times_its_keys_is_refused(real_repo: RealRepo) -> None:
    """An attention PR whose KVCache keys are a view of a storage 8 times too long: the
    same answers, the memory of a model eight times as long-context."""
    real_repo.replace(
        CALL,
        KEYS,
        "        big = (shape[0], shape[1], 8 * shape[2], shape[3])\n"
        "        self.keys = torch.zeros(big, dtype=dtype, device=device)[:, :, : shape[2]]\n",
    )
    real_repo.pr("attention")
    assert int(real_repo.probe(CACHE_BYTES)) > 4 * int(real_repo.probe(CACHE_BYTES, "main"))
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "oracle.memory" in rules_of(out)
