"""The public face of the oracle for spec-side code (drivers under ``specs/<stage>/``).

A driver is ``calls(o: Oracle) -> None``: it draws weights and inputs with
``o.randn``/``o.randint``/``o.load_weights``, hands each call to ``o.call``
and states relations between answers with ``Oracle.equal``, ``Oracle.zero``
and ``Oracle.upper_zero``. ``Ref`` names one output of one call:
``(call, output key, slices)``.

Drivers import these names from here only, and only for type checking: the
worker hands the driver its ``Oracle`` at run time, and the module behind it
(``sandbox._oracle_kit``) is private to the checker and may move. This
module imports torch, so the checker itself never imports it (it is listed
with the sandbox-only modules in ``verdict/integrity.py``).
"""

from __future__ import annotations

from niels_gpt_contracts.sandbox._oracle_kit import Oracle, Ref

__all__ = ["Oracle", "Ref"]
