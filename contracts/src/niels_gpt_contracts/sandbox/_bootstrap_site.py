"""sitecustomize for sandboxed runs (copied into the bootstrap folder by contracts).

Python imports the first ``sitecustomize`` on ``sys.path`` at start-up, and the
bootstrap folder is first on ``PYTHONPATH``, so this file runs in every
sandboxed interpreter, the subprocesses that tests start included. It drops
every path entry that did not come from ``PYTHONPATH`` and that provides one of
the stages' top-level names (an editable install of another checkout, say),
and editable-install finders, so that the tree under check is the only one
that can be imported. It imports nothing but ``os`` and ``sys``.
"""

import os
import sys


def _isolate() -> None:
    keep = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    names = [n for n in os.environ.get("NIELS_GPT_SANDBOX_NAMES", "").split(",") if n]

    def foreign(entry: str) -> bool:
        if not entry or entry in keep:
            return False
        return any(
            os.path.exists(os.path.join(entry, n)) or os.path.exists(os.path.join(entry, n + ".py"))
            for n in names
        )

    sys.path[:] = [p for p in sys.path if not foreign(p)]
    sys.meta_path[:] = [
        f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")
    ]


_isolate()
