"""The name of the CPU a run measured on, for the header of a report.

Torch-free, so a command's report can name its machine without importing torch.
The benchmarks (``benchmarks/where.py``) print the same name in their tables.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_name"]


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it, else what ``platform`` knows.

    Args:
        cpuinfo: the file to read the first ``model name`` line of; one that
            cannot be read, or has no such line, falls back to
            ``platform.processor()`` and then ``platform.machine()``.

    Returns:
        A name such as ``"AMD EPYC 7B13"`` or ``"x86_64"``; ``""`` only where
        the platform reports nothing at all.
    """
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
