"""``load_run``: a run folder back to the exact model, and every bad input by name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.loading import (
    RUN_FORMAT,
    LoadedRun,
    RunLoadError,
    load_run,
    model_record,
    read_model,
)
from niels_gpt_experiments.models import build_model
from niels_gpt_experiments.trainer import train

Tiny = Callable[..., TrainConfig]


def _trained_logits(
    cfg: TrainConfig, state: dict[str, torch.Tensor], ids: torch.Tensor
) -> torch.Tensor:
    """Logits of a model holding the trained run's final weights (what ``train`` returned)."""
    model = build_model(cfg.model, cfg.model_config())
    model.load_state_dict(state)
    logits: torch.Tensor = model.to(ids.device).eval()(ids)  # (B, t, V)
    return logits


def _ids(cfg: TrainConfig, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (2, cfg.T), generator=gen).to(device)  # (2, T) int64


def _write_legacy(run_dir: Path) -> None:
    """run.json as niels-train wrote it before format 2: no V, d_ff null meaning 3*C."""
    meta = json.loads((run_dir / "run.json").read_text())
    for key in ("format", "arch", "model_config"):
        del meta[key]
    (run_dir / "run.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("arch", ["v0", "v1"])
def test_a_loaded_run_gives_the_trained_models_logits(
    arch: str, tiny: Tiny, device: torch.device
) -> None:
    # Checkpoints at steps 2 and 4: the newest must be the one loaded.
    cfg = tiny(model=arch, steps=4, eval_every=2, dropout=0.1)
    result = train(cfg, keep_state=True)
    assert result.final_state is not None
    run = load_run(cfg.out_dir, device=device)
    assert isinstance(run, LoadedRun)
    assert (run.arch, run.step, run.run_dir) == (arch, 4, cfg.out_dir)
    assert run.config == cfg.model_config()  # the exact config, v0's matched d_ff included
    assert run.checkpoint.name == "step-0000004"
    assert not run.model.training and not dist.is_initialized()
    assert all(p.device.type == device.type for p in run.model.parameters())
    ids = _ids(cfg, device)
    with torch.no_grad():
        want = _trained_logits(cfg, result.final_state, ids)
        got = run.model(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same weights, bit for bit


def test_run_json_records_everything_the_model_needs(tiny: Tiny) -> None:
    cfg = tiny(model="v0", steps=2, eval_every=2)
    train(cfg)
    meta = json.loads((cfg.out_dir / "run.json").read_text())
    assert meta["format"] == RUN_FORMAT and meta["arch"] == "v0"
    assert meta["config"]["d_ff"] is None  # the setting as given, kept for --resume
    assert ModelConfig(**meta["model_config"]) == cfg.model_config()
    assert meta["model_config"]["V"] == 256 and meta["model_config"]["d_ff"] != 3 * cfg.C


@pytest.mark.parametrize("arch", ["v0", "v1"])
def test_a_legacy_run_json_loads_by_the_documented_rule(
    arch: str, tiny: Tiny, device: torch.device
) -> None:
    cfg = tiny(model=arch, steps=2, eval_every=2)
    result = train(cfg, keep_state=True)
    assert result.final_state is not None
    _write_legacy(cfg.out_dir)
    run = load_run(cfg.out_dir, device=device)
    assert run.config == cfg.model_config() and run.arch == arch and run.config.V == 256
    ids = _ids(cfg, device)
    with torch.no_grad():
        torch.testing.assert_close(
            run.model(ids), _trained_logits(cfg, result.final_state, ids), rtol=0, atol=0
        )


def test_a_config_that_disagrees_with_the_checkpoint_is_named(tiny: Tiny) -> None:
    cfg = tiny(steps=2, eval_every=2)
    train(cfg)
    meta = json.loads((cfg.out_dir / "run.json").read_text())
    meta["model_config"]["d_ff"] = 40
    (cfg.out_dir / "run.json").write_text(json.dumps(meta))
    with pytest.raises(RunLoadError, match=r"does not match .*w_a\.weight: checkpoint \(48, 16\)"):
        load_run(cfg.out_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, data_dir: Path) -> Path:
    """One finished tiny run; tests copy its files into run folders they break."""
    out = tmp_path_factory.mktemp("trained")
    train(TrainConfig(
        T=16, C=16, L=2, H=2, steps=2, batch_size=4, warmup=1, eval_every=2, eval_batches=1,
        sample_tokens=0, progress=False, corpus=corpus_dir, data_dir=data_dir, out_dir=out,
        device="cpu",
    ))  # fmt: skip
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _edit_meta(run_dir: Path, edit: Callable[[dict[str, object]], object]) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    edit(meta)
    (run_dir / "run.json").write_text(json.dumps(meta))


def _set(meta: dict[str, object], key: str, value: object) -> None:
    meta[key] = value


def _set_size(meta: dict[str, object], key: str, value: object) -> None:
    fields = meta["model_config"]
    assert isinstance(fields, dict)
    fields[key] = value


def _drop(fields: object, key: str) -> None:
    assert isinstance(fields, dict)
    del fields[key]


def _drop_size(meta: dict[str, object], key: str) -> None:
    fields = meta["model_config"]
    assert isinstance(fields, dict)
    del fields[key]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: _set(m, "arch", "v9"), r"run.json 'arch' must be one of v0, v1, got 'v9'"),
        (lambda m: m.pop("model_config"), r"run.json lacks model_config"),
        (lambda m: _drop_size(m, "V"), r"run.json 'model_config' lacks V \(has: T, C"),
        (lambda m: _set_size(m, "d_ff", 0), r"not a valid ModelConfig: .*d_ff must be positive"),
        (lambda m: _set_size(m, "colour", 1), r"fields ModelConfig does not know: colour"),
        (lambda m: _set(m, "format", 3), r"format must be 1 \(legacy\) or 2, got 3"),
        (lambda m: _set(m, "model_config", [1]), r"'model_config' must be a JSON object, got list"),
    ],
)
def test_a_run_json_without_what_the_model_needs_is_refused(
    edit: Callable[[dict[str, object]], object], message: str, trained: Path, tmp_path: Path
) -> None:
    run_dir = _copy(trained, tmp_path / "run")
    _edit_meta(run_dir, edit)
    with pytest.raises(RunLoadError, match=message):
        load_run(run_dir)


