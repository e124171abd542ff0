"""The README walks' helpers (``readme_walk``, ``readme_env``) import by their plain names."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
