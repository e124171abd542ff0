"""``contracts pr`` against attacks that need two stages stacked (issue 28).

A user stacks the fast path on a KV cache (and padding on both); the fast
path's kernel then serves cached chunks and decode steps. A fastpath PR is
judged by the stages that run the fast path (``checks.importers``: kv_cache's
and padding's tests and drivers import it), whose oracle drivers drive fast
models through a cache. As in ``test_pr_real_attention``, each attack's harm
is shown first by a user-like probe on the PR's code and its absence on the
base's.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

FAST = "packages/fastpath/src/niels_gpt/model/fastpath/__init__.py"
VISIBLE = (
    "    visible = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device)"
    ".tril(S - T)\n"
)
# A user's script: a fast-path model fed a context through the KV cache, chunk by
# chunk, against one uncached forward of the same ids.
CACHED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, use_kv_cache
torch.manual_seed(0)
gpt = GPT(ModelConfig(V=50, T=64, C=16, H=2, L=1, d_ff=32, dropout=0.0)).eval()
use_fast_attention(gpt)
ids = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(0))
use_kv_cache(gpt, 1)
with torch.no_grad():
    chunks = [gpt(ids[:, p : p + n]) for p, n in ((0, 10), (10, 10), (20, 3), (23, 1), (24, 16))]
    drop_kv_cache(gpt)
    full = gpt(ids)
print(float((torch.cat(chunks, dim=1) - full).abs().max()))
"""


def _top_left_from(rows_cached: int) -> str:
    """The kernel's mask aligned top-left (query i sees keys 0 .. i) once the cache
    holds ``rows_cached`` rows or more: a one-token step then sees key 0 alone."""
    return VISIBLE + (
        f"    if S - T >= {rows_cached}:\n"
        "        visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()\n"
    )


@pytest.mark.smoke
def test_a_fast_kernel_wrong_on_a_cache_of_16_rows_is_found(real_repo: RealRepo) -> None:
    """A fastpath PR: exact without a cache (the fastpath oracle's own calls), garbage
    once 16 rows are cached. Its closure brings kv_cache and padding, which run it."""
    real_repo.replace(FAST, VISIBLE, _top_left_from(16))
    real_repo.pr("fastpath")
    assert float(real_repo.probe(CACHED)) > 1e-2
    assert float(real_repo.probe(CACHED, "main")) < 1e-5
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    differs = [v for v in out["violations"] if v["rule"].startswith("oracle.")]
    assert any(v["message"].startswith(("kv_cache:", "padding:")) for v in differs), differs


def test_a_fast_kernel_that_drops_the_last_cached_key_is_found(real_repo: RealRepo) -> None:
    """Own variant: with 24 or more cached rows the mask hides the newest cached key."""
    real_repo.replace(
        FAST,
        VISIBLE,
        VISIBLE + "    if S - T >= 24:\n"
        "        visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)\n"
        "        visible[:, S - T - 1] = False\n",
    )
    real_repo.pr("fastpath")
    assert float(real_repo.probe(CACHED)) > 1e-4
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "oracle.differs" in rules_of(out) or "oracle.invariant" in rules_of(out)
