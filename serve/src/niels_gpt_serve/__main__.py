"""``python -m niels_gpt_serve`` is ``niels-serve``."""

from niels_gpt_serve.cli import main

raise SystemExit(main())
