"""The checks: each takes a spec and trees, and returns violations.

Grouped by capability: ``context`` (a tree's specs, the PR, which stages a
change reaches), ``ownership`` (changed paths, line-scoped permissions,
self-loading files, module ownership), ``public_api`` (the objects and
signatures a spec pins), ``code`` (source rules on a stage's modules),
``evidence`` (invariant claims, oracle domain coverage, device reports) and
``spec_changes`` (what an amendment changes). None runs the others or builds a
``Result``: ``verdict.static_verdict`` composes them for ``contracts check``,
``verdict.pr`` for ``contracts pr``, ``verdict.amendment`` for an amendment.
"""
