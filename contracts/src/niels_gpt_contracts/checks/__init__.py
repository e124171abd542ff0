"""The checks: each takes a spec and trees, and returns violations.

One check kind a module (paths, line-scoped permissions, API, static rules,
invariant coverage, device outcomes, amendments). None runs the others or
builds a ``Result``: ``verdict.static_verdict`` composes them for
``contracts check``, ``verdict.pr`` for ``contracts pr``.
"""
