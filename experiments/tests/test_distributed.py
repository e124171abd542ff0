"""DDP and FSDP2 on 2 gloo ranks (127.0.0.1) against one process at the same global batch.

The reference is one process with ``grad_accum = 2``: it cuts every global
batch into the same two micro-batches the two ranks get, so each micro-batch's
forward and backward are the very same float32 computation on both sides, and
the only arithmetic that differs is how two partial gradients ``g1``, ``g2``
are combined.

Tolerances, from float32 (unit roundoff ``u = 2**-24``, one ulp ``<= 2**-23 |x|``):

- DDP divides each rank's gradient by 2 and all-reduces the sum:
  ``g1/2 + g2/2``. The reference accumulates ``g1/2`` and ``g2/2`` in
  ``.grad``. Halving is exact and one addition of the same two numbers rounds
  the same way, so the gradients, hence every step, are bit for bit equal:
  **tolerance 0** (and the logged losses ``(l1 + l2)/2`` too).
- FSDP2 reduce-scatters with scalings of its own, so the combined gradient
  may round once more: each element within one ulp, a relative difference
  ``rho <= 2**-23``. Per AdamW step ``p <- p (1 - lr wd) - lr m/(sqrt(v) + eps)``:
  (a) a relative gradient difference ``rho`` moves the update by at most
  ``lr rho / 4`` (the derivative of ``g / (|g| + eps)``, times ``rho |g|``,
  peaks at 1/4); (b) once the inputs differ, each run rounds on its own: two
  roundings on the parameter (``<= u |p|`` each) and about six on the update
  (moments, bias corrections, sqrt, divide, scale; ``<= u lr A`` each, where
  ``A = sup |m_hat| / sqrt(v_hat) <= 1.17`` for betas (0.9, 0.95) by
  Cauchy-Schwarz over the moving-average weights), and the two runs' errors
  can add. Summed over ``k`` steps, to first order:
  ``|dp| <= k (4 u |p| + lr (12 u A + rho / 4))``, so
  ``rtol = 4 k u`` and ``atol = k lr (12 u A + 2**-25)``.

A checkpoint written on 2 ranks resumes on 1, and one written on 1 resumes on
2, and each resumed curve meets the uninterrupted reference within the same
tolerance as the mode that wrote it.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from niels_gpt_experiments import checkpoint
from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.launch import RankResult, train_on_ranks
from niels_gpt_experiments.models import build_model, n_params
from niels_gpt_experiments.runtime import Runtime
from niels_gpt_experiments.trainer import TrainResult, train

pytestmark = pytest.mark.distributed

STEPS, STOP = 6, 3
LR = 3e-3
U = 2.0**-24  # float32 unit roundoff
ADAM_RATIO = 1.17  # sup |m_hat| / sqrt(v_hat) for betas (0.9, 0.95)
FSDP_TOL = {"rtol": 4 * STEPS * U, "atol": STEPS * LR * (12 * U * ADAM_RATIO + 2.0**-25)}
EXACT = {"rtol": 0.0, "atol": 0.0}


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """The reference and the ranks use one intra-op thread alike (same kernels)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, data_dir: Path, one_thread: None
) -> dict[str, TrainResult | RankResult]:
    """Every run, once: the references here, all 2-rank runs in one spawn."""
    root = tmp_path_factory.mktemp("dist")
    base = TrainConfig(
        T=16, C=16, L=2, H=2, steps=STEPS, batch_size=4, warmup=2, lr=LR, eval_every=STOP,
        eval_batches=1, sample_tokens=3, progress=False, corpus=corpus_dir, data_dir=data_dir,
        device="cpu", grad_accum=2,
    )  # fmt: skip

    def cfg(name: str, **kw: object) -> TrainConfig:
        return dataclasses.replace(base, out_dir=root / name, **kw)  # type: ignore[arg-type]

    out: dict[str, TrainResult | RankResult] = {}
    out["reference"] = train(cfg("reference"), keep_state=True)
    train(cfg("single-part", stop_after=STOP))
    shutil.copytree(root / "single-part", root / "one-to-two")
    cli = (
        "--context", "16", "--width", "16", "--layers", "2", "--heads", "2",
        "--steps", str(STEPS), "--batch-size", "4", "--warmup", "2", "--lr", str(LR),
        "--eval-every", str(STOP), "--eval-batches", "1", "--sample-tokens", "3",
        "--corpus", str(corpus_dir), "--data-dir", str(data_dir), "--device", "cpu",
        "--no-progress", "--fsdp", "--out", str(root / "cli-fsdp"),
    )  # fmt: skip
    two = [
        cfg("ddp", grad_accum=1),
        cfg("fsdp", grad_accum=1, fsdp=True),
        cfg("fsdp-part", grad_accum=1, fsdp=True, stop_after=STOP, sample_tokens=0),
        cfg("one-to-two", grad_accum=1, resume=True, sample_tokens=0),
        cli,
    ]
    ranked = train_on_ranks(two, world=2, timeout_s=240, threads=1)
    for name, result in zip(("ddp", "fsdp", "fsdp-part", "one-to-two"), ranked, strict=False):
        assert result is not None
        out[name] = result
    out["cli-fsdp"] = _load_final(root / "cli-fsdp", base)
    shutil.copytree(root / "fsdp-part", root / "two-to-one")
    out["two-to-one"] = train(cfg("two-to-one", resume=True, sample_tokens=0), keep_state=True)
    return out


