"""Maintainers' authoring tools: what a spec says, produced from code and scaffolded.

``freeze`` reads a stage's public API from its source with griffe (no import)
and writes the ``[[api]]`` tables a spec pins; ``scaffold`` lays out a new
stage's spec, evidence and package; ``commands`` registers both on the
``contracts`` command line (``contracts spec api``, ``contracts new-stage``).
"""
