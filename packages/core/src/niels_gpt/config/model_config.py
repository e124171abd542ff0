"""Model configuration shared by every niels_gpt stage.

``ModelConfig`` is frozen: derive variants with ``dataclasses.replace``, which
runs the same validation as the constructor. ``V`` (vocabulary size) has no
default since backbone v1; every other field carries the v1 default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["ModelConfig"]


def _require_positive_int(name: str, value: object) -> None:
    # bool is an int subclass; ModelConfig(V=True) is a bug, not a vocabulary of one.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"ModelConfig.{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {value}")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and hyper-parameters of the GPT backbone.

    Attributes:
        V: vocabulary size; required.
        T: longest sequence the model accepts (RoPE cache and causal mask size).
        C: embedding width.
        L: number of transformer blocks.
        H: number of attention heads; ``C // H`` is the head dim ``D``.
        H_kv: keyword-only; key/value heads of grouped-query attention, each
            read by ``H // H_kv`` query heads; ``None`` (the default) means
            ``H``, multi-head attention. ``kv_heads`` gives the number.
        d_ff: hidden width of the MLP.
        dropout: dropout probability used everywhere dropout appears.
        rope_theta: RoPE frequency base.

    Raises:
        ValueError: a size that is not a positive int, ``C % H != 0``, an odd
            head dim (RoPE rotates channel pairs), an ``H_kv`` that is not
            ``None`` or a positive int dividing ``H``, ``dropout`` outside
            ``[0, 1)`` or a ``rope_theta`` that is not a finite positive number.
    """

    V: int
    T: int = 1024
    C: int = 512
    L: int = 8
    H: int = 8
    d_ff: int = 1536
    dropout: float = 0.1
    rope_theta: float = 10000.0
    H_kv: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("V", "T", "C", "L", "H", "d_ff"):
            _require_positive_int(name, getattr(self, name))
        if self.C % self.H != 0:
            raise ValueError(
                f"ModelConfig.C must be divisible by H, got C={self.C}, H={self.H} "
                f"(remainder {self.C % self.H})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"ModelConfig head dim C // H must be even for RoPE, got "
                f"C // H = {self.C} // {self.H} = {self.head_dim}"
            )
        if self.H_kv is not None and (
            isinstance(self.H_kv, bool)
            or not isinstance(self.H_kv, int)
            or self.H_kv <= 0
            or self.H % self.H_kv != 0
        ):
            raise ValueError(
                f"ModelConfig.H_kv must be None or a positive int dividing H, got "
                f"H={self.H}, H_kv={self.H_kv!r}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(
                f"ModelConfig.dropout must be a float, got {type(self.dropout).__name__} "
                f"{self.dropout!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)):
            raise ValueError(
                f"ModelConfig.rope_theta must be a float, got "
                f"{type(self.rope_theta).__name__} {self.rope_theta!r}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(
                f"ModelConfig.rope_theta must be finite and positive, got {self.rope_theta}"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads ``H_kv``: ``H`` unless ``H_kv`` is given."""
        return self.H if self.H_kv is None else self.H_kv

    @property
    def head_dim(self) -> int:
        """Per-head width ``D = C // H``."""
        return self.C // self.H
