"""Typed decoding of JSON that crosses a process boundary (msgspec).

What a worker, a test session or an earlier run wrote is decoded straight
into ``msgspec.Struct`` types (``decode`` from bytes, ``convert`` from an
object already parsed): a wrong type, a missing field or an unknown tag is
a ``Malformed`` error whose text is one printable line (``one_line``), so a
reader that fails closed can quote it. Unknown fields are ignored, as a
newer writer may add some.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

T = TypeVar("T")


class Malformed(ValueError):
    """JSON that does not decode into the type its reader expects (one line)."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` with every unprintable character escaped (``\\n``, ``\\x1b``), cut to ``limit``."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def last_line(output: str) -> str:
    """The last line of a process's output, where a probe prints its answer ("" if none)."""
    lines = output.strip().splitlines()
    return lines[-1] if lines else ""


@overload
def decode(raw: bytes | str, kind: type[T], what: str) -> T: ...


@overload
def decode(raw: bytes | str, kind: Any, what: str) -> Any: ...  # a union of Structs


def decode(raw: bytes | str, kind: Any, what: str) -> Any:
    """``raw`` JSON as ``kind`` (a type, or a union of tagged Structs).

    Raises:
        Malformed: not JSON, or not a ``kind`` ("<what>: <msgspec's reason>").
    """
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise Malformed(one_line(f"{what}: {err}")) from None


def convert(value: Any, kind: type[T], what: str) -> T:
    """An already parsed JSON value as ``kind`` (strict: no str-to-int coercion).

    Raises:
        Malformed: ``value`` is not a ``kind``.
    """
    try:
        return msgspec.convert(value, type=kind)
    except msgspec.ValidationError as err:
        raise Malformed(one_line(f"{what}: {err}")) from None