def test_a_legacy_run_json_without_sizes_is_refused(trained: Path, tmp_path: Path) -> None:
    run_dir = _copy(trained, tmp_path / "run")
    _write_legacy(run_dir)
    _edit_meta(run_dir, lambda m: _drop(m["config"], "H"))
    with pytest.raises(RunLoadError, match=r"run.json 'config' lacks H"):
        load_run(run_dir)


def test_what_is_not_a_run_folder_is_refused(trained: Path, tmp_path: Path) -> None:
    with pytest.raises(RunLoadError, match=r"does not exist"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunLoadError, match=r"expected a run folder, got .*not a folder"):
        load_run(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunLoadError, match=r"expected .*run.json.* is not a run folder"):
        load_run(tmp_path / "empty")
    (tmp_path / "empty" / "run.json").write_text("{not json")
    with pytest.raises(RunLoadError, match=r"run.json' is not valid JSON"):
        load_run(tmp_path / "empty")
    (tmp_path / "empty" / "run.json").write_text("[]")
    with pytest.raises(RunLoadError, match=r"must hold a JSON object, got list"):
        load_run(tmp_path / "empty")


def test_a_run_without_a_checkpoint_is_refused(trained: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text((trained / "run.json").read_text())
    with pytest.raises(RunLoadError, match=r"expected a checkpoint named by .*latest', found none"):
        load_run(run_dir)


@pytest.mark.parametrize("damaged", [".metadata", "__0_0.distcp"])
def test_a_damaged_checkpoint_is_refused_by_name(
    damaged: str, trained: Path, tmp_path: Path
) -> None:
    run_dir = _copy(trained, tmp_path / "run")
    path = run_dir / "checkpoints" / "step-0000002" / damaged
    path.write_bytes(path.read_bytes()[:64])  # a copy cut short
    with pytest.raises(RunLoadError, match=r"checkpoint .*step-0000002' could not be read \("):
        load_run(run_dir)


def test_an_absent_device_is_refused(trained: Path) -> None:
    from niels_gpt.device import DeviceUnavailableError, is_available

    if is_available("cuda"):
        pytest.skip("this machine has CUDA; the absent-device path cannot be shown here")
    with pytest.raises(DeviceUnavailableError, match=r"'cuda' was requested"):
        load_run(trained, device="cuda")


configs = st.builds(
    lambda h, d, L, f, V, T, p: ModelConfig(V=V, T=T, C=h * d, L=L, H=h, d_ff=f, dropout=p),
    h=st.integers(1, 8),
    d=st.sampled_from([2, 4, 8, 64]),
    L=st.integers(1, 12),
    f=st.integers(1, 4096),
    V=st.integers(1, 70_000),
    T=st.integers(1, 4096),
    p=st.floats(0, 0.9),
)


@given(arch=st.sampled_from(["v0", "v1"]), cfg=configs)
def test_the_model_record_reads_back_exactly(arch: str, cfg: ModelConfig) -> None:
    meta = json.loads(json.dumps(model_record(arch, cfg)))  # type: ignore[arg-type]
    assert read_model(meta) == (arch, cfg)


@given(
    arch=st.sampled_from(["v0", "v1"]),
    h=st.integers(1, 4),
    d=st.sampled_from([2, 4, 8]),
    layers=st.integers(1, 4),
    d_ff=st.one_of(st.none(), st.integers(1, 256)),
)
def test_the_legacy_rule_is_what_niels_train_built(
    arch: str, h: int, d: int, layers: int, d_ff: int | None
) -> None:
    cfg = TrainConfig(model=arch, T=8, C=h * d, L=layers, H=h, d_ff=d_ff)  # type: ignore[arg-type]
    legacy = {"config": dataclasses.replace(cfg).as_json()}
    assert read_model(legacy) == (arch, cfg.model_config())
