"""Typed use of two stage wheels after a third was uninstalled (PEP 561 per stage).

``nox -s test-experiments`` installs the rope, attention and fastpath wheels
alone (``--no-deps``), uninstalls rope, and runs ``mypy --strict`` on this
file: each stage's package folder carries its own ``py.typed``, so removing
one wheel leaves the others typed. (When the stages shared
``niels_gpt/model/py.typed``, uninstalling rope deleted it for all.)
"""

from __future__ import annotations

from typing import assert_type

import torch

from niels_gpt.model.attention import rotate_rows
from niels_gpt.model.fastpath import sdpa_kernel

q = torch.zeros(1, 1, 2, 2)  # (B, H, T, D)
sin = cos = torch.zeros(1, 1, 2, 1)  # (1, 1, Tc, D/2)
positions = torch.zeros(1, 2, dtype=torch.int64)  # (B, T)
assert_type(sdpa_kernel(q, q, q, 0.0, 1.0), torch.Tensor)
assert_type(rotate_rows(q, q, sin, cos, positions), tuple[torch.Tensor, torch.Tensor])
