"""ModelConfig: V required, v1 defaults, validation on construction and replace."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig

V1_DEFAULTS = {
    "T": 1024,
    "C": 512,
    "L": 8,
    "H": 8,
    "d_ff": 1536,
    "dropout": 0.1,
    "rope_theta": 10000.0,
}


@pytest.mark.invariant("core.config_validation")
def test_v_is_required() -> None:
    with pytest.raises(TypeError, match="'V'"):
        ModelConfig()  # type: ignore[call-arg]  # V is required: this must fail


@pytest.mark.invariant("core.config_validation")
def test_v1_defaults() -> None:
    cfg = ModelConfig(V=256)
    assert cfg.V == 256
    assert {k: getattr(cfg, k) for k in V1_DEFAULTS} == V1_DEFAULTS
    assert cfg.head_dim == 64


@pytest.mark.invariant("core.config_frozen")
def test_frozen_and_replace_revalidates() -> None:
    cfg = ModelConfig(V=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.V = 11  # type: ignore[misc]
    assert dataclasses.replace(cfg, dropout=0.5).dropout == 0.5
    with pytest.raises(ValueError, match="dropout"):
        dataclasses.replace(cfg, dropout=1.0)


@pytest.mark.invariant("core.config_validation")
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"V": 0}, "V"),
        ({"V": -3}, "V"),
        ({"V": True}, "V"),
        ({"V": 256.0}, "V"),
        ({"V": "256"}, "V"),
        ({"T": 0}, "T"),
        ({"C": 0}, "C"),
        ({"L": 0}, "L"),
        ({"H": 0}, "H"),
        ({"d_ff": -1}, "d_ff"),
        ({"C": 30, "H": 4}, "divisible"),
        ({"C": 12, "H": 4}, "even"),
        ({"dropout": -0.1}, "dropout"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": "0.1"}, "dropout"),
        ({"rope_theta": 0.0}, "rope_theta"),
        ({"rope_theta": float("inf")}, "rope_theta"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"H_kv": 0}, "H_kv"),
        ({"H_kv": 3}, "H_kv"),
        ({"H_kv": 16}, "H_kv"),
        ({"H_kv": True}, "H_kv"),
        ({"H_kv": 2.0}, "H_kv"),
    ],
)
def test_invalid_values_raise_naming_the_field(overrides: dict[str, object], field: str) -> None:
    kwargs: dict[str, object] = {"V": 256, **overrides}
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.invariant("core.config_validation")
@given(
    V=st.integers(1, 100_000),
    T=st.integers(1, 4096),
    H=st.integers(1, 16),
    half_d=st.integers(1, 64),
    d_ff=st.integers(1, 4096),
    dropout=st.floats(0.0, 1.0, exclude_max=True),
)
def test_valid_configs_are_accepted(
    V: int, T: int, H: int, half_d: int, d_ff: int, dropout: float
) -> None:
    cfg = ModelConfig(V=V, T=T, C=H * 2 * half_d, H=H, d_ff=d_ff, dropout=dropout)
    assert cfg.head_dim == 2 * half_d
    assert cfg.C % cfg.H == 0


@pytest.mark.invariant("core.config_validation")
def test_h_kv_is_keyword_only_and_defaults_to_h() -> None:
    cfg = ModelConfig(V=256)
    assert cfg.H_kv is None and cfg.kv_heads == cfg.H == 8
    assert [ModelConfig(V=256, H_kv=h).kv_heads for h in (8, 4, 2, 1)] == [8, 4, 2, 1]
    with pytest.raises(
        ValueError, match=r"H_kv must be None or a positive int dividing H, got H=8, H_kv=3"
    ):
        ModelConfig(V=256, H_kv=3)
    with pytest.raises(ValueError, match="H_kv"):  # replace re-validates against the new H
        dataclasses.replace(ModelConfig(V=256, H_kv=8), H=4)
    with pytest.raises(TypeError):
        ModelConfig(256, 1024, 512, 8, 8, 1536, 0.1, 10000.0, 2)  # type: ignore[misc]
