"""Attention's float64 reference agrees with main on its reference calls and sees a wrong scale."""

from __future__ import annotations

from pathlib import Path

import refkit


def test_main_agrees(tmp_path: Path) -> None:
    got, want = refkit.answers("attention", 7, tmp_path)
    assert refkit.judged("attention", got, want) == []


def test_a_wrong_scale_differs(tmp_path: Path) -> None:
    path = "packages/attention/src/niels_gpt/model/attention/__init__.py"
    edit = {path: lambda s: s.replace("scale = 1.0 / math.sqrt(D)", "scale = 1.01 / math.sqrt(D)")}
    got, want = refkit.answers("attention", 7, tmp_path, edits=edit)
    found = refkit.judged("attention", got, want)
    assert found and all(v.rule == "oracle.differs" for v in found), found
