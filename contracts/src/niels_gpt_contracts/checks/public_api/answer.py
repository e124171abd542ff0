"""What the import probe (``_api_probe.py``) answers for one API entry, as types.

The probe prints a JSON list, one object per requested entry, in order; the
checker decodes it into ``Found`` (``decoding``), so an answer of another
shape is a ``Malformed`` error, never a ``KeyError`` in a judge. Fields the
probe leaves out where they do not apply (an entry that failed to import has
only ``error`` and perhaps ``file``/``line``) default to ``None`` or empty;
the one-of pairs the probe always writes one side of (a method's ``error`` or
``signature``, an entry's ``error`` or ``kind``) are checked on decoding.

A signature stays in the form ``signatures`` compares (``Signature.data``):
``{"params": [[name, kind, default, annotation], ...], "return": ...}``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ParamKind = Literal[
    "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD"
]


class Signature(msgspec.Struct, frozen=True):
    """``inspect.signature`` normalised: each parameter ``(name, kind, default, annotation)``."""

    params: list[tuple[str, ParamKind, str | None, str | None]]
    returns: str | None = msgspec.field(name="return")

    def data(self) -> dict[str, Any]:
        """The plain form ``signatures.compare_signatures`` and ``render`` take."""
        return {"params": [list(p) for p in self.params], "return": self.returns}


class Origin(msgspec.Struct, frozen=True):
    """Where the code that runs was written (``_api_probe.code_origin``).

    ``dataclass``: the line is a ``@dataclass`` class whose fields make the
    generated ``__init__``; ``wrapped``: found behind ``__wrapped__``.
    """

    file: str
    line: int
    name: str
    wrapped: bool = False
    dataclass: bool = False


class Method(msgspec.Struct, frozen=True):
    """One pinned method: why it could not be read, or its signature and origin."""

    error: str | None = None
    signature: Signature | None = None
    where: tuple[str | None, int | None] | None = None
    source: Origin | None = None

    def __post_init__(self) -> None:
        if (self.error is None) == (self.signature is None):
            raise ValueError("expected a method's 'error' or its 'signature', not both or neither")


class Found(msgspec.Struct, frozen=True):
    """The probe's answer for one entry; ``probe_error`` and ``timed_out`` are the
    checker's own (the probe did not answer), never the probe's."""

    object: str
    error: str | None = None  # the object cannot be imported
    file: str | None = None
    line: int | None = None
    kind: str | None = None  # module, class, function, or the object's type name
    signature: Signature | None = None
    signature_error: str | None = None
    source: Origin | None = None
    methods: dict[str, Method] = {}
    fields: dict[str, str | None] = {}
    all: list[str] | None = None  # the module's __all__, when a list or tuple
    public: list[str] = []
    same: bool | None = None
    same_error: str | None = None
    probe_error: str | None = None
    timed_out: bool = False

    def __post_init__(self) -> None:
        if self.error is None and self.probe_error is None and self.kind is None:
            raise ValueError(f"expected a 'kind' or an 'error' for {self.object}")
