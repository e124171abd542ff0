"""``contracts pr`` against code that goes wrong only past the sizes of the oracle's grid.

The drivers' other calls draw small tensors (quant's weights have at most 96
rows). The ``size`` axis (``specs/_kit/speckit/sizes.py``) runs each
shape-polymorphic function once at GPT-2 small's sizes and once at sizes drawn
wide by the secret seed. The PR here quantizes large weights in pieces and
writes a short last piece's scales at the wrong offset: every weight whose row
count is past the piece size and not a multiple of it (GPT-2's 2304-row
attention projection) comes out a third off. Its harm is shown first by a
user's script on the PR's code and on the base's; then the verdict must be
BROKEN by the oracle, on a ``size/...`` call. Without those calls the same
PR was KEPT (the closing note of issue 45 quotes that verdict).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from realkit import RealRepo, add_stage, rows, strip_mutants

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run --full

QUANT = "packages/quant/src/niels_gpt/model/quant/int8.py"
QMAX = "QMAX = 127"
CODES = "    w = weight.detach().to(torch.float64)  # (O, I)\n"
PIECES = """    rows = weight.shape[0]
    if rows > PIECE:  # bound the float64 temporaries: PIECE rows at a time
        codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)  # (O, I)
        scales = weight.new_zeros(rows)  # (O,)
        for n, start in enumerate(range(0, rows, PIECE)):
            q, s = quantize_weight(weight[start : start + PIECE])  # (p, I), (p,)
            codes[start : start + PIECE] = q
            scales[n * len(s) : (n + 1) * len(s)] = s
        return codes, scales
"""

# A user quantizes GPT-2 small's attention projection and compares it with the float layer.
USER = """
import torch
from niels_gpt.model.quant import quantize_linear
torch.manual_seed(0)
linear = torch.nn.Linear(768, 2304)
x = torch.randn(4, 768)
with torch.no_grad():
    exact, y = linear(x), quantize_linear(linear)(x)
print(float((y - exact).norm() / exact.norm()))
"""


@pytest.fixture
def quant_repo(real_template: Path, tmp_path: Path) -> RealRepo:
    """The real-stage repository with the quant stage landed on ``main`` (its package and
    one small test, its spec without mutants), on a PR branch ``pr``."""
    dest = tmp_path / "repo"
    shutil.copytree(real_template, dest, symlinks=True)
    repo = RealRepo(dest, tmp_path / "cache")
    repo.write("specs/quant.toml", strip_mutants(repo.read("specs/quant.toml"), ()))
    add_stage(repo, "quant")
    repo.commit("quant lands")
    repo.branch("pr")
    return repo


def test_weights_quantized_in_pieces_past_the_grids_sizes_are_refused(
    quant_repo: RealRepo,
) -> None:
    """'Bound the temporaries': rows past 1024 quantized 1024 at a time, the short last
    piece's scales written over the first piece's; GPT-2's 2304-row layer 33% off."""
    quant_repo.replace(
        QUANT,
        QMAX,
        "PIECE = 1024  # rows quantized at once; a larger weight goes in pieces\n" + QMAX,
    )
    quant_repo.replace(QUANT, CODES, PIECES + CODES)
    quant_repo.pr("quant")
    assert float(quant_repo.probe(USER)) > 0.1  # a third off on the PR's code
    assert float(quant_repo.probe(USER, "main")) < 0.01  # the int8 rounding alone on the base's
    code, out, _ = quant_repo.verdict_stopping()
    assert code == 1, rows(out)
    assert rows(out)["oracle:cpu"] == "BROKEN", rows(out)
    oracle = [v["message"] for v in out["violations"] if v["rule"].startswith("oracle.")]
    assert any("size/" in m for m in oracle), [m[:300] for m in oracle]


def test_an_honest_refactor_of_quantize_weight_is_kept(quant_repo: RealRepo) -> None:
    """The control: the rows' largest magnitudes taken with ``max(dim=1).values``, the same
    numbers at every size, the size calls included (against the base and the reference)."""
    quant_repo.replace(
        QUANT,
        "    amax = w.abs().amax(dim=1)  # (O,) float64\n",
        "    amax = w.abs().max(dim=1).values  # (O,) float64\n",
    )
    quant_repo.pr("quant")
    code, out, _ = quant_repo.verdict_stopping()
    assert code == 0, [v["message"][:300] for v in out["violations"]]
    assert rows(out)["oracle:cpu"] == "KEPT"
