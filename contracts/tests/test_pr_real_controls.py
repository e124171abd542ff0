"""Honest PRs on the real stages stay KEPT with the oracle, the name rules and the
confinement in place (controls of ``test_pr_real_*``)."""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
PAD = "packages/padding/src/niels_gpt/model/padding/padded.py"


def _kept(repo: RealRepo, *extra: str) -> dict[str, str]:
    code, out, err = repo.verdict("--skip-mutants", *extra)
    assert code == 0, (out.get("violations"), err[-3000:])
    status = rows(out)
    assert status["oracle:cpu"] == "KEPT"
    return status


def test_a_docstring_edit_of_attention_is_kept(real_repo: RealRepo) -> None:
    real_repo.replace(ATTN, "rotary position embeddings:", "rotary position embeddings (RoPE):")
    real_repo.pr("attention")
    status = _kept(real_repo)
    assert status["source"] == status["sandbox"] == status["tests:cpu"] == "KEPT"


def test_a_new_attention_test_is_kept(real_repo: RealRepo) -> None:
    real_repo.write(
        "packages/attention/tests/test_attention_more.py",
        "import pytest\nimport torch\n\nfrom niels_gpt.config import ModelConfig\n"
        "from niels_gpt.model.attention import CausalSelfAttention\n\n\n"
        '@pytest.mark.invariant("attention.shape_dtype_device")\n'
        "def test_shape():\n"
        "    attn = CausalSelfAttention(ModelConfig(V=2, T=8, C=8, H=2))\n"
        "    assert attn(torch.zeros(1, 3, 8)).shape == (1, 3, 8)\n",
    )
    real_repo.pr("attention")
    _kept(real_repo)


def test_a_faster_but_equal_attention_is_kept(real_repo: RealRepo) -> None:
    """Another blocking and another (exact) masking: the same numbers within the bound."""
    real_repo.replace(ATTN, "QUERY_BLOCK: int = 128", "QUERY_BLOCK: int = 96")
    real_repo.replace(
        ATTN,
        "scores = scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)",
        "scores = torch.where(visible, scores, torch.finfo(scores.dtype).min)",
    )
    real_repo.pr("attention")
    _kept(real_repo)


def test_a_docstring_edit_of_padding_is_kept(real_repo: RealRepo) -> None:
    real_repo.replace(
        PAD,
        "a padded forward, padded generation and a padded loss",
        "a padded forward, generation and loss",
    )
    real_repo.pr("padding")
    _kept(real_repo)


def test_a_stages_first_pr_is_judged_against_the_float64_reference(
    first_pr_repo: RealRepo,
) -> None:
    """No base code to compare with: the spec's float64 reference stands in."""
    first_pr_repo.pr("attention", "the attention stage")
    code, out, err = first_pr_repo.verdict("--skip-mutants")
    assert code == 0, (out.get("violations"), err[-3000:])
    assert rows(out)["oracle:cpu"] == "KEPT"
    assert "reference" in err  # the reference worker ran


@pytest.mark.smoke
def test_a_first_pr_that_leaks_differs_from_the_reference(first_pr_repo: RealRepo) -> None:
    first_pr_repo.replace(ATTN, "dtype=torch.bool))  # (T, T)", "dtype=torch.bool), 1)  # (T, T)")
    first_pr_repo.pr("attention", "the attention stage")
    code, out, _ = first_pr_repo.verdict("--skip-mutants")
    assert code == 1
    differs = [v for v in out["violations"] if v["rule"] == "oracle.differs"]
    assert differs and "float64 reference" in differs[0]["message"], out["violations"]