def _load_final(run_dir: Path, cfg: TrainConfig) -> TrainResult:
    """The final weights of a run, read from its last checkpoint on this one process."""
    found = checkpoint.latest(run_dir)
    assert found is not None and found.name == f"step-{STEPS:07d}"
    torch.manual_seed(1)  # other initial weights than the run's: the load must overwrite them
    model = build_model("v1", cfg.model_config())
    optimizer = torch.optim.AdamW(model.parameters())
    state = checkpoint.load(found, model, optimizer, Runtime(0, 1, torch.device("cpu"), False))
    assert state["step"] == STEPS
    result = TrainResult(cfg, "single", 1, 0, n_params(model), STEPS)
    result.final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return result


def _state(run: TrainResult | RankResult) -> dict[str, torch.Tensor]:
    assert run.final_state is not None
    return run.final_state


def _close(run: TrainResult | RankResult, ref: TrainResult, tol: dict[str, float]) -> None:
    want = _state(ref)
    got = _state(run)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, **tol, msg=lambda m, n=name: f"{n}: {m}")


def test_ddp_equals_one_process_bit_for_bit(runs: dict[str, TrainResult | RankResult]) -> None:
    ref = runs["reference"]
    assert isinstance(ref, TrainResult)
    _close(runs["ddp"], ref, EXACT)
    assert runs["ddp"].losses == ref.losses and runs["ddp"].val_losses == ref.val_losses


def test_fsdp_equals_one_process_within_reduction_order(
    runs: dict[str, TrainResult | RankResult],
) -> None:
    ref = runs["reference"]
    assert isinstance(ref, TrainResult)
    _close(runs["fsdp"], ref, FSDP_TOL)
    for step, loss in ref.losses.items():
        assert runs["fsdp"].losses[step] == pytest.approx(loss, rel=1e-6)


def test_the_tie_survives_fsdp(runs: dict[str, TrainResult | RankResult]) -> None:
    state = _state(runs["fsdp"])
    # An untied head would have been updated with other gradients than the embedding.
    assert torch.equal(state["lm_head.weight"], state["tok_emb.weight"])
    assert not torch.equal(state["tok_emb.weight"], _initial_embedding())


def _initial_embedding() -> torch.Tensor:
    torch.manual_seed(0)
    cfg = TrainConfig(T=16, C=16, L=2, H=2).model_config()
    return build_model("v1", cfg).tok_emb.weight.detach()


def test_torchrun_style_cli_fsdp_run_loads_on_one_process(
    runs: dict[str, TrainResult | RankResult],
) -> None:
    ref = runs["reference"]
    assert isinstance(ref, TrainResult)
    _close(runs["cli-fsdp"], ref, FSDP_TOL)


def test_two_rank_checkpoint_resumes_on_one(runs: dict[str, TrainResult | RankResult]) -> None:
    ref, resumed = runs["reference"], runs["two-to-one"]
    assert isinstance(ref, TrainResult) and isinstance(resumed, TrainResult)
    assert resumed.first_step == STOP and sorted(resumed.losses) == list(range(STOP + 1, STEPS + 1))
    _close(resumed, ref, FSDP_TOL)


def test_one_rank_checkpoint_resumes_on_two(runs: dict[str, TrainResult | RankResult]) -> None:
    ref, resumed = runs["reference"], runs["one-to-two"]
    assert isinstance(ref, TrainResult)
    assert sorted(resumed.losses) == list(range(STOP + 1, STEPS + 1))
    _close(resumed, ref, EXACT)  # 1 process then DDP: both exact against the reference
    assert resumed.losses == {s: v for s, v in ref.losses.items() if s > STOP}
