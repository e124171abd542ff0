"""Oracle calls sized alike: ``o.call`` with the sizing keywords a group of calls shares.

A driver's calls of one kind (a rope table or rotation, one forward of a
quantized model, a bad input) are sized the same way for the tolerance: the
rounding stages on the way to the outputs, the longest sum, the runtime
rules, the dtype the arithmetic runs in. ``Sized(o, stages=2, reduction=2)``
holds those once; its ``call(name, fn, desc=..., axes=(...))`` is ``o.call``
with them filled in, a keyword given at the call taking precedence. What
differs between the calls (the name, the description, the relations, the
axes) stays at each call, so ``contracts check`` still reads every axis
there as a literal (``oracle.coverage``). Nothing is imported at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


class Sized:
    """``o`` with the ``o.call`` keywords (``stages``, ``reduction``, ...) its calls share."""

    def __init__(self, o: Oracle, **sizing: Any) -> None:
        self.o = o
        self.sizing = sizing

    def call(self, name: str, fn: Callable[[], Any], **given: Any) -> None:
        """``o.call(name, fn, ...)`` with the shared keywords, then ``given``'s over them."""
        self.o.call(name, fn, **{**self.sizing, **given})
