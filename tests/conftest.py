"""The README walks' helpers (``readme_walk``, ``readme_env``) import by their plain names,
and ``benchmarks`` (a folder of the repository, not installed) from the repository root."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
