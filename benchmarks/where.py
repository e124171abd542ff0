"""Where a bench ran, as every bench prints it: the machine line and the load-average line.

Its own module so that ``decode``, ``report`` and ``run`` all import it and
none of them imports another for it (they used to, in a cycle).
"""

from __future__ import annotations

import os

import torch

from benchmarks import experiments  # noqa: F401  (puts niels_gpt_experiments on sys.path)
from niels_gpt_experiments.machine import cpu_name


def machine(device: torch.device) -> str:
    """CPU name, core count, torch version and threads, the GPU's name on CUDA, the device."""
    threads = torch.get_num_threads()
    text = f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} ({threads} threads)"
    if device.type == "cuda":
        text += f", {torch.cuda.get_device_name(device)}"
    return f"{text}, device {device}"


def load_line(load: list[float], cores: int) -> str:
    """The load average at the start and the end of a run, with a caveat past ``cores``."""
    line = f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end"
    if max(load) > cores:
        line += f" (above the {cores} cores: other work shared the machine, figures are indicative)"
    return line
