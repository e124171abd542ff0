"""What a probe or a report hands back across a process boundary is decoded by type.

Each reader below declares the shape it expects (``msgspec`` structs, through
``decoding``); an answer of the wrong type, with a field missing or with
control characters in it fails closed the way the reader always did (an
empty answer, a ``ConfigError``, a problem line), and what it says is one
printable line.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.sandbox.environment import Sandbox


def _fake_python(folder: Path, stdout: str, code: int = 0) -> str:
    """An executable that prints ``stdout`` whatever it is asked, and exits ``code``."""
    path = folder / "fake-python"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {code}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- sandbox.environment: the interpreter's import path -----------------------


@pytest.mark.parametrize("answer", ['[1, "/usr"]', '{"path": []}', "not json", '"/usr"'])
def test_an_interpreter_whose_import_path_is_not_a_list_of_strings_is_refused(
    tmp_path: Path, answer: str
) -> None:
    python = _fake_python(tmp_path, answer)
    with pytest.raises(ConfigError, match="expected a working interpreter"):
        Sandbox.prepare(python, tmp_path / "sandbox", ["niels_gpt"], 1)


def test_a_real_interpreter_gives_its_import_path(tmp_path: Path) -> None:
    box = Sandbox.prepare(sys.executable, tmp_path / "sandbox", ["niels_gpt"], 1)
    assert box.site_paths() and all(isinstance(p, str) for p in box.site_paths())
