"""A downstream experiment built on the niels_gpt stage wheels.

Byte-level language modelling (V=256) on the Python standard library's own
sources, a v0/v1 ablation, and scale-out with ``torch.distributed`` (DDP and
FSDP2). The model code comes from the stage packages (``niels_gpt.model.*``);
nothing here copies it.

Console scripts: ``niels-train`` and ``niels-ablate``.
"""

__version__ = "0.1.0"
