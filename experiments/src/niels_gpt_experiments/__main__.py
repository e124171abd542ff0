"""``python -m niels_gpt_experiments`` is ``niels-train`` (handy under ``torchrun -m``)."""

from niels_gpt_experiments.cli import train_main

raise SystemExit(train_main())
