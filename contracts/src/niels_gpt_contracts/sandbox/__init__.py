"""Run a PR's code where it cannot change the checker that judges it.

``contracts pr`` (the ``verdict`` layer) never imports the PR's code. Every
step that needs it (the API probe, the runtime-rule drivers, the test runs,
the mutants) runs here: in a separate Python environment, in a process group
of its own, from files written out of git objects, with an environment built
from an allowlist (no ``PYTEST_ADDOPTS``, no ``PYTEST_PLUGINS``, plugin
autoloading off, no user site), and a bootstrap ``sitecustomize`` that keeps
the tree under check first on the path. What comes back is data (JSON) that
the checker validates before it believes it.

Modules: ``processes`` (subprocesses, orphan reaping), ``workspace`` (trees
written to folders), ``environment`` (the interpreter, its variables, its
integrity snapshot), ``pytest_run`` (one pytest run and its per-test report),
``runtime_probe`` (runtime rules: ATen ops under a profiler).
"""
