"""``contracts pr`` against attacks that need two stages stacked (issue 28).

A user stacks the fast path on a KV cache (and padding on both); the fast
path's kernel then serves cached chunks and decode steps. A fastpath PR is
judged by the stages that run the fast path (``checks.context.importers``: kv_cache's
and padding's tests and drivers import it), whose oracle drivers drive fast
models through a cache. As in ``test_pr_real_attention``, each attack's harm
is shown first by a user-like probe on the PR's code and its absence on the
base's. A padding PR that drops the key mask for fast modules on a long
cache is judged by padding's oracle, which drives padded generation on fast
and explicit models (padding 3.4); an honest fastpath PR stays KEPT with
its three-stage closure.
"""

from __future__ import annotations

from typing import Any

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

FAST = "packages/fastpath/src/niels_gpt/model/fastpath/sdpa.py"
FRAME = "packages/padding/src/niels_gpt/model/padding/_frame.py"
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

# A user's script: a padded batch generated on the fast path, row 1 (8 pads) against its
# real prompt generated alone (sampled, a generator a row); prints how many tokens differ.
PADDED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate
torch.manual_seed(0)
gpt = use_fast_attention(GPT(ModelConfig(V=50, T=128, C=32, H=2, L=2, d_ff=64, dropout=0.0)).eval())
prompt = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.no_grad():  # sharper than the default init: logits of a few units
    for w in gpt.parameters():
        w.mul_(3.0)
mask = torch.ones(2, 12, dtype=torch.bool)
mask[1, :8] = False
rows = [torch.Generator().manual_seed(b) for b in (1, 2)]
ids = generate(gpt, prompt, mask, 50, generator=rows)  # (2, 62), row b draws from rows[b]
alone = generate(gpt, prompt[1:, 8:], None, 50, generator=[torch.Generator().manual_seed(2)])
print(int((ids[1:, 8:] != alone).sum()))
"""


def _oracle_stages(out: dict[str, Any]) -> set[str]:
    return {v["stage"] for v in out["violations"] if v["check"] == "oracle:cpu"}


def _top_left_from(rows_cached: int) -> str:
    """The kernel's mask aligned top-left (query i sees keys 0 .. i) once the cache
    holds ``rows_cached`` rows or more: a one-token step then sees key 0 alone."""
    return VISIBLE + (
        f"    if S - T >= {rows_cached}:\n"
        "        visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()\n"
    )


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


def test_a_padded_frame_dropping_the_key_mask_on_the_fast_path_is_found(
    real_repo: RealRepo,
) -> None:
    """Padding hands a fast module no key mask once the cache holds 16 columns, so the
    fast kernel serves the decode step and the new token attends to the row's pads."""
    real_repo.replace(
        FRAME,
        "        return args, {**kwargs, **frame.arguments(p, args[0].shape[1])}\n",
        "        keywords = frame.arguments(p, args[0].shape[1])\n"
        '        if p >= 16 and getattr(module, "kernel", None) is not None:\n'
        '            keywords = {"positions": keywords["positions"]}\n'
        "        return args, {**kwargs, **keywords}\n",
    )
    real_repo.pr("padding")
    assert int(real_repo.probe(PADDED)) > 5  # 18 of its 50 tokens here
    assert int(real_repo.probe(PADDED, "main")) == 0
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    assert "padding" in _oracle_stages(out), out["violations"]


def test_a_docstring_edit_of_the_fast_kernel_is_kept(real_repo: RealRepo) -> None:
    """Control: an honest fastpath PR, whose closure now holds kv_cache and padding too
    (their drivers import the fast path), is judged KEPT on all three."""
    real_repo.replace(FAST, "    ``(B, H, T, D)``.", "    ``(B, H, T, D)``, one row a query.")
    real_repo.pr("fastpath")
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 0, out["violations"]
    assert rows(out)["oracle:cpu"] == "KEPT"
    oracle = next(o["summary"] for o in out["outcomes"] if o["check"] == "oracle:cpu")
    assert "of 3 stage(s) agree" in oracle, oracle  # fastpath's, kv_cache's, padding's
    tests = next(o["summary"] for o in out["outcomes"] if o["check"] == "tests:cpu")
    assert tests.startswith("3 reference tests"), tests
