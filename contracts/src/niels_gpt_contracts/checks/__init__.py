"""The checks: each takes a spec and trees, and returns violations.

``gate`` runs them in order and builds the ``Result``; the other modules are
one check kind each (paths, line-scoped permissions, API, static rules,
invariant coverage, device outcomes).
"""
