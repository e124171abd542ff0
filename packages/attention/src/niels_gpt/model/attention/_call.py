"""What a call beyond ``forward(x)`` brings: a KV cache, positions and a key mask.

Shape notation::

    B: batch, H: query heads, H_kv: key/value heads (dividing H), D: head dim,
    T: tokens in one call, p: cache length before the call, m = p + T: the
    keys the call's queries see

Private home of what ``niels_gpt.model.attention`` exports as ``KVCache``, of
the checks of such a call (each raises ``niels_gpt.checks.InputError`` naming
the expected and the actual value, before anything is written) and of RoPE at
a call's positions, so that the attention module stays one idea.
"""

from __future__ import annotations

import torch

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError, check_like

__all__ = ["KVCache", "check_call", "rotate_at", "rotate_rows"]


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be an int >= 1, got {type(value).__name__} {value!r}")
    return value


class KVCache:
    """One attention layer's keys and values, allocated once.

    ``keys`` and ``values`` are ``(batch_size, n_head, max_len, head_dim)``,
    zero-filled in ``dtype`` on ``device``. ``len(cache)`` is the number ``p``
    of filled positions: rows ``[0, p)`` of dim 2 hold the rotated keys and the
    values of those positions. ``append`` writes into the same storage; the
    tensors are never replaced or resized.

    Raises:
        InputError: a size that is not a positive int (``bool`` included), or
            a ``dtype`` that is not a floating ``torch.dtype``.
    """

    keys: torch.Tensor
    values: torch.Tensor

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (
            _positive_int(batch_size, "batch_size"),
            _positive_int(n_head, "n_head"),
            _positive_int(max_len, "max_len"),
            _positive_int(head_dim, "head_dim"),
        )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(f"KVCache dtype must be a floating torch.dtype, got {dtype!r}")
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
        # The length is the size of a view of the filled rows, not an int attribute:
        # torch.compile treats a tensor's size as a symbolic int (one graph for every
        # length), but specialises on an int attribute (one graph per length).
        self._filled = self.keys[:, :, :0]  # (B, H, p, D) view, p = 0

    def __len__(self) -> int:
        return self._filled.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(B, H, T, D)`` keys and values at rows ``[p, p+T)``; advance to ``p + T``.

        Returns the filled rows ``[0, p+T)`` of both, ``(B, H, p+T, D)`` views.
        The caller has checked that they fit (``check_call``).
        """
        p = len(self)
        end = p + k.shape[2]
        self.keys[:, :, p:end] = k  # (B, H, T, D) into the storage
        self.values[:, :, p:end] = v  # (B, H, T, D) into the storage
        self._filled = self.keys[:, :, :end]  # (B, H, p+T, D) view
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H, p+T, D) each


def _check_cache(
    cache: object, B: int, T: int, heads: tuple[int, int], limit: int
) -> tuple[KVCache, int]:
    """The cache and its length ``p``, once it fits the call: batch, heads, room."""
    if not isinstance(cache, KVCache):
        raise InputError(f"kv_cache must be None or a KVCache, got {type(cache).__name__}")
    size, n_head, max_len, head_dim = cache.keys.shape
    p = len(cache)
    if size != B:
        raise InputError(f"x batch must be the KV cache's batch {size}, got {B}")
    if (n_head, head_dim) != heads:
        raise InputError(f"KV cache heads and head dim must be {heads}, got ({n_head}, {head_dim})")
    if p + T > min(max_len, limit):
        raise InputError(
            f"a chunk of {T} tokens after {p} cached ones needs {p + T} positions; "
            f"the KV cache holds {max_len} and cfg.T is {limit}"
        )
    return cache, p


def check_call(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: object,
    positions: object,
    key_mask: object,
    limits: tuple[int, int, int],
) -> int:
    """Check a call's cache, positions and key mask against ``x`` ``(B, T, C)``; return ``p``.

    ``limits`` is ``(H_kv, D, cfg.T)``: a cache holds the key/value heads.
    ``positions``: None or ``(B, T)`` int64 on x's device, every value in
    ``[0, cfg.T)`` (one host sync reads the range).
    ``key_mask``: None or ``(B, p + T)`` bool on x's device.
    """
    B, T, _ = x.shape
    Hk, D, limit = limits
    p = 0
    if cache is not None:
        kv, p = _check_cache(cache, B, T, (Hk, D), limit)
        check_like(kv.keys, "KV cache", weight, "attention")
    if positions is not None:
        if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64:
            got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions)
            raise InputError(f"positions must be an int64 tensor, got {got}")
        if positions.shape != (B, T) or positions.device != x.device:
            raise InputError(
                f"positions must be ({B}, {T}) on {x.device}, got {tuple(positions.shape)} "
                f"on {positions.device}"
            )
        low, high = positions.aminmax()  # () each: one pass over the positions
        lo, hi = int(low), int(high)  # the host reads both
        if lo < 0 or hi >= limit:
            raise InputError(f"positions must be in [0, {limit - 1}], got min {lo}, max {hi}")
    if key_mask is not None:
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            got = key_mask.dtype if isinstance(key_mask, torch.Tensor) else type(key_mask)
            raise InputError(f"key_mask must be a torch.bool tensor, got {got}")
        if key_mask.shape != (B, p + T) or key_mask.device != x.device:
            raise InputError(
                f"key_mask must be ({B}, {p + T}) (batch, cached + new keys) on {x.device}, "
                f"got {tuple(key_mask.shape)} on {key_mask.device}"
            )
    return p


def rotate_at(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    p: int,
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q ``(B, H, T, D)`` and k ``(B, H_kv, T, D)``, one ``rope.apply_rope`` call.

    ``sin``/``cos`` are the module's ``(1, 1, cfg.T, D/2)`` tables in q's dtype.
    Positions ``p .. p+T-1`` take the table rows from ``p`` on; per-row
    ``positions`` ``(B, T)`` go through ``rotate_rows``. ``apply_rope`` takes q
    and k of one shape, so with ``G = H // H_kv > 1`` each key head is repeated
    ``G`` times for the call and the first of each group kept (RoPE turns each
    head alike); with ``G = 1`` k goes as it is.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # (B, H, T, D)
    if positions is None:
        if p:
            sin, cos = sin[:, :, p:], cos[:, :, p:]  # (1, 1, cfg.T - p, D/2) views
        q_rot, k_rot = rope.apply_rope(q, k, sin, cos)  # (B, H, T, D) each
    else:
        q_rot, k_rot = rotate_rows(q, k, sin, cos, positions)  # (B, H, T, D) each
    if groups > 1:
        k_rot = k_rot[:, ::groups]  # (B, H_kv, T, D) strided view: one head a group
    return q_rot, k_rot


def rotate_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of ``(B, H, T, D)`` q and k at per-row ``positions`` ``(B, T)``, one rope call.

    ``sin``/``cos``: ``(1, 1, Tc, D/2)`` tables in q's dtype; every position in
    ``[0, Tc)`` (not checked here). The batch is folded into rope's position
    axis: q and k as ``(1, H, B*T, D)``, row ``b*T + i`` rotated by table row
    ``positions[b, i]``, then unfolded to ``(B, H, T, D)``.
    """
    B, H, T, D = q.shape
    rows = positions.reshape(B * T)  # (B*T,) table row of each folded position
    sin_fold = sin.index_select(2, rows)  # (1, 1, B*T, D/2)
    cos_fold = cos.index_select(2, rows)  # (1, 1, B*T, D/2)
    q_fold = q.transpose(0, 1).reshape(1, H, B * T, D)  # (1, H, B*T, D)
    k_fold = k.transpose(0, 1).reshape(1, H, B * T, D)  # (1, H, B*T, D)
    q_rot, k_rot = rope.apply_rope(q_fold, k_fold, sin_fold, cos_fold)  # (1, H, B*T, D) each
    q_out = q_rot.view(H, B, T, D).transpose(0, 1)  # (B, H, T, D)
    k_out = k_rot.view(H, B, T, D).transpose(0, 1)  # (B, H, T, D)
    return q_out, k_out
